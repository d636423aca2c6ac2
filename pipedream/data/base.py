"""What every model's data hook returns: (input, target) samples, a collate function, resumable order.

A model's ``make_datasets(preset, train_subset, val_subset, seed)`` (see
:class:`pipedream.models.ModelSpec`) returns two :class:`SampleSet` objects. Sample ``i`` of a set is
an ``(input, target)`` pair; ``collate`` turns a list of samples into ONE input tensor and ONE target
tensor for the whole minibatch. The registry's models take one input tensor (GNMT: source and
target tokens, S2VT: frames and caption, packed into one integer tensor that their first layer
unpacks); a user's model may take a tuple or a dict of tensors (:func:`stack_tree` collates them, the
model is called with them as positional or keyword arguments: :func:`pipedream.capture.call_model`).

Order and resumption: the sample order of an epoch is a permutation fixed by ``(seed, epoch)``
(:func:`epoch_order`), the same on every rank, so a run is resumed by saving the position
``(epoch, next_minibatch)`` — two integers, e.g. in the checkpoint beside the weights — and calling
:func:`minibatches` with ``start=next_minibatch``. Nothing else (no iterator state) is needed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pipedream.errors import PipeDreamError

Sample = tuple[Any, Any]
Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass
class SampleSet:
    """A map-style data set of ``(input, target)`` samples with its collate function.

    Attributes:
        samples: indexable samples; ``samples[i]`` is one ``(input, target)`` pair.
        collate: list of samples -> ``(input batch, target batch)`` tensors.
        info: free-form facts shown in logs (vocabulary sizes, source paths, ...).
        collate_targets: list of samples -> the target batch alone, where that is cheaper than
            :attr:`collate` (a pipeline's last stage needs only the targets); None: ``collate(...)[1]``.
    """

    samples: Sequence[Sample]
    collate: Callable[[list[Sample]], Batch]
    info: dict[str, Any]
    collate_targets: Callable[[list[Sample]], torch.Tensor] | None = None

    @classmethod
    def from_tensors(cls, inputs: torch.Tensor, targets: torch.Tensor, info: dict[str, Any] | None = None) -> SampleSet:
        """Samples ``(inputs[i], targets[i])``, collated by stacking (e.g. a user model's data, docs/your-own-model.md).

        Raises:
            PipeDreamError: the two tensors hold different numbers of samples.
        """
        if len(inputs) != len(targets):
            raise PipeDreamError(f"{len(inputs)} inputs but {len(targets)} targets")
        return cls(list(zip(inputs, targets, strict=True)), stack_samples, dict(info or {}))

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> Sample:
        return self.samples[i]

    def batch(self, indices: Sequence[int] | torch.Tensor) -> Batch:
        """The collated minibatch of the samples at ``indices``."""
        return self.collate([self.samples[int(i)] for i in indices])

    def targets(self, indices: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """The target batch of the samples at ``indices`` (``batch(indices)[1]``, cheaper where it can be)."""
        if self.collate_targets is None:
            return self.batch(indices)[1]
        return self.collate_targets([self.samples[int(i)] for i in indices])


def stack_samples(samples: list[Sample]) -> Batch:
    """``(input batch, target batch)`` of ``samples``, each collated by :func:`stack_tree`."""
    return stack_tree([x for x, _ in samples]), stack_tree([y for _, y in samples])


def stack_tree(items: list[Any]) -> Any:
    """One batch of ``items`` (samples' inputs or targets): tensors stacked; tuples, lists and dicts of tensors
    stacked entry by entry (a tuple of batches, a dict of batches); numbers into a tensor."""
    first = items[0]
    if isinstance(first, torch.Tensor):
        return torch.stack(items)
    if isinstance(first, dict):
        return {k: stack_tree([i[k] for i in items]) for k in first}
    if isinstance(first, tuple | list):
        return tuple(stack_tree(list(column)) for column in zip(*items, strict=True))
    return torch.tensor(items)


def as_sample_set(data: Any, what: str = "data") -> Any:
    """``data`` as a set the runtime reads (``len()`` and ``batch(indices)``): a :class:`SampleSet` (or anything
    with ``batch``) as it is; any other sequence of ``(input, target)`` samples (a list, a map-style
    ``torch.utils.data.Dataset``) collated by :func:`stack_tree`; inputs may be tensors, tuples or dicts of them.

    Raises:
        PipeDreamError: ``data`` is neither.
    """
    if hasattr(data, "batch") and hasattr(data, "__len__"):
        return data
    if hasattr(data, "__getitem__") and hasattr(data, "__len__"):
        return SampleSet(data, stack_samples, {})
    raise PipeDreamError(f"the {what} set is a {type(data).__name__}; return a SampleSet or a sequence of "
                         "(input, target) samples")


class Rows(Sequence[Sample]):
    """Samples ``get(rows[i])``, made when asked for: the rows ``rows`` of a data source (picklable when ``get``
    is, e.g. a ``functools.partial`` of a module-level function)."""

    def __init__(self, get: Callable[[int], Sample], rows: Sequence[int]) -> None:
        self.get, self.rows = get, rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> Sample:  # type: ignore[override]
        return self.get(self.rows[i])


class Subset:
    """Samples ``rows`` of a set (anything with ``batch(indices)``, and optionally ``targets(indices)``)."""

    def __init__(self, data: Any, rows: list[int]) -> None:
        self.data, self.rows = data, rows
        if hasattr(data, "targets"):
            self.targets = lambda indices: data.targets([rows[int(i)] for i in indices])

    def __len__(self) -> int:
        return len(self.rows)

    def batch(self, indices: Sequence[int] | torch.Tensor) -> Batch:
        """The collated minibatch of the subset's samples at ``indices``."""
        return self.data.batch([self.rows[int(i)] for i in indices])


def limit(data: Any, size: int | None, seed: int) -> Any:
    """A seeded random subset of ``size`` samples of ``data`` (:func:`subset_indices`); ``data`` itself when it
    holds no more than that (a data hook that drew the subset already) or ``size`` is None."""
    if size is None or len(data) <= size:
        return data
    return Subset(data, subset_indices(len(data), size, seed))


def epoch_order(num_samples: int, seed: int, epoch: int) -> torch.Tensor:
    """Sample order of ``epoch``: a permutation of ``range(num_samples)`` fixed by ``(seed, epoch)``."""
    g = torch.Generator().manual_seed(seed * 100_003 + epoch)
    return torch.randperm(num_samples, generator=g)


def minibatches(data: SampleSet, batch_size: int, seed: int, epoch: int, start: int = 0,
                shuffle: bool = True) -> Iterator[tuple[int, Batch]]:
    """Yield ``(minibatch index, (input, target))`` for every full minibatch of ``epoch`` from ``start``.

    The last partial minibatch is dropped, so every rank sees the same number of minibatches.
    Resume a run at ``(epoch, start)`` saved from the index after the last finished minibatch.

    Raises:
        PipeDreamError: ``batch_size`` < 1 or larger than the data set, or ``start`` out of range.
    """
    if batch_size < 1 or batch_size > len(data):
        raise PipeDreamError(f"batch size {batch_size} must be between 1 and the data set size {len(data)}")
    n = len(data) // batch_size
    if not 0 <= start <= n:
        raise PipeDreamError(f"resume position {start} is outside epoch {epoch}'s {n} minibatches")
    order = epoch_order(len(data), seed, epoch) if shuffle else torch.arange(len(data))
    for i in range(start, n):
        yield i, data.batch(order[i * batch_size:(i + 1) * batch_size])


def subset_indices(num_samples: int, size: int | None, seed: int) -> list[int]:
    """Sorted indices of a seeded random subset of ``size`` samples (all if ``size`` is None or too big).

    Raises:
        PipeDreamError: ``size`` < 1.
    """
    if size is None or size >= num_samples:
        return list(range(num_samples))
    if size < 1:
        raise PipeDreamError(f"subset size must be positive, got {size}")
    idx = torch.randperm(num_samples, generator=torch.Generator().manual_seed(seed))[:size]
    return sorted(int(i) for i in idx)


def require_module(module: str, install: str) -> Any:
    """Import ``module`` or raise a PipeDreamError that says how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise PipeDreamError(f"python package {module!r} is missing; install it with `{install}`") from None
