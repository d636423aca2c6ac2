"""Choose the schedule: for every schedule of the field, the pipeline depth, chunks per rank, microbatch count and cut
points whose simulated iteration is fastest within the device memory (``pipedream plan --schedule``).

Candidates. ``N`` workers run ``w`` parallel straight pipelines of depth ``d`` (``w d = N``; pipeline ``i`` on ranks
``i d .. i d + d - 1``, so that a pipeline stays inside a server where it fits), each of ``d v`` stages with ``v``
chunks per rank where the schedule runs several (:func:`pipedream.torch_schedules.chunks_of`; the looped ones 2 and
4). An iteration is ``B`` samples, ``B / w`` a pipeline, in ``m`` microbatches of ``b = B / (w m)`` samples; ``m``
runs over ``d``, ``2d``, ``4d`` and ``8d`` (at most ``max_microbatches``, ``b`` whole).

Cut points (:func:`cut_points`). ``"balanced"``, ours: the topological order of the profile is cut into ``d v`` stages
minimising the slowest stage's time per microbatch, the larger of its forward and backward at ``b`` and the transfer
over either of its boundaries (:func:`pipedream.costmodel.transfer_s` on the link between the two stages' ranks, the
network's :meth:`~pipedream.sim.network.Network.path`), such that each
stage's weights, gradients, optimizer state and the activations and buffers of as many microbatches as the schedule
holds at once on it (counted on its action list) fit ``1 / v`` of the device; a dynamic program over stage ends
(numpy, ``O(d v L^2)`` for ``L`` layers). ``"compute"`` balances forward and backward alone (the cost-based partitioner
proposed upstream for torch.distributed.pipelining), ``"equal"`` cuts equal numbers of layers (torchtitan's default).

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
from pipedream.cuts import crossing
from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph
from pipedream.plan import Plan, Stage
from pipedream.planner.core import PlanOptions, plan_pipeline
from pipedream.schedules import COMPUTE, Action, Kind, Schedule
from pipedream.sim import DEFAULT_ALLREDUCE, build_schedule, torch_stage_ranks
from pipedream.sim.costs import StageCost, stage_costs
from pipedream.sim.engine import run
from pipedream.sim.network import Network
from pipedream.topology import Cluster
from pipedream.torch_schedules import CHUNKS, TORCH_CLASSES, torch_ops

SEARCHED = ("gpipe", "pipedream_flush", "interleaved_1f1b", "looped_bfs", "interleaved_zb", "zbv", "dualpipev")
LOOPED_CHUNKS = (2, 4)
PARTITIONERS = ("balanced", "compute", "equal")
MICROBATCH_FACTORS = (1, 2, 4, 8)  # microbatches per iteration: these multiples of the depth
RERANK_WORKERS = 16  # up to this many workers, auto weighs PipeDream's re-ranked (simulated) plan (pipedream_plan)


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
        partitioner: ``"balanced"``, ``"compute"`` or ``"equal"`` (module docstring).
    """

    batch_size: int
    schedules: tuple[str, ...] = SEARCHED
    memory_limit: bool = True
    step: costmodel.StepRates | None = None
    max_microbatches: int = 64
    depths: tuple[int, ...] | None = None
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


@dataclass
class _Layers:
    """The profile in topological order at its minibatch size: per compute layer its forward + backward seconds, its
    forward, backward and input-gradient seconds apart (:meth:`pipedream.graph.LayerGraph.backward_split`), parameter
    and output bytes, and per cut after layer ``k`` (``k = 0 .. L``) the bytes crossing it and those whose gradient
    comes back (not the data's)."""

    ids: list[list[str]]  # per compute layer, its node ids (the inputs ride with the first layer)
    compute_s: np.ndarray
    param_bytes: np.ndarray
    output_bytes: np.ndarray
    cut_bytes: np.ndarray
    parts_s: np.ndarray  # [layer, (F, B, I, W)]
    grad_cut_bytes: np.ndarray
    splits: dict[tuple[Any, ...], list[int]] = field(default_factory=dict, repr=False)  # cut_points without a limit


