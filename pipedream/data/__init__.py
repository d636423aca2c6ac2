"""Data sets: reduced-size real stand-ins (Fashion-MNIST for ImageNet, ...)."""
