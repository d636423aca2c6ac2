"""How long things take: the one cost model that the planner, the re-ranking, the simulator, ``explain``
and the runtime's link emulation all call (docs/design.md, "One fact, one place").

Every formula here is the alpha-beta model of a collective or a transfer on links of a given bandwidth:

* point-to-point transfer of ``S`` bytes on a link of ``B`` bytes/s: ``latency + S / B``;
* ring allreduce of ``S`` bytes over ``n`` ranks (reduce-scatter then all-gather, ``2 (n - 1)`` steps of
  ``S / n`` bytes each; Patarasuk and Yuan 2009, the algorithm NCCL and gloo run):
  ``2 (n - 1) * latency + 2 (n - 1) / n * S / B``;
* hierarchical allreduce: one ring per level of the cluster (inside a server, then across servers), the
  level-``l`` ring over ``n_l`` groups at that level's bandwidth ``B_l``: the sum over levels of the ring
  term;
* gradient buckets as PyTorch's ``DistributedDataParallel`` forms them (25 MiB, the first 1 MiB, parameters in
  reverse order of registration); a bucket's allreduce starts when its last gradient is ready, buckets are
  reduced one after another in bucket order;
* an optimizer step: memory bound, ``traffic x parameter bytes / memory bandwidth`` with the bytes an
  update reads and writes per parameter byte (:data:`STEP_TRAFFIC`), or measured: seconds per call, per
  tensor and per byte.

The release's own formulas (the ``4 (m - 1) P / (B m)`` weight sync of its optimizer, no latency, no
buckets) are not here: they live in :mod:`pipedream.planner.compat`, used only by ``--compat``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy only for annotations: the command line's --help must not import it
    import numpy as np

# PyTorch DDP's defaults (torch.nn.parallel.DistributedDataParallel: bucket_cap_mb=25 is 25 MiB; the first
# bucket is capped at torch.distributed._DEFAULT_FIRST_BUCKET_BYTES = 1 MiB so the first allreduce starts early)
DDP_BUCKET_CAP_BYTES = 25 * 2**20
DDP_FIRST_BUCKET_BYTES = 2**20
# Latency of one step of a ring (one message between neighbours), s, when a cluster gives none: the order of
# one TCP round trip inside a data centre; a cluster's ``latency_s`` overrides it.
DEFAULT_STEP_LATENCY_S = 20e-6
# Bytes an optimizer step reads and writes per byte of parameters (fp32), zeroing the gradients after it included
# (1): SGD with momentum reads weight, gradient and momentum and writes weight and momentum (5 + 1); Adam with both
# moments (7 + 1). Muon defaults to Adam's traffic, a floor: its Newton-Schulz iterations are compute that no
# traffic count holds (the profiler measures its step like the others').
STEP_TRAFFIC = {"sgd": 6.0, "adam": 8.0, "muon": 8.0}
# Bytes copy on write adds per parameter byte: a step first copies the weights it changes when an in-flight
# minibatch still needs them (weight stashing, 2BW; pipedream.runtime.versions), reading and writing each once.
COPY_TRAFFIC = 2.0
# The optimizer the paper's image models train with (SGD with momentum, §5.1), when none is given.
DEFAULT_OPTIMIZER = "sgd"
# Memory bandwidth of the paper's GPU, bytes/s: NVIDIA Tesla V100, 900 GB/s of HBM2 (V100 datasheet); the
# memory-bound optimizer step's default when no measured seconds-per-byte is given.
V100_MEMORY_BPS = 900e9


def transfer_s(nbytes: float, bandwidth_Bps: float, latency_s: float = 0.0) -> float:
    """Seconds to send ``nbytes`` over one link of ``bandwidth_Bps`` bytes/s: ``latency + S / B``
    (0 for nothing to send or an infinitely fast link, e.g. a rank to itself)."""
    if nbytes <= 0 or math.isinf(bandwidth_Bps):
        return 0.0
    return float(_transfer_s(nbytes, bandwidth_Bps, latency_s))


def ring_allreduce_s(nbytes: float, ranks: int, bandwidth_Bps: float, latency_s: float = 0.0) -> float:
    """Seconds of a ring allreduce of ``nbytes`` over ``ranks`` ranks on links of ``bandwidth_Bps``.

    ``2 (n - 1) * latency + 2 (n - 1) / n * S / B``: ``2 (n - 1)`` steps (reduce-scatter, all-gather), each
    moving ``S / n`` bytes through every link of the ring (Patarasuk and Yuan 2009). 0 for one rank.
    """
    if ranks < 2 or nbytes <= 0:
        return 0.0
    return float(_ring_s(nbytes, ranks, bandwidth_Bps, latency_s))


def ring_allreduce_bytes(nbytes: float, ranks: int) -> float:
    """Bytes all ranks of a ring allreduce send together: ``2 (n - 1) S`` (each sends ``2 (n - 1) / n * S``)."""
    return 2 * (ranks - 1) * nbytes if ranks > 1 else 0.0


def hierarchical_allreduce_s(nbytes: float, groups_per_level: Sequence[int], bandwidths_Bps: Sequence[float],
                             latency_s: float = 0.0) -> float:
    """Seconds of a hierarchical allreduce: one ring per level, innermost first.

    ``groups_per_level[l]`` is how many level-``l`` groups (GPUs at level 0, servers at level 1) take part
    inside one level-``l+1`` group, ``bandwidths_Bps[l]`` the bandwidth between them; the result is the sum
    of :func:`ring_allreduce_s` over the levels with more than one group.
    """
    return sum(ring_allreduce_s(nbytes, c, bw, latency_s)
               for c, bw in zip(groups_per_level, bandwidths_Bps, strict=True) if c > 1)


def ddp_first_cap(cap_bytes: float) -> float:
    """The first bucket's cap as PyTorch's DDP applies it: 1 MiB (:data:`DDP_FIRST_BUCKET_BYTES`) when the cap is
    DDP's default 25 MiB, else the cap itself (an explicit ``bucket_cap_mb`` caps every bucket alike, torch 2.14)."""
    return DDP_FIRST_BUCKET_BYTES if cap_bytes == DDP_BUCKET_CAP_BYTES else cap_bytes


