"""Choose the schedule: for every schedule of the field, the pipeline depth, chunks per rank, microbatch count and cut
points whose simulated iteration is fastest within the device memory (``pipedream plan --schedule``).

Candidates. ``N`` workers run ``w`` parallel straight pipelines of depth ``d`` (``w d = N``; pipeline ``i`` on ranks
``i d .. i d + d - 1``, so that a pipeline stays inside a server where it fits), each of ``d v`` stages with ``v``
chunks per rank where the schedule runs several (:func:`pipedream.torch_schedules.chunks_of`; the looped ones 2 and
4). An iteration is ``B`` samples, ``B / w`` a pipeline, in ``m`` microbatches of ``b = B / (w m)`` samples; ``m``
runs over ``d``, ``2d``, ``4d`` and ``8d`` (at most ``max_microbatches``, ``b`` whole).

Cut points (:func:`pipedream.planner.stage_cuts.cut_points`): ``"balanced"`` (ours: compute, transfers on the links
between the stages' ranks, memory; a rank's chunks balanced together), ``"compute"`` or ``"equal"``.

Timing (:func:`simulate_option`). One iteration of one pipeline on the event simulator (:mod:`pipedream.sim.engine`,
the network's links and latency): the iteration time is its makespan, the optimizer steps included; with ``w > 1`` each
stage's step first allreduces its gradient buckets over the ``w`` replicas of the stage
(:meth:`pipedream.sim.network.Network.allreduce_time`, not overlapped with the backward). The bubble is ``1 - busy /
(d x iteration)``; each rank's peak memory is :func:`pipedream.memory.rank_memory` over its list, and a candidate
whose largest exceeds the device does not fit.

Search (:func:`search`). Per schedule, candidates are taken in increasing order of a lower bound of their iteration
(:func:`lower_bound_s`) and simulated unless the bound is no better than the schedule's best that fits so far, or
the candidate does not fit the memory while an earlier one was simulated (of those that do not fit, the one of the
least bound stands for the schedule until one fits); the result is every schedule's best, fastest fitting first.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from pipedream import costmodel, memory
from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph
from pipedream.planner.stage_cuts import Layers, MemoryLimit, cut_points, layers_of
from pipedream.schedules import COMPUTE, Action, Kind, Schedule
from pipedream.sim import DEFAULT_ALLREDUCE, build_schedule, torch_stage_ranks
from pipedream.sim.costs import StageCost, stage_costs
from pipedream.sim.engine import run
from pipedream.sim.network import Network
from pipedream.topology import Cluster
from pipedream.torch_schedules import CHUNKS, TORCH_CLASSES, torch_ops

SEARCHED = ("gpipe", "pipedream_flush", "interleaved_1f1b", "looped_bfs", "interleaved_zb", "zbv", "dualpipev")
LOOPED_CHUNKS = (2, 4)
MICROBATCH_FACTORS = (1, 2, 4, 8)  # microbatches per iteration: these multiples of the depth


@dataclass(frozen=True)
class SearchSettings:
    """What :func:`search` searches.

    Attributes:
        batch_size: samples an iteration (one optimizer step) over all pipelines (``B``).
        schedules: the schedules to search (names of :data:`SEARCHED`).
        memory_limit: drop candidates whose peak memory on some rank exceeds the device's.
        step: how an optimizer step is priced and which optimizer's state is held (None: SGD with momentum,
            memory bound on a V100: :class:`pipedream.costmodel.StepRates`).
        max_microbatches: the most microbatches an iteration is cut into.
        depths: only these pipeline depths (None: every divisor of the workers).
        microbatches: only this many microbatches an iteration (None: the counts of the module docstring), e.g. to
            run at the microbatch size a profile was taken at.
        partitioner: ``"balanced"``, ``"compute"`` or ``"equal"`` (module docstring).
    """

    batch_size: int
    schedules: tuple[str, ...] = SEARCHED
    memory_limit: bool = True
    step: costmodel.StepRates | None = None
    max_microbatches: int = 64
    depths: tuple[int, ...] | None = None
    microbatches: int | None = None
    partitioner: str = "balanced"


@dataclass
class Option:
    """One simulated candidate (times in seconds, sizes in bytes).

    Attributes:
        schedule, depth, width, chunks, microbatches, microbatch_size: the candidate (module docstring).
        stages: node ids per stage (chunk) in pipeline order.
        stage_ranks: per stage its ranks, one per pipeline (replica ``i`` on pipeline ``i``).
        iteration_s: simulated time of one iteration (``B`` samples).
        bubble: the fraction of the pipeline's rank time not computing.
        peak_bytes: per rank of the first pipeline, the bytes it holds at its peak.
        fits: every rank's peak fits the device (always True without the memory limit).
        bound_s: the lower bound it was ordered by.
    """

    schedule: str
    depth: int
    width: int
    chunks: int
    microbatches: int
    microbatch_size: int
    stages: list[list[str]] = field(repr=False)
    stage_ranks: list[list[int]] = field(repr=False)
    iteration_s: float = math.inf
    bubble: float = 1.0
    peak_bytes: list[float] = field(default_factory=list, repr=False)
    fits: bool = True
    bound_s: float = 0.0

    def summary(self, batch_size: int) -> dict[str, Any]:
        """JSON-ready record: the candidate, its time, samples per second, bubble and peak memory per rank."""
        return {"schedule": self.schedule, "depth": self.depth, "width": self.width, "chunks": self.chunks,
                "microbatches": self.microbatches, "microbatch_size": self.microbatch_size,
                "iteration_s": self.iteration_s, "samples_per_s": batch_size / self.iteration_s, "bubble": self.bubble,
                "peak_memory_bytes": self.peak_bytes, "fits": self.fits}


def chunk_counts(schedule: str, depth: int, layers: int) -> list[int]:
    """Chunks per rank to try for ``schedule`` at ``depth``: its fixed count, else :data:`LOOPED_CHUNKS`; at most one
    layer a stage; none for several chunks on one rank (no pipeline: GPipe's and 1F1B's depth 1 is that)."""
    return [v for v in CHUNKS.get(schedule, LOOPED_CHUNKS) if depth * v <= layers and (v == 1 or depth > 1)]


@dataclass(frozen=True)
class _Shape:
    """What the bounds and the memory check need of a schedule's action lists, whatever the costs: per stage the
    most microbatches in flight on it at once (forwards without their ``B`` or ``I``), and per pipeline position its
    compute actions in order."""

    held: list[int]
    compute: list[list[Action]]


@functools.lru_cache(maxsize=512)
def shape_of(schedule: str, depth: int, microbatches: int, chunks: int) -> _Shape:
    """:class:`_Shape` of ``schedule`` on ``depth`` ranks, ``chunks`` stages a rank, ``microbatches`` an iteration
    (torch's lists as :func:`pipedream.torch_schedules.torch_ops` reads them, ours as :func:`pipeline` builds them).

    Raises:
        PipeDreamError: counts the schedule refuses.
    """
    if schedule in TORCH_CLASSES and chunks > 1:
        kinds = {k.value: k for k in COMPUTE}
        compute = [[Action(s, kinds[k], 0, j) for s, k, j in acts] for acts in torch_ops(schedule, depth, microbatches, chunks)]
    else:
        order = pipeline(schedule, depth, microbatches, chunks).order
        compute = [[a for a in order[q] if a.kind in COMPUTE] for q in range(depth)]
    held = [0] * (depth * chunks)
    most = [0] * (depth * chunks)
    for acts in compute:
        for a in acts:
            if a.kind == Kind.F:
                held[a.stage] += 1
                most[a.stage] = max(most[a.stage], held[a.stage])
            elif a.kind in (Kind.B, Kind.I):
                held[a.stage] -= 1
    return _Shape(most, compute)


@functools.lru_cache(maxsize=64)
def pipeline(schedule: str, depth: int, microbatches: int, chunks: int) -> Schedule:
    """One iteration of ``schedule`` on ranks ``0 .. depth - 1`` (:func:`pipedream.sim.build_schedule`)."""
    return build_schedule(schedule, _ranks(schedule, list(range(depth)), chunks), 1, microbatches)


def _ranks(schedule: str, ranks: list[int], chunks: int) -> list[list[int]]:
    """Per stage its rank for a pipeline on ``ranks``."""
    return torch_stage_ranks(schedule, ranks, chunks) if chunks > 1 else [[r] for r in ranks]


def lower_bound_s(times: np.ndarray, shape: _Shape, forward_s: list[float], backward_s: list[float]) -> float:
    """A lower bound on the iteration, no less than any of:

    * per rank, ``a + max(busy, before + e)``: ``a`` the forwards of the stages before the rank's first and the
      transfers between them (the first microbatch reaches it no earlier), ``busy`` all its compute and steps,
      ``before`` its compute up to its last ``B`` or ``I`` of its first stage and ``e`` the ``B`` or ``I`` and the
      gradient transfers of every stage before that one, which that microbatch's backward still runs after it (exact
      for GPipe and 1F1B with equal stages and free transfers);
    * per rank, its port busy with every microbatch's transfers out of it (``forward_s[k]``: stage ``k``'s output to
      stage ``k + 1``, ``backward_s[k]``: the gradient back, seconds each, 0 between stages of one rank; a port sends
      one at a time, :mod:`pipedream.sim.network`).

    ``times[s]``: stage ``s``'s ``F``, ``B``, ``I``, ``W`` and step seconds (no more than the simulation charges).
    """
    m = sum(1 for a in shape.compute[0] if a.stage == 0 and a.kind == Kind.F)  # stage 0 runs on position 0
    ahead = np.concatenate([[0.0], np.cumsum(times[:, 0] + [*forward_s, 0.0])])
    back = np.concatenate([[0.0], np.cumsum(np.minimum(times[:, 1], times[:, 2]) + [*backward_s, 0.0])])
    best = 0.0
    for acts in shape.compute:  # a rank's port sends one transfer at a time
        mine = {a.stage for a in acts}
        best = max(best, m * sum(forward_s[s] for s in mine if s < len(forward_s))
                   + m * sum(backward_s[s - 1] for s in mine if s > 0))
    seconds = [dict(zip((Kind.F, Kind.B, Kind.I, Kind.W), row[:4], strict=True)) for row in times.tolist()]
    for acts in shape.compute:
        first = min(a.stage for a in acts)
        work = [seconds[a.stage][a.kind] for a in acts]
        last = max(i for i, a in enumerate(acts) if a.stage == first and a.kind in (Kind.B, Kind.I))
        steps = sum(times[s, 4] for s in {a.stage for a in acts})
        busy = sum(work) + steps
        best = max(best, float(ahead[first]) + max(busy, sum(work[: last + 1]) + float(back[first])))
    return best


def search(graph: LayerGraph, cluster: Cluster, settings: SearchSettings) -> list[Option]:
    """Every schedule's best option (module docstring), fastest fitting first; options that do not fit after.

    Args:
        graph: the profile (``graph.minibatch_size`` set); times per profiled minibatch, sizes bytes.
        cluster: the cluster (its workers, links, device memory).
        settings: what to search (:class:`SearchSettings`).
    Raises:
        PipeDreamError: an unknown schedule, a bad batch size, or no candidate at all (names why).
    """
    unknown = [s for s in settings.schedules if s not in SEARCHED]
    if unknown:
        raise PipeDreamError(f"unknown schedule(s) {unknown}; use {', '.join(SEARCHED)} or auto")
    if graph.minibatch_size < 1:
        raise PipeDreamError("the profile's minibatch size is unknown; pass --profiled-batch")
    n = cluster.workers
    if settings.batch_size < n:
        raise PipeDreamError(f"--batch-size {settings.batch_size} is less than one sample per worker ({n} workers)")
    layers = layers_of(graph)
    step = settings.step or costmodel.StepRates()
    states = memory.optimizer_states(step.optimizer)
    depths = [d for d in range(1, n + 1) if n % d == 0 and (settings.depths is None or d in settings.depths)]
    best: dict[str, Option] = {}
    errors: list[str] = []
    for schedule in settings.schedules:
        cands = []
        for d in depths:
            for v in chunk_counts(schedule, d, len(layers.compute_s)):
                for m in _microbatch_counts(settings, n // d, d):
                    try:
                        cands.append(_candidate(graph, layers, cluster, settings, (schedule, d, v, m), states))
                    except PipeDreamError as e:
                        errors.append(str(e))
        for c in sorted(cands, key=lambda o: o.bound_s):
            held = best.get(schedule)
            if held is not None and held.fits and c.bound_s >= held.iteration_s:
                continue  # it cannot be faster
            fit(c, graph, cluster, settings)
            if held is not None and not c.fits:
                continue  # nor the first that fits (of those that do not, the one of the least bound is shown)
            simulate_option(c, stage_costs_of(c, graph, cluster, settings), cluster)
            if schedule not in best or (c.fits, -c.iteration_s) > (best[schedule].fits, -best[schedule].iteration_s):
                best[schedule] = c
    if not best:
        raise PipeDreamError(f"no schedule has a candidate on {cluster.name}: {errors[0] if errors else 'no depth'}")
    return sorted(best.values(), key=lambda o: (not o.fits, o.iteration_s))


def _microbatch_counts(settings: SearchSettings, width: int, depth: int) -> list[int]:
    """Microbatch counts to try: :data:`MICROBATCH_FACTORS` times the depth that divide a pipeline's samples."""
    per_pipeline = settings.batch_size // width
    if settings.batch_size % width:
        return []
    if settings.microbatches is not None:
        return [settings.microbatches] if per_pipeline % settings.microbatches == 0 else []
    ms = [f * depth for f in MICROBATCH_FACTORS if f * depth <= settings.max_microbatches and per_pipeline % (f * depth) == 0]
    return ms or [m for m in (per_pipeline,) if m <= settings.max_microbatches]