def _layers(graph: LayerGraph) -> _Layers:
    """:class:`_Layers` of ``graph`` at its own minibatch size."""
    order = graph.topological_order()
    index = {n: i for i, n in enumerate(order)}
    compute = [i for i, n in enumerate(order) if not graph.nodes[n].is_input]
    if not compute:
        raise PipeDreamError("the profile has no layers to cut into stages")
    ids = [[order[i]] for i in compute]
    ids[0] = [n for n in order[: compute[0] + 1]]
    for i, n in enumerate(order):  # inputs after the first layer ride with the layer after them
        if graph.nodes[n].is_input and i > compute[0]:
            ids[next(k for k, c in enumerate(compute) if c > i)].insert(0, n)
    last_of = [index[group[-1]] for group in ids]
    member = np.arange(len(order))[None, :] <= np.array(last_of)[:, None]
    crosses = crossing(member, [[index[d] for d in graph.successors(n)] for n in order])
    out = np.array([graph.nodes[n].output_bytes for n in order])
    grad = np.array([0.0 if graph.nodes[n].is_input else graph.nodes[n].output_bytes for n in order])
    cut = np.concatenate([[0.0], crosses.astype(float) @ out])
    grad_cut = np.concatenate([[0.0], crosses.astype(float) @ grad])
    cut[-1] = grad_cut[-1] = 0.0
    nodes = [[graph.nodes[n] for n in group] for group in ids]
    parts = np.array([[sum(x) for x in zip(*([n.fwd_s, n.bwd_s, *graph.backward_split(n.node_id)] for n in g),
                                           strict=True)] for g in nodes])
    return _Layers(ids, parts[:, 0] + parts[:, 1], np.array([graph.param_bytes_of(group) for group in ids]),
                   np.array([sum(n.output_bytes for n in g) for g in nodes]), cut, parts, grad_cut)


@dataclass(frozen=True)
class MemoryLimit:
    """What each stage of a split may hold (:func:`cut_points`).

    Attributes:
        held: per stage, microbatches in flight at its peak.
        capacity_bytes: bytes one stage may hold.
        states: the optimizer's state tensors of a parameter's size (:func:`pipedream.memory.optimizer_states`).
    """

    held: list[int]
    capacity_bytes: float
    states: int = 1


def cut_points(layers: _Layers, stages: int, scale: float, *, partitioner: str = "balanced",
               links_Bps: list[float] | None = None, latency_s: float = 0.0, limit: MemoryLimit | None = None,
               owners: list[int] | None = None) -> list[int]:
    """Stage ends (layer counts, the last ``L``) of ``stages`` contiguous stages of ``layers`` at ``scale`` times
    the profiled batch (module docstring: ``balanced``, ``compute``, ``equal``).

    Args:
        layers: the profile in topological order.
        stages: how many stages.
        scale: the microbatch over the profiled minibatch.
        partitioner: ``"balanced"`` (compute, transfers, memory), ``"compute"`` or ``"equal"``.
        links_Bps: ``balanced``: the bandwidth after each stage but the last (between its rank and the next
            stage's; ``inf`` on one rank), bytes/s; None: no transfers.
        latency_s: ``balanced``: the latency of a transfer, seconds.
        limit: ``balanced``: what each stage may hold (None: no memory check).
        owners: ``balanced``: per stage its rank; where a rank runs several stages, the dynamic program's cuts
            (which balance stages) are then moved one layer at a time while that lowers the larger of the busiest
            rank's compute and the slowest stage's cost.
    Raises:
        PipeDreamError: more stages than layers, an unknown partitioner, or no split fits the memory.
    """
    n = len(layers.compute_s)
    if stages > n:
        raise PipeDreamError(f"{stages} stages for {n} layers; use a shallower pipeline or fewer chunks")
    if partitioner == "equal":
        return [round((k + 1) * n / stages) for k in range(stages)]
    if partitioner not in PARTITIONERS:
        raise PipeDreamError(f"unknown partitioner {partitioner!r}; use one of {', '.join(PARTITIONERS)}")
    key = (stages, scale, partitioner, tuple(links_Bps or ()), latency_s, tuple(owners or ()))
    if key not in layers.splits:  # the split without the memory limit, shared by the schedules of one placement
        layers.splits[key] = _cut(layers, stages, scale, partitioner, links_Bps, latency_s, None, owners)
    free = layers.splits[key]
    if partitioner != "balanced" or limit is None or _holds(layers, free, scale, limit):
        return list(free)
    return _cut(layers, stages, scale, partitioner, links_Bps, latency_s, limit, owners)