def bucket_layers(sizes_bytes: Sequence[float], cap_bytes: float = DDP_BUCKET_CAP_BYTES,
                  first_cap_bytes: float | None = None) -> list[list[int]]:
    """Group gradient tensors into allreduce buckets the way DDP does.

    Args:
        sizes_bytes: bytes of each gradient tensor (or layer), in the order the backward produces them
            (reverse order of registration, as DDP assumes); zero sizes are skipped.
        cap_bytes: a bucket is closed once it holds at least this many bytes (DDP's ``bucket_cap_mb``).
        first_cap_bytes: the cap of the first bucket; None (what the runtime, the DDP baseline and the
            simulator all use): DDP's rule, :func:`ddp_first_cap`.
    Returns:
        buckets in reduction order, each the indices (into ``sizes_bytes``) it holds, in order.
    Raises:
        ValueError: a non-positive cap.
    """
    first = ddp_first_cap(cap_bytes) if first_cap_bytes is None else first_cap_bytes
    if cap_bytes <= 0 or first <= 0:
        raise ValueError(f"bucket caps must be positive bytes, got {cap_bytes} and {first}")
    buckets: list[list[int]] = []
    current: list[int] = []
    filled = 0.0
    for i, size in enumerate(sizes_bytes):
        if size <= 0:
            continue
        current.append(i)
        filled += size
        if filled >= (cap_bytes if buckets else first):
            buckets.append(current)
            current, filled = [], 0.0
    if current:
        buckets.append(current)
    return buckets


def optimizer_step_s(param_bytes: float, optimizer: str, memory_Bps: float | None = None,
                     s_per_param_byte: float | None = None, copy_on_write: bool = False, tensors: int = 0,
                     s_per_tensor: float = 0.0, s_per_call: float = 0.0) -> float:
    """Seconds of one optimizer step (and zeroing the gradients) over ``param_bytes`` bytes of parameters held in
    ``tensors`` tensors.

    With ``s_per_param_byte`` (measured, e.g. by the profiler on the run's host, :mod:`pipedream.step_rates`)
    ``s_per_call + s_per_tensor * tensors + s_per_param_byte * param_bytes``: a step is one call that walks its
    tensors one by one (PyTorch's single-tensor SGD and Adam, its default on a CPU), so besides the memory-bound
    work per byte each tensor costs its handful of operators' dispatch and the call itself its Python and cold
    caches (on a CPU, right after a training step, tenths of a millisecond a call and tens of microseconds a
    tensor: a stage of many small tensors steps many times slower than its bytes alone say). Otherwise the
    memory-bound estimate ``STEP_TRAFFIC[optimizer] * param_bytes / memory_Bps``; 0 when neither is known, and 0
    for a stage without parameters. ``copy_on_write``: the step first copies the weights (a stage that stashes
    versions), ``COPY_TRAFFIC / STEP_TRAFFIC[optimizer]`` more of the per-byte work (the copy's own per-tensor
    cost is not modelled).

    Raises:
        ValueError: an optimizer :data:`STEP_TRAFFIC` does not know.
    """
    if param_bytes <= 0:
        _check_optimizer(optimizer)
        return 0.0
    return float(_step_s(param_bytes, tensors, copy_on_write, optimizer, memory_Bps, s_per_param_byte, s_per_tensor,
                         s_per_call))


