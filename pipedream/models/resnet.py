"""ResNet-50 (He et al. 2016) from torchvision's ``Bottleneck`` blocks, flattened for pipelining.

Paper §5.1: ImageNet, 128 images per GPU, 75.9% top-1 target. Layer structure of the sequence:
``conv1, bn1, relu, maxpool``, then the 3 + 4 + 6 + 3 = 16 Bottleneck blocks, each ONE layer (its skip
connection, and the strided 1x1 projection of the first block of a stage, stay inside it), then
``avgpool, flatten, fc``: 23 layers. A stage boundary therefore never cuts a residual branch.

``full``: torchvision's ``resnet50`` itself (widths 64-128-256-512, x4 expansion, 1000 classes,
224x224x3 input), 25.6 M parameters.
``reduced``: the same blocks with every width divided by 4 (stem 16 channels, bottleneck widths
16-32-64-128, output 512), 10 classes, 32x32x3 input (Fashion-MNIST padded), 1.5 M parameters.
"""

from __future__ import annotations

from torch import nn

from pipedream.models import disable_inplace, image_spec, register

STAGE_BLOCKS = (3, 4, 6, 3)  # ResNet-50
REDUCED_WIDTH_DIVISOR = 4
REDUCED_CLASSES = 10


def _blocks(inplanes: int, planes: int, blocks: int, stride: int) -> tuple[list[nn.Module], int]:
    """One ResNet stage as torchvision builds it: a projecting first block, then identity blocks."""
    from torchvision.models import resnet as tv  # lazy: importing torchvision takes seconds (pipedream.models)

    out = planes * tv.Bottleneck.expansion
    down = None
    if stride != 1 or inplanes != out:
        down = nn.Sequential(tv.conv1x1(inplanes, out, stride), nn.BatchNorm2d(out))
    layers: list[nn.Module] = [tv.Bottleneck(inplanes, planes, stride, down)]
    layers += [tv.Bottleneck(out, planes) for _ in range(blocks - 1)]
    return layers, out


def build_resnet50(preset: str) -> nn.Sequential:
    """ResNet-50 as a flat ``nn.Sequential`` of 23 layers (Bottleneck blocks kept whole)."""
    if preset == "full":
        from torchvision.models import resnet as tv

        m = tv.resnet50(weights=None)
        blocks = [b for stage in (m.layer1, m.layer2, m.layer3, m.layer4) for b in stage]
        layers = [m.conv1, m.bn1, m.relu, m.maxpool, *blocks, m.avgpool, nn.Flatten(1), m.fc]
    else:
        width = 64 // REDUCED_WIDTH_DIVISOR
        layers = [nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False), nn.BatchNorm2d(width),
                  nn.ReLU(), nn.MaxPool2d(kernel_size=3, stride=2, padding=1)]
        inplanes = width
        for k, n in enumerate(STAGE_BLOCKS):
            stage, inplanes = _blocks(inplanes, width * 2**k, n, 1 if k == 0 else 2)
            layers += stage
        layers += [nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(1), nn.Linear(inplanes, REDUCED_CLASSES)]
        for mod in nn.Sequential(*layers).modules():  # torchvision's ResNet initialisation
            if isinstance(mod, nn.Conv2d):
                nn.init.kaiming_normal_(mod.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(mod, nn.BatchNorm2d):
                nn.init.ones_(mod.weight)
                nn.init.zeros_(mod.bias)
    disable_inplace(layers)
    return nn.Sequential(*layers)


register(image_spec("resnet50", build_resnet50, 32))