def _candidate(graph: LayerGraph, layers: Layers, cluster: Cluster, settings: SearchSettings,
               key: tuple[str, int, int, int], states: int, ends: list[int] | None = None) -> Option:
    """One candidate's cut points (``ends`` where given) and lower bound (:func:`lower_bound_s`, from the layers'
    sums; each step no more than its optimizer step over the stage's bytes without per-tensor costs, and its
    allreduce as one collective, not buckets)."""
    schedule, d, v, m = key
    w = cluster.workers // d
    b = settings.batch_size // (w * m)
    scale = b / graph.minibatch_size
    ranks = _ranks(schedule, list(range(d)), v)
    if ends is None:
        net = Network(cluster)
        links = [net.path(a[0], b[0])[1] for a, b in zip(ranks, ranks[1:], strict=False)]
        limit = MemoryLimit(shape_of(schedule, d, m, v).held, cluster.device_memory_bytes / v, states)
        cut = functools.partial(cut_points, layers, d * v, scale, partitioner=settings.partitioner, links_Bps=links,
                                latency_s=cluster.latency_s, owners=[q[0] for q in ranks])
        try:
            ends = cut(limit=limit if settings.memory_limit else None)
        except PipeDreamError:  # nothing fits: the fastest split regardless, which the simulation marks as not fitting
            if not settings.memory_limit:
                raise
            ends = cut()
    starts = [0, *ends[:-1]]
    stages = [[n for group in layers.ids[a:e] for n in group] for a, e in zip(starts, ends, strict=True)]
    stage_ranks = [[q[0] + i * d for i in range(w)] for q in ranks]
    pre = np.concatenate([np.zeros((1, 4)), np.cumsum(layers.parts_s, axis=0)]) * scale
    params = np.array([graph.param_bytes_of(nodes) for nodes in stages])
    net = Network(cluster, DEFAULT_ALLREDUCE)
    steps = (settings.step or costmodel.StepRates()).seconds_array(params, 0.0) + np.array(
        [net.allreduce_time(rs, p) if w > 1 else 0.0 for rs, p in zip(stage_ranks, params.tolist(), strict=True)])
    times = np.column_stack([pre[ends] - pre[starts], steps])
    forward_s = [net.transfer_time(a[0], z[0], layers.cut_bytes[e] * scale)
                 for a, z, e in zip(ranks, ranks[1:], ends, strict=False)]
    backward_s = [net.transfer_time(z[0], a[0], layers.grad_cut_bytes[e] * scale)
                  for a, z, e in zip(ranks, ranks[1:], ends, strict=False)]
    return Option(schedule, d, w, v, m, b, stages, stage_ranks,
                  bound_s=lower_bound_s(times, shape_of(schedule, d, m, v), forward_s, backward_s))