def _check_optimizer(optimizer: str) -> None:
    if optimizer not in STEP_TRAFFIC:
        raise ValueError(f"unknown optimizer {optimizer!r}; known: {', '.join(STEP_TRAFFIC)}")


def _step_s(param_bytes: float | np.ndarray, tensors: float | np.ndarray, copy_on_write: bool | np.ndarray,
            optimizer: str, memory_Bps: float | None, s_per_param_byte: float | None, s_per_tensor: float,
            s_per_call: float) -> float | np.ndarray:
    """The step formula alone for positive ``param_bytes`` (floats or numpy arrays alike, ``copy_on_write`` a
    bool or a boolean array), see :func:`optimizer_step_s`."""
    _check_optimizer(optimizer)
    copies = 1.0 + (COPY_TRAFFIC / STEP_TRAFFIC[optimizer]) * copy_on_write
    if s_per_param_byte is not None:
        return s_per_call + s_per_tensor * tensors + s_per_param_byte * param_bytes * copies
    if memory_Bps:
        return STEP_TRAFFIC[optimizer] * param_bytes / memory_Bps * copies
    return param_bytes * 0.0


@dataclass(frozen=True)
class StepRates:
    """How one optimizer step is priced: :func:`optimizer_step_s`'s arguments besides a stage's own bytes and
    tensors, as the planner's recurrence, its re-ranking's simulation and the run's prediction take them.

    Attributes:
        optimizer: a key of :data:`STEP_TRAFFIC` (default :data:`DEFAULT_OPTIMIZER`, the paper's SGD).
        s_per_param_byte: measured seconds per parameter byte on the profiling host
            (:func:`pipedream.sim.profiled.step_rate`); None: the memory-bound estimate at ``memory_Bps``.
        s_per_call, s_per_tensor: measured seconds per step call and per parameter tensor beside that rate
            (:func:`pipedream.sim.profiled.step_overheads`); used only with ``s_per_param_byte``.
        memory_Bps: memory bandwidth for the estimate, bytes/s (default the V100's, :data:`V100_MEMORY_BPS`);
            None or 0: no step time.
    """

    optimizer: str = DEFAULT_OPTIMIZER
    s_per_param_byte: float | None = None
    s_per_call: float = 0.0
    s_per_tensor: float = 0.0
    memory_Bps: float | None = V100_MEMORY_BPS

    def seconds_array(self, param_bytes: np.ndarray, tensors: np.ndarray | float, copy_on_write: np.ndarray | bool = False,
                      ) -> np.ndarray:
        """One step over ``param_bytes`` bytes in ``tensors`` tensors, copying the weights first where
        ``copy_on_write`` (:func:`optimizer_step_s`), element-wise over numpy arrays that broadcast (the planner's
        vectorised recurrence), seconds; 0 where ``param_bytes <= 0``."""
        return (param_bytes > 0) * _step_s(param_bytes, tensors, copy_on_write, self.optimizer, self.memory_Bps,
                                           self.s_per_param_byte, self.s_per_tensor, self.s_per_call)

    def seconds(self, param_bytes: float, tensors: int = 0, copy_on_write: bool = False) -> float:
        """One step over ``param_bytes`` bytes in ``tensors`` tensors (:func:`optimizer_step_s`), seconds.

        Raises:
            ValueError: an optimizer :data:`STEP_TRAFFIC` does not know, or a negative rate or bandwidth.
        """
        negative = [r for r in (self.s_per_param_byte, self.memory_Bps, self.s_per_call, self.s_per_tensor)
                    if r is not None and r < 0]
        if negative:
            raise ValueError(f"optimizer step rates {self.s_per_call} s a call, {self.s_per_tensor} s a tensor, "
                             f"{self.s_per_param_byte} s/byte and memory bandwidth {self.memory_Bps} B/s must not "
                             "be negative")
        return optimizer_step_s(param_bytes, self.optimizer, self.memory_Bps, self.s_per_param_byte, copy_on_write,
                                tensors, self.s_per_tensor, self.s_per_call)

    def record(self) -> dict[str, Any]:
        """The rates as a plan's or a run's JSON record keeps them (``optimizer``, ``step_s_per_param_byte``,
        ``step_overhead_s`` as ``[per call, per tensor]``, ``memory_Bps``): ``plan.extra["simulation"]`` and a
        prediction's ``sim_kwargs`` in ``run.json``."""
        return {"optimizer": self.optimizer, "step_s_per_param_byte": self.s_per_param_byte,
                "step_overhead_s": [self.s_per_call, self.s_per_tensor], "memory_Bps": self.memory_Bps}


