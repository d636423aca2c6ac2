"""Fashion-MNIST (Xiao et al. 2017): the reduced-size stand-in for ImageNet.

The Debian package ``dataset-fashion-mnist`` installs the four original IDX files under
``/usr/share/datasets/fashion-mnist``. Images are kept as ``uint8`` ``(N, 28, 28)`` in memory
(47 MB for the whole training set) and turned into model input batch by batch by :func:`to_input`:
padded 28 -> 32 with zeros, repeated to 3 channels and normalised, giving ``(B, 3, 32, 32)`` float32,
the input of the reduced VGG-16.
"""

from __future__ import annotations

import gzip
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from pipedream.data.base import epoch_order, subset_indices
from pipedream.data.cache import derived
from pipedream.errors import PipeDreamError

DEFAULT_ROOT = Path("/usr/share/datasets/fashion-mnist")
ROOT_ENV = "PIPEDREAM_FASHION_MNIST"
FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "val": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
MEAN = 0.2860  # training-set pixel mean of Fashion-MNIST, in [0, 1] units
STD = 0.3530
PAD = 2  # 28 + 2 * 2 = 32
NUM_CLASSES = 10
_IDX_DTYPES = {0x08: np.uint8}


@dataclass
class Split:
    """One split in memory.

    Attributes:
        images: ``(N, 28, 28)`` uint8 pixels.
        labels: ``(N,)`` int64 class ids in ``[0, 10)``.
    """

    images: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def default_root() -> Path:
    """``$PIPEDREAM_FASHION_MNIST`` if set, else the Debian package's folder."""
    return Path(os.environ.get(ROOT_ENV, DEFAULT_ROOT))


def read_idx(path: Path) -> np.ndarray:
    """Read a gzip-compressed IDX file (the MNIST format) into a numpy array (decompressed once per file and kept
    in :mod:`pipedream.data.cache`).

    Raises:
        PipeDreamError: the file is missing or not a valid unsigned-byte IDX file.
    """
    data = derived(path, "idx1", lambda: _gunzip(path))
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
        raise PipeDreamError(f"{path} is not an unsigned-byte IDX file (bad magic number)")
    ndim = data[3]
    dims = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    body = np.frombuffer(data, dtype=_IDX_DTYPES[data[2]], offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        raise PipeDreamError(f"{path}: header says {dims} but holds {body.size} values")
    return body.reshape(dims)


def _gunzip(path: Path) -> bytes:
    """The decompressed bytes of ``path`` (cached by :func:`read_idx`, :mod:`pipedream.data.cache`)."""
    try:
        with gzip.open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise PipeDreamError(f"Fashion-MNIST file {path} not found; install it with `apt-get install dataset-fashion-mnist` "
                             f"(or `make data`), or point ${ROOT_ENV} / --data-dir at a folder with the IDX .gz files") from None
    except (OSError, EOFError) as e:
        raise PipeDreamError(f"{path} is not a readable gzip file ({e}); reinstall dataset-fashion-mnist") from None


def load_split(name: str, root: Path | None = None, subset: int | None = None, seed: int = 0) -> Split:
    """Load split ``"train"`` or ``"val"`` (the t10k files), optionally a seeded random subset.

    Raises:
        PipeDreamError: unknown split, missing files (naming the Debian package), malformed files.
    """
    if name not in FILES:
        raise PipeDreamError(f"unknown Fashion-MNIST split {name!r}; use 'train' or 'val'")
    root = Path(root) if root is not None else default_root()
    img_file, lbl_file = FILES[name]
    images = read_idx(root / img_file)
    labels = read_idx(root / lbl_file)
    if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
        raise PipeDreamError(f"{root}: {name} images {images.shape} do not match labels {labels.shape}")
    idx = subset_indices(len(labels), subset, seed)  # a copy: the IDX buffer is read-only
    return Split(torch.from_numpy(images[idx]), torch.from_numpy(labels[idx].astype(np.int64)))


def load(root: Path | None = None, train_subset: int | None = None, val_subset: int | None = None,
         seed: int = 0) -> tuple[Split, Split]:
    """Training and validation splits; subsets are drawn with ``seed`` (the same on every rank)."""
    return (load_split("train", root, train_subset, seed),
            load_split("val", root, val_subset, seed + 1))


def to_input(images: torch.Tensor) -> torch.Tensor:
    """``(B, 28, 28)`` uint8 -> ``(B, 3, 32, 32)`` float32: zero-pad to 32, 3 channels, normalise."""
    x = images.to(torch.float32).div_(255.0)
    x = F.pad(x, (PAD, PAD, PAD, PAD))
    x = x.sub_(MEAN).div_(STD)
    return x.unsqueeze(1).expand(-1, 3, -1, -1).contiguous()


def minibatch_indices(num_samples: int, batch_size: int, seed: int, epoch: int) -> torch.Tensor:
    """Sample indices of every full minibatch of ``epoch``, ``(minibatches, batch_size)`` int64: row ``i`` is
    minibatch ``i`` (the last partial one is dropped).

    Every rank computes the same rows, so the first stage can read inputs and the last stage labels
    of minibatch ``i`` without sending labels through the pipeline. One view of the epoch's permutation, not a
    tensor per minibatch: a synthetic ImageNet epoch has 10^5 minibatches, of which a short run uses a few.
    """
    n = num_samples // batch_size
    return epoch_order(num_samples, seed, epoch)[:n * batch_size].view(n, batch_size)


class FashionMNISTSet:
    """A split as a data set with ``batch(indices) -> (input (B, 3, 32, 32) float32, labels (B,) int64)``.

    The same interface as :class:`pipedream.data.base.SampleSet`, without per-sample Python objects.
    """

    def __init__(self, split: Split) -> None:
        self.split = split

    def __len__(self) -> int:
        return len(self.split)

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.as_tensor(indices, dtype=torch.long)
        return to_input(self.split.images[idx]), self.split.labels[idx]

    def targets(self, indices: torch.Tensor) -> torch.Tensor:
        """The labels of ``indices`` alone (``batch(indices)[1]`` without converting the images)."""
        return self.split.labels[torch.as_tensor(indices, dtype=torch.long)]


def datasets(root: Path | None = None, train_subset: int | None = None, val_subset: int | None = None,
             seed: int = 0) -> tuple[FashionMNISTSet, FashionMNISTSet]:
    """Training and validation sets for the runtime (see :func:`load`)."""
    train, val = load(root, train_subset, val_subset, seed)
    return FashionMNISTSet(train), FashionMNISTSet(val)