def _stage_bytes(layers: _Layers, scale: float, states: int) -> tuple[np.ndarray, np.ndarray]:
    """``[i, j]``: what a stage of layers ``i .. j - 1`` holds whatever its microbatches (weights, gradients and
    optimizer state), and per microbatch in flight (outputs, its input and its sent output and gradient buffer)."""
    p_pre = np.concatenate([[0.0], np.cumsum(layers.param_bytes)])
    a_pre = np.concatenate([[0.0], np.cumsum(layers.output_bytes)]) * scale
    fixed = (2 + states) * (p_pre[None, :] - p_pre[:, None])
    act = (a_pre[None, :] - a_pre[:, None]) + (layers.cut_bytes[:, None] + 2 * layers.cut_bytes[None, :]) * scale
    return fixed, act


def _holds(layers: _Layers, ends: list[int], scale: float, limit: MemoryLimit) -> bool:
    """Every stage of the split ``ends`` fits ``limit``."""
    fixed, act = _stage_bytes(layers, scale, limit.states)
    return all(fixed[a, z] + h * act[a, z] <= limit.capacity_bytes
               for a, z, h in zip([0, *ends[:-1]], ends, limit.held, strict=True))


def _cut(layers: _Layers, stages: int, scale: float, partitioner: str, links_Bps: list[float] | None,  # noqa: PLR0913
         latency_s: float, limit: MemoryLimit | None, owners: list[int] | None) -> list[int]:
    """:func:`cut_points`' dynamic program (and the moves of single cuts where a rank runs several stages)."""
    n = len(layers.compute_s)
    pre = np.concatenate([[0.0], np.cumsum(layers.compute_s)]) * scale
    span = pre[None, :] - pre[:, None]  # [i, j]: layers i..j-1
    by_bw = {bw: np.asarray(costmodel.transfer_s_array(layers.cut_bytes * scale, bw, latency_s))
             for bw in set(links_Bps or [])}
    links = [] if partitioner != "balanced" or links_Bps is None else [by_bw[bw] for bw in links_Bps]
    valid = np.triu(np.ones_like(span, dtype=bool), k=1)
    cost = np.where(valid, span, np.inf)
    mem = _stage_bytes(layers, scale, limit.states) if partitioner == "balanced" and limit is not None else None
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    back = np.zeros((stages, n + 1), dtype=int)
    costs = []  # per stage, its cost of every span (transfers and memory included)
    for k in range(stages):
        c = cost if mem is None or limit is None else np.where(mem[0] + limit.held[k] * mem[1] <= limit.capacity_bytes,
                                                               cost, np.inf)
        if k > 0 and links:  # receiving its input and sending back its gradient over the link before it
            c = np.maximum(c, links[k - 1][:, None])
        if k < stages - 1 and links:  # sending its output and receiving its gradient over the link after it
            c = np.maximum(c, links[k][None, :])
        costs.append(c)
        cand = np.maximum(best[:, None], c)
        back[k] = np.argmin(cand, axis=0)
        best = cand[back[k], np.arange(n + 1)]
    if not np.isfinite(best[n]):
        raise PipeDreamError(f"no split of the model into {stages} stages fits "
                             f"{memory.format_bytes(limit.capacity_bytes if limit else math.inf)} a "
                             "stage; use more ranks, more microbatches or recomputation")
    ends, j = [], n
    for k in range(stages - 1, -1, -1):
        ends.append(j)
        j = int(back[k][j])
    ends.reverse()
    if partitioner != "balanced" or owners is None or len(set(owners)) == len(owners):
        return ends
    # several stages a rank: move single cuts while the busiest rank's compute (or the slowest stage) gets lighter
    rank = np.array(owners)

    def worst(e: list[int]) -> float:
        starts = [0, *e[:-1]]
        stage = [float(c[a, z]) for c, a, z in zip(costs, starts, e, strict=True)]
        load = np.bincount(rank, weights=[span[a, z] for a, z in zip(starts, e, strict=True)])
        return max(float(load.max()), max(stage)) if np.isfinite(max(stage)) else math.inf

    now = worst(ends)
    moved = True
    while moved:
        moved = False
        for k in range(stages - 1):
            for step in (-1, 1):
                e = [*ends[:k], ends[k] + step, *ends[k + 1:]]
                if (e[k - 1] if k else 0) < e[k] < e[k + 1] and (t := worst(e)) < now * (1 - 1e-12):
                    ends, now, moved = e, t, True
    return ends


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
    layers = _layers(graph)
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
    ms = [f * depth for f in MICROBATCH_FACTORS if f * depth <= settings.max_microbatches and per_pipeline % (f * depth) == 0]
    return ms or [m for m in (per_pipeline,) if m <= settings.max_microbatches]