def _ring_s(nbytes: float | np.ndarray, ranks: int | np.ndarray, bandwidth_Bps: float,
            latency_s: float) -> float | np.ndarray:
    """The ring formula alone (floats or numpy arrays alike): ``2 (n - 1) * latency + 2 (n - 1) / n * S / B``."""
    return 2 * (ranks - 1) * latency_s + 2 * (ranks - 1) / ranks * nbytes / bandwidth_Bps


def ring_allreduce_s_array(nbytes: np.ndarray | float, ranks: np.ndarray | int, bandwidth_Bps: float,
                           latency_s: float = 0.0) -> np.ndarray | float:
    """:func:`ring_allreduce_s` element-wise over numpy arrays that broadcast (the planner's vectorised
    recurrence; a float for floats): ``2 (n - 1) * latency + 2 (n - 1) / n * S / B`` where ``n >= 2`` and
    ``S > 0``, else 0."""
    return ((ranks >= 2) & (nbytes > 0)) * _ring_s(nbytes, ranks, bandwidth_Bps, latency_s)


def _transfer_s(nbytes: float | np.ndarray, bandwidth_Bps: float, latency_s: float) -> float | np.ndarray:
    """The transfer formula alone (floats or numpy arrays alike): ``latency + S / B``."""
    return latency_s + nbytes / bandwidth_Bps


def transfer_s_array(nbytes: np.ndarray | float, bandwidth_Bps: float, latency_s: float = 0.0) -> np.ndarray | float:
    """:func:`transfer_s` element-wise over a numpy array of byte counts (a float for a float): ``latency + S / B``
    where ``S > 0``, else 0 (0 everywhere on an infinitely fast link)."""
    if math.isinf(bandwidth_Bps):
        return nbytes * 0.0
    return (nbytes > 0) * _transfer_s(nbytes, bandwidth_Bps, latency_s)


@dataclass(frozen=True)
class CheckpointCost:
    """What one checkpoint costs a run (CheckFreq, Mohan et al., FAST'21, §4.3), all in seconds.

    Attributes:
        minibatch_s: one minibatch of training in the steady state (the epoch's time over its minibatches).
        snapshot_s: the snapshot's copy of the state to host memory, inside the training loop.
        persist_s: the background write of the copy until the checkpoint is complete; the next snapshot waits for
            whatever of it is left.
        flush_s: the pipeline's drain and refill a checkpoint adds (0 where the schedule flushes at every minibatch
            anyway, and for data parallelism): :func:`flush_s`.
    """

    minibatch_s: float
    snapshot_s: float
    persist_s: float
    flush_s: float = 0.0


def flush_s(segment_s: float, minibatches: int, stages: int) -> float:
    """The drain and refill of a pipeline of ``stages`` stages in a segment of ``minibatches`` minibatches that took
    ``segment_s`` seconds: a flushed 1F1B pipeline runs ``minibatches + stages - 1`` slots of one minibatch's time,
    ``stages - 1`` of them the bubble (Huang et al. 2019; Narayanan et al. 2021), so the flush is
    ``(stages - 1) / (minibatches + stages - 1)`` of the segment."""
    return segment_s * (stages - 1) / (minibatches + stages - 1)


def checkpoint_overhead(cost: CheckpointCost, every: int) -> float:
    """The share checkpoints every ``every`` minibatches add to the training time, as a fraction of it.

    Each checkpoint holds the loop for its snapshot and the flush, plus what is left of the previous persist when the
    next snapshot comes (``every`` minibatches later): ``(snapshot + flush + max(0, persist - every x minibatch)) /
    (every x minibatch)``; CheckFreq's per-checkpoint cost with the pipeline's flush added.
    """
    work = every * cost.minibatch_s
    if work <= 0:
        return math.inf
    return (cost.snapshot_s + cost.flush_s + max(0.0, cost.persist_s - work)) / work


def checkpoint_interval(cost: CheckpointCost, bound: float) -> int:
    """The smallest interval, in minibatches, whose :func:`checkpoint_overhead` is at most ``bound`` (a fraction,
    CheckFreq's 3.5% is 0.035): the overhead is ``max((s + f) / (N t), (s + f + p) / (N t) - 1)`` for snapshot
    ``s``, flush ``f``, persist ``p`` and minibatch ``t`` seconds, so ``N = max(ceil((s + f) / (bound t)),
    ceil((s + f + p) / ((1 + bound) t)), 1)``.

    Raises:
        ValueError: ``bound`` is not positive or the minibatch takes no time.
    """
    if bound <= 0 or cost.minibatch_s <= 0:
        raise ValueError(f"checkpoint interval needs a positive bound and minibatch time, not {bound}, {cost.minibatch_s}")
    held = cost.snapshot_s + cost.flush_s
    return max(1, math.ceil(held / (bound * cost.minibatch_s)),
               math.ceil((held + cost.persist_s) / ((1 + bound) * cost.minibatch_s)))
