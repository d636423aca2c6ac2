"""Synthetic data: random samples of a model's real input and target shapes, for timing without data sets.

``pipedream train --data synthetic`` (TrainConfig ``data``) trains on these instead of ImageNet, WMT16,
PTB or MSVD, so epoch times and speedups can be measured at paper scale by anyone; the accuracy of such
a run means nothing (the paper trains AlexNet this way). A model describes its samples with a
:class:`SyntheticSpec` (``ModelSpec.synthetic``): how to draw one ``(input, target)`` from a random
generator, already in the model's input format, so a minibatch is a plain stack.

Sample ``i`` of a split is drawn from a generator seeded by ``(seed, split, i)`` when it is asked for,
and nothing is kept: a set of any size costs no memory, and the same index always gives the same sample
on every rank and in every run. Large float inputs (images, frame features) are not drawn value by
value, which would cost more CPU per minibatch than a GPU spends training on it: they are windows of
one standard-normal buffer per split (made once from the seed, the size of one sample plus
:data:`NOISE_SHIFTS`) at an offset the sample's generator picks, so a minibatch costs one copy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from pipedream.data.base import Sample, SampleSet, stack_samples
from pipedream.errors import PipeDreamError

SPLITS = {"train": 0, "val": 1}
NOISE_SHIFTS = 1 << 16  # distinct offsets of a float input's window into its noise buffer
_MASK = (1 << 63) - 1
Noise = Callable[[tuple[int, ...], torch.Generator], torch.Tensor]


@dataclass(frozen=True)
class SyntheticSpec:
    """The synthetic samples of one model at one preset.

    Attributes:
        sample: ``sample(generator, noise) -> (input, target)``, tensors in the model's input format (what
            the real data's collate function makes of one sample), so that stacking gives a minibatch;
            ``noise(shape, generator)`` gives standard-normal floats of ``shape`` cheaply (see above).
        train_size, val_size: samples per split when no subset size is given (the real data set's, so
            an epoch takes as long as a real one).
        info: facts shown in logs, e.g. ``{"classes": 1000}``.
    """

    sample: Callable[[torch.Generator, Noise], Sample]
    train_size: int
    val_size: int
    info: dict[str, object]


def sample_seed(seed: int, split: str, index: int) -> int:
    """The generator seed of sample ``index`` of ``split``: a 63-bit mix of the three (splitmix64 steps)."""
    z = (seed * 0x9E3779B97F4A7C15 + SPLITS[split] * 0xD1B54A32D192ED03 + index + 1) & ((1 << 64) - 1)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & ((1 << 64) - 1)
    return (z ^ (z >> 31)) & _MASK


class SyntheticSamples(Sequence[Sample]):
    """``size`` samples drawn on demand: ``self[i]`` is ``sample(generator seeded by (seed, split, i))``."""

    def __init__(self, spec: SyntheticSpec, size: int, seed: int, split: str) -> None:
        self.spec, self.size, self.seed, self.split = spec, size, seed, split
        self._buffers: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> Sample:  # type: ignore[override]
        i = int(i)
        if not 0 <= i < self.size:
            raise IndexError(f"sample {i} of a synthetic {self.split} set of {self.size}")
        return self.spec.sample(torch.Generator().manual_seed(sample_seed(self.seed, self.split, i)), self.noise)

    def noise(self, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
        """Standard-normal floats of ``shape``: a window of this split's buffer at an offset drawn from ``g``."""
        n = math.prod(shape)
        if n not in self._buffers:
            buffer_g = torch.Generator().manual_seed(sample_seed(self.seed, self.split, -1 - n))
            self._buffers[n] = torch.randn(n + NOISE_SHIFTS, generator=buffer_g)
        start = int(torch.randint(0, NOISE_SHIFTS, (), generator=g))
        return self._buffers[n][start:start + n].view(shape)


def synthetic_datasets(spec: SyntheticSpec, train_subset: int | None, val_subset: int | None,
                       seed: int) -> tuple[SampleSet, SampleSet]:
    """Train and validation :class:`SampleSet` s of ``spec``'s samples, sized by the subsets (None: the
    spec's sizes).

    Raises:
        PipeDreamError: a subset size below 1.
    """
    out = []
    for split, size, default in (("train", train_subset, spec.train_size), ("val", val_subset, spec.val_size)):
        if size is not None and size < 1:
            raise PipeDreamError(f"synthetic {split} set size must be positive, got {size}")
        n = default if size is None else size
        out.append(SampleSet(SyntheticSamples(spec, n, seed, split), stack_samples, {"source": "synthetic", **spec.info}))
    return out[0], out[1]


def image_spec(shape: Sequence[int], classes: int, train_size: int, val_size: int) -> SyntheticSpec:
    """Standard-normal images of ``shape`` (already "normalised") with uniform class ids in ``[0, classes)``."""
    shape = tuple(shape)

    def sample(g: torch.Generator, noise: Noise) -> Sample:
        return noise(shape, g), torch.randint(0, classes, (), generator=g)

    return SyntheticSpec(sample, train_size, val_size, {"classes": classes, "shape": list(shape)})


def sequence_spec(vocab: int, length: int, train_size: int, val_size: int, low: int = 0) -> SyntheticSpec:
    """Language-model windows: ``length + 1`` ids in ``[low, vocab)``; input the first ``length``, target
    the last ``length`` (next-token prediction)."""

    def sample(g: torch.Generator, noise: Noise) -> Sample:
        ids = torch.randint(low, vocab, (length + 1,), generator=g)
        return ids[:-1], ids[1:]

    return SyntheticSpec(sample, train_size, val_size, {"vocab": vocab, "length": length})


def require_spec(model: str, make: Callable[[str], SyntheticSpec] | None, preset: str) -> SyntheticSpec:
    """``make(preset)``, or a PipeDreamError saying the model has no synthetic data."""
    if make is None:
        raise PipeDreamError(f"model {model!r} has no synthetic data (ModelSpec.synthetic); train it with --data real")
    return make(preset)