def _candidate(graph: LayerGraph, layers: _Layers, cluster: Cluster, settings: SearchSettings,
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
    layers = _layers(graph)
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


def pipedream_plan(graph: LayerGraph, cluster: Cluster, *, model: str, step: costmodel.StepRates | None = None,
                   memory_limit: bool | None = None) -> Plan:
    """PipeDream's own plan (1F1B-RR with replicated stages) as ``--schedule auto`` weighs it: the default planner's,
    re-ranked by simulation (:mod:`pipedream.planner.rerank`), on up to :data:`RERANK_WORKERS` workers; on more, the
    dynamic program's plan and estimate (§3.1's cost model), since the re-ranking simulates for minutes there.

    Raises:
        PipeDreamError: those of :func:`pipedream.planner.plan_pipeline`.
    """
    rerank = cluster.workers <= RERANK_WORKERS
    return plan_pipeline(graph, cluster, model=model, minibatch_size=graph.minibatch_size, step=step,
                         options=PlanOptions(memory_limit=memory_limit, rerank=rerank))


def pipedream_row(plan: Plan, batch_size: int) -> dict[str, Any]:
    """The record of :meth:`Option.summary` for PipeDream's own plan (1F1B-RR with replicated stages, asynchronous:
    no flush): its simulated time per sample times ``batch_size``, its steady bubble from its stages' compute
    (``1 - sum of compute / (workers x time per minibatch)``) and each rank's stage memory."""
    period = float(plan.extra.get("bottleneck_time_per_minibatch_s") or plan.time_per_sample_s * plan.minibatch_size)
    busy = sum(s.compute_s for s in plan.stages)
    per_rank = {r: s.memory_bytes for s in plan.stages for r in s.ranks}
    iteration = plan.time_per_sample_s * batch_size
    return {"schedule": "1f1b", "depth": len(plan.stages), "width": None, "chunks": 1, "config": plan.config,
            "microbatches": None, "microbatch_size": plan.minibatch_size, "iteration_s": iteration,
            "samples_per_s": batch_size / iteration, "bubble": max(0.0, 1 - busy / (plan.workers * period)),
            "peak_memory_bytes": [per_rank[r] for r in sorted(per_rank)], "fits": True,
            "estimate": "simulated" if plan.extra.get("estimate") == "simulated" else "the dynamic program's"}


def to_plan(options: list[Option], graph: LayerGraph, cluster: Cluster, settings: SearchSettings, *, model: str,
            pipedream: Plan | None = None, dp_time_per_sample_s: float = math.nan) -> Plan:
    """The plan of the fastest fitting choice: PipeDream's own plan (``pipedream``, 1F1B-RR) where it is faster, else
    the best :class:`Option` as stages of ``w`` replicas (one per pipeline; ``extra["chunks"]`` stages a rank). Every
    schedule's best is in ``extra["schedules"]``, fastest first.

    Raises:
        PipeDreamError: nothing fits the device memory.
    """
    rows = [o.summary(settings.batch_size) for o in options]
    if pipedream is not None:
        rows.append(pipedream_row(pipedream, settings.batch_size))
    rows.sort(key=lambda r: (not r["fits"], r["iteration_s"]))
    if not rows or not rows[0]["fits"]:
        raise PipeDreamError(f"no schedule fits {memory.format_bytes(cluster.device_memory_bytes)} a device of "
                             f"{cluster.name}; use more workers or a smaller --batch-size")
    record = {"schedule_search": {"batch_size": settings.batch_size, "partitioner": settings.partitioner,
                                  "memory_limit": settings.memory_limit}, "schedules": rows}
    if rows[0]["schedule"] == "1f1b" and pipedream is not None:
        pipedream.extra.update({"schedule": "1f1b", **record})
        return pipedream
    best = next(o for o in options if o.schedule == rows[0]["schedule"])
    stages = [Stage(nodes=nodes, replicas=best.width, ranks=ranks,
                    compute_s=sum(graph.nodes[n].fwd_s + graph.nodes[n].bwd_s for n in nodes if not graph.nodes[n].is_input),
                    memory_bytes=best.peak_bytes[ranks[0]])
              for nodes, ranks in zip(best.stages, best.stage_ranks, strict=True)]
    plan = Plan(model=model, cluster=cluster.name, workers=cluster.workers, stages=stages,
                minibatch_size=graph.minibatch_size, time_per_sample_s=best.iteration_s / settings.batch_size,
                dp_time_per_sample_s=dp_time_per_sample_s,
                extra={"schedule": best.schedule, "chunks": best.chunks, "microbatches": best.microbatches,
                       "microbatch_size": best.microbatch_size, "depth": best.depth, "width": best.width,
                       "iteration_s": best.iteration_s, "bubble": best.bubble, "device_memory_bytes":
                       cluster.device_memory_bytes, "estimate": "simulated", **record})
    plan.validate()
    return plan


def format_schedules(rows: list[dict[str, Any]]) -> str:
    """Every schedule's best, one line each as ``extra["schedules"]`` holds them (best first): the shape, the
    iteration, samples per second, the bubble and the peak memory per rank."""
    lines = [f"{'schedule':<17} {'depth x width':<13} {'chunks':>6} {'microbatches':>12} {'iteration':>11} "
             f"{'samples/s':>10} {'bubble':>7}  peak memory per rank"]
    for r in rows:
        shape = f"{r['depth']} x {r['width']}" if r["width"] else str(r.get("config"))
        micro = f"{r['microbatches']} of {r['microbatch_size']}" if r["microbatches"] else f"- of {r['microbatch_size']}"
        peaks = r["peak_memory_bytes"]
        mem = " ".join(memory.format_bytes(b) for b in peaks[:8]) + (" ..." if len(peaks) > 8 else "")
        note = ("" if r["fits"] else "  (does not fit)") + (f"  ({r['estimate']} estimate)" if r.get("estimate") not in
                                                             (None, "simulated") else "")
        lines.append(f"{r['schedule']:<17} {shape:<13} {r['chunks']:>6} {micro:>12} {r['iteration_s'] * 1e3:>9.2f}ms "
                     f"{r['samples_per_s']:>10.1f} {r['bubble']:>7.1%}  max {memory.format_bytes(max(peaks))}: {mem}{note}")
    return "\n".join(lines)
