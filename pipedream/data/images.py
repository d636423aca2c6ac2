"""Image classification data for VGG-16, ResNet-50 and AlexNet (paper §5.1: ImageNet, top-1 accuracy).

``reduced``: Fashion-MNIST (:mod:`pipedream.data.fashion_mnist`), 10 classes; a sample is a
``(28, 28)`` uint8 image and its class id; collating pads to 32x32, repeats to 3 channels and
normalises (``(B, 3, 32, 32)`` float32), and for models with a larger reduced input (AlexNet) resizes
bilinearly to ``size`` x ``size``.
``full``: ImageNet as a torchvision ``ImageFolder`` tree (``<root>/train/<class>/*.JPEG``,
``<root>/val/<class>/*.JPEG``), 224x224 crops with the usual ResNet augmentation. The root is the
``root`` argument or ``$PIPEDREAM_IMAGENET``; nothing is downloaded.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pipedream.data.base import Rows, Sample, SampleSet, stack_samples, subset_indices
from pipedream.data.synthetic import SyntheticSpec, image_spec
from pipedream.errors import PipeDreamError

IMAGENET_ENV = "PIPEDREAM_IMAGENET"
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGENET_CLASSES = 1000
IMAGENET_SIZES = (1_281_167, 50_000)  # ILSVRC-2012 train and val images


def _aligned(images: torch.Tensor, labels: torch.Tensor, i: int) -> Sample:
    """``(images[i], labels[i])`` of two aligned tensors (no copies)."""
    return images[i], labels[i]


def _fmnist_collate(size: int):
    from pipedream.data.fashion_mnist import to_input

    def collate(samples: list[Sample]) -> tuple[torch.Tensor, torch.Tensor]:
        x = to_input(torch.stack([s[0] for s in samples]))  # (B, 3, 32, 32)
        if size != x.shape[-1]:
            x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
        return x, torch.stack([s[1] for s in samples])

    return collate


def fashion_mnist_datasets(size: int, train_subset: int | None, val_subset: int | None, seed: int,
                           root: Path | None = None) -> tuple[SampleSet, SampleSet]:
    """Fashion-MNIST train and test splits as ``(B, 3, size, size)`` model input (``size`` >= 32).

    Raises:
        PipeDreamError: the Debian package ``dataset-fashion-mnist`` is not installed (from the loader).
    """
    from pipedream.data import fashion_mnist

    if size < 32:
        raise PipeDreamError(f"Fashion-MNIST input size must be at least 32 (padded 28x28), got {size}")
    train, val = fashion_mnist.load(root, train_subset, val_subset, seed)
    collate = _fmnist_collate(size)
    info = {"source": str(root or fashion_mnist.default_root()), "classes": fashion_mnist.NUM_CLASSES}
    return tuple(SampleSet(Rows(functools.partial(_aligned, s.images, s.labels), range(len(s))), collate, dict(info),
                           _stack_targets) for s in (train, val))  # type: ignore[return-value]


def _stack_targets(samples: list[Sample]) -> torch.Tensor:
    """The labels alone (no image conversion or resize: 2.3 ms a minibatch of 32 at 64x64 on one core)."""
    return torch.stack([s[1] for s in samples])


def _folder_item(folder: Any, row: int) -> Sample:
    image, label = folder[row]
    return image, torch.tensor(label)


def imagenet_datasets(root: Path | None, train_subset: int | None, val_subset: int | None,
                      seed: int) -> tuple[SampleSet, SampleSet]:
    """ImageNet from an ``ImageFolder`` tree: ``(B, 3, 224, 224)`` normalised crops, 1000 classes.

    Raises:
        PipeDreamError: no root given and ``$PIPEDREAM_IMAGENET`` unset, or a split folder missing.
    """
    from torchvision import datasets, transforms

    if root is None:
        if IMAGENET_ENV not in os.environ:
            raise PipeDreamError(f"full-size image models need ImageNet: set ${IMAGENET_ENV} to a folder with "
                                 "train/ and val/ ImageFolder trees (nothing is downloaded)")
        root = Path(os.environ[IMAGENET_ENV])
    norm = transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)
    tf = {"train": transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                                       transforms.ToTensor(), norm]),
          "val": transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(), norm])}
    out = []
    for split, size, s in (("train", train_subset, seed), ("val", val_subset, seed + 1)):
        path = Path(root) / split
        if not path.is_dir():
            raise PipeDreamError(f"ImageNet split folder {path} not found (expected {root}/train and {root}/val)")
        folder = datasets.ImageFolder(str(path), transform=tf[split])
        out.append(SampleSet(Rows(functools.partial(_folder_item, folder), subset_indices(len(folder), size, s)), stack_samples,
                             {"source": str(path), "classes": len(folder.classes)}))
    return out[0], out[1]


def image_datasets(reduced_size: int):
    """The ``make_datasets`` hook of an image model whose reduced input is ``reduced_size`` pixels."""

    def make(preset: str, train_subset: int | None, val_subset: int | None, seed: int) -> tuple[SampleSet, SampleSet]:
        if preset == "full":
            return imagenet_datasets(None, train_subset, val_subset, seed)
        return fashion_mnist_datasets(reduced_size, train_subset, val_subset, seed)

    return make


def fmnist_synthetic(size: int) -> SyntheticSpec:
    """Synthetic stand-in for Fashion-MNIST model input: ``(3, size, size)`` images, 10 classes, 60k/10k."""
    from pipedream.data.fashion_mnist import NUM_CLASSES

    return image_spec((3, size, size), NUM_CLASSES, 60_000, 10_000)


def image_synthetic(reduced_size: int):
    """The ``synthetic`` hook of an image model: ImageNet's shapes and sizes (``full``: ``(3, 224, 224)``,
    1000 classes, 1,281,167 + 50,000 images) or Fashion-MNIST's at the reduced input size."""

    def make(preset: str) -> SyntheticSpec:
        if preset == "full":
            return image_spec((3, 224, 224), IMAGENET_CLASSES, *IMAGENET_SIZES)
        return fmnist_synthetic(reduced_size)

    return make


@torch.no_grad()
def top1_accuracy(model: nn.Module, val: SampleSet, batch_size: int = 256) -> float:
    """Top-1 accuracy in percent of ``model`` (eval mode) over every sample of ``val``."""
    was = model.training
    model.eval()
    correct = 0
    for start in range(0, len(val), batch_size):
        x, y = val.batch(range(start, min(start + batch_size, len(val))))
        correct += int((model(x).argmax(1) == y).sum())
    model.train(was)
    return 100.0 * correct / len(val)
