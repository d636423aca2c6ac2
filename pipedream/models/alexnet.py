"""AlexNet (Krizhevsky et al. 2012) in torchvision's single-tower form, flattened for pipelining.

Paper §5.1: ImageNet (synthetic data in Table 1), 256 images per GPU. The sequence is torchvision's
``features`` (5 conv, 3 max-pool), ``avgpool`` (6x6), flatten and ``classifier`` (dropout, 3 linear):
22 layers, the chain of the released profile (which adds a size and a view node).

``full``: torchvision's ``alexnet`` (224x224x3 input, 1000 classes), 61.1 M parameters.
``reduced``: the same layers with conv channels divided by 4 (16-48-96-64-64), a 512-wide classifier
and 10 classes on 64x64x3 input (Fashion-MNIST padded to 32 and upsampled x2: the 11x11 stride-4 stem
and three 3x3 stride-2 pools need at least 63 pixels to leave a 1x1 map), 1.6 M parameters.
"""

from __future__ import annotations

from torch import nn

from pipedream.models import disable_inplace, image_spec, register

REDUCED_SIZE = 64
REDUCED_WIDTH_DIVISOR = 4
REDUCED_HIDDEN = 512
REDUCED_CLASSES = 10


def build_alexnet(preset: str) -> nn.Sequential:
    """AlexNet as a flat ``nn.Sequential``: features, avgpool, flatten, classifier layers."""
    if preset == "full":
        from torchvision.models.alexnet import alexnet as tv_alexnet  # lazy: importing torchvision takes seconds

        m = tv_alexnet(weights=None)
        layers = [*m.features, m.avgpool, nn.Flatten(1), *m.classifier]
    else:
        c = [w // REDUCED_WIDTH_DIVISOR for w in (64, 192, 384, 256, 256)]
        layers = [
            nn.Conv2d(3, c[0], kernel_size=11, stride=4, padding=2), nn.ReLU(), nn.MaxPool2d(3, 2),
            nn.Conv2d(c[0], c[1], kernel_size=5, padding=2), nn.ReLU(), nn.MaxPool2d(3, 2),
            nn.Conv2d(c[1], c[2], kernel_size=3, padding=1), nn.ReLU(),
            nn.Conv2d(c[2], c[3], kernel_size=3, padding=1), nn.ReLU(),
            nn.Conv2d(c[3], c[4], kernel_size=3, padding=1), nn.ReLU(), nn.MaxPool2d(3, 2),
            nn.AdaptiveAvgPool2d((6, 6)), nn.Flatten(1),
            nn.Dropout(0.5), nn.Linear(c[4] * 36, REDUCED_HIDDEN), nn.ReLU(),
            nn.Dropout(0.5), nn.Linear(REDUCED_HIDDEN, REDUCED_HIDDEN), nn.ReLU(),
            nn.Linear(REDUCED_HIDDEN, REDUCED_CLASSES),
        ]
    disable_inplace(layers)
    return nn.Sequential(*layers)


register(image_spec("alexnet", build_alexnet, REDUCED_SIZE))