def stage_costs_of(option: Option, graph: LayerGraph, cluster: Cluster, settings: SearchSettings) -> list[StageCost]:
    """What the simulation charges ``option``'s stages (:func:`pipedream.sim.costs.stage_costs` at its microbatch),
    each step after the allreduce of the stage's gradient buckets over its replicas."""
    costs = stage_costs(graph, option.stages, option.microbatch_size, step=settings.step)
    if option.width == 1:
        return costs
    net = Network(cluster, DEFAULT_ALLREDUCE)
    return [replace(c, step_s=c.step_s + sum(net.allreduce_time(rs, nbytes) for _, nbytes in c.buckets))
            for c, rs in zip(costs, option.stage_ranks, strict=True)]


def evaluate(graph: LayerGraph, cluster: Cluster, settings: SearchSettings, schedule: str, depth: int, chunks: int,
             microbatches: int, ends: list[int] | None = None) -> Option:
    """One candidate simulated: ``schedule`` on pipelines of ``depth`` ranks with ``chunks`` stages a rank and
    ``microbatches`` an iteration, cut by ``settings.partitioner`` or at the given stage ``ends`` (layer counts
    in topological order, the last the number of layers; :func:`cut_points`).

    Raises:
        PipeDreamError: counts that do not divide, or those of :func:`cut_points` and the schedule's builder.
    """
    if cluster.workers % depth or settings.batch_size % (cluster.workers // depth * microbatches):
        raise PipeDreamError(f"{cluster.workers} workers in pipelines of {depth} do not split --batch-size "
                             f"{settings.batch_size} into {microbatches} whole microbatches")
    layers = layers_of(graph)
    states = memory.optimizer_states((settings.step or costmodel.StepRates()).optimizer)
    option = _candidate(graph, layers, cluster, settings, (schedule, depth, chunks, microbatches), states, ends)
    fit(option, graph, cluster, settings)
    simulate_option(option, stage_costs_of(option, graph, cluster, settings), cluster)
    return option


def fit(option: Option, graph: LayerGraph, cluster: Cluster, settings: SearchSettings) -> None:
    """Fill in ``option``'s peak memory per rank (:func:`pipedream.memory.rank_memory` over its lists) and whether it
    fits the device (always, without the memory limit)."""
    at_batch = graph.scaled(option.microbatch_size)
    step = settings.step or costmodel.StepRates()
    chunks = dict(enumerate(memory.chunk_bytes(at_batch, option.stages, optimizer=step.optimizer)))
    shape = shape_of(option.schedule, option.depth, option.microbatches, option.chunks)
    option.peak_bytes = [memory.rank_memory(acts, chunks).total for acts in shape.compute]
    option.fits = not settings.memory_limit or max(option.peak_bytes) <= cluster.device_memory_bytes


def simulate_option(option: Option, costs: list[StageCost], cluster: Cluster) -> None:
    """Fill in ``option``'s iteration and bubble (module docstring, "Timing")."""
    sched = pipeline(option.schedule, option.depth, option.microbatches, option.chunks)
    tr = run(sched, costs, Network(cluster, DEFAULT_ALLREDUCE), record=False)
    option.iteration_s = tr.makespan_s
    option.bubble = 1 - sum(tr.busy_s.values()) / (option.depth * tr.makespan_s) if tr.makespan_s > 0 else 0.0
