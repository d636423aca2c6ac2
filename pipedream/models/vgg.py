"""VGG-16 (Simonyan & Zisserman 2015) from torchvision's layer definitions.

``full``: torchvision's ``vgg16`` (configuration "D"), 224x224x3 input, 1000 classes.
``reduced``: the same 13 conv + 5 max-pool + 3 linear structure with channels divided by 4, a 1x1
adaptive pool and a 256-wide classifier, on 32x32x3 input with 10 classes (Fashion-MNIST padded to
32x32 and repeated over 3 channels).
"""

from __future__ import annotations

from torch import nn

from pipedream.models import disable_inplace, image_spec, register

REDUCED_WIDTH_DIVISOR = 4
REDUCED_HIDDEN = 256
REDUCED_CLASSES = 10


def build_vgg16(preset: str) -> nn.Sequential:
    """VGG-16 flattened into one ``nn.Sequential``: features, pool, flatten, classifier layers."""
    from torchvision.models import vgg as tv_vgg  # lazy: importing torchvision takes seconds (pipedream.models)

    if preset == "full":
        m = tv_vgg.vgg16(weights=None)
        return nn.Sequential(*m.features, m.avgpool, nn.Flatten(1), *m.classifier)
    cfg = [v if v == "M" else v // REDUCED_WIDTH_DIVISOR for v in tv_vgg.cfgs["D"]]
    features = tv_vgg.make_layers(cfg, batch_norm=False)
    last = cfg[-2]
    classifier = [
        nn.Linear(last, REDUCED_HIDDEN), nn.ReLU(True), nn.Dropout(0.5),
        nn.Linear(REDUCED_HIDDEN, REDUCED_HIDDEN), nn.ReLU(True), nn.Dropout(0.5),
        nn.Linear(REDUCED_HIDDEN, REDUCED_CLASSES),
    ]
    layers = [*features, nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(1), *classifier]
    # torchvision's initialisation for the convolutions; the narrow classifier keeps PyTorch's default Linear
    # init: torchvision's N(0, 0.01), meant for 4096-wide layers, makes a 256-wide classifier's output vanish
    for layer in layers:
        if isinstance(layer, nn.Conv2d):
            nn.init.kaiming_normal_(layer.weight, mode="fan_out", nonlinearity="relu")
            nn.init.zeros_(layer.bias)
    disable_inplace(layers)
    return nn.Sequential(*layers)


register(image_spec("vgg16", build_vgg16, 32))
