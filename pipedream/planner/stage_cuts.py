"""Cut points of a pipeline: where a profile's layers, in topological order, are cut into stages
(:func:`cut_points`), for the schedule search (:mod:`pipedream.planner.schedule_search`) and the partitioner benchmark.

``"balanced"``, ours: minimise the slowest stage's time per microbatch, the larger of its forward and backward and
the transfer over either of its boundaries (:func:`pipedream.costmodel.transfer_s` on the link between the two
stages' ranks), such that each stage's weights, gradients, optimizer state and the activations and buffers of as many
microbatches as the schedule holds at once on it fit its share of the device; a dynamic program over stage ends
(numpy, ``O(S L^2)`` for ``S`` stages of ``L`` layers), then, where a rank runs several stages, single cuts moved while
that lightens the busiest rank. ``"compute"`` balances forward and backward alone (the cost-based partitioner proposed
upstream for torch.distributed.pipelining), ``"equal"`` cuts equal numbers of layers (torchtitan's default).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipedream import costmodel, memory
from pipedream.cuts import crossing
from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph

PARTITIONERS = ("balanced", "compute", "equal")


@dataclass
class Layers:
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


def layers_of(graph: LayerGraph) -> Layers:
    """:class:`Layers` of ``graph`` at its own minibatch size."""
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
    return Layers(ids, parts[:, 0] + parts[:, 1], np.array([graph.param_bytes_of(group) for group in ids]),
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


def cut_points(layers: Layers, stages: int, scale: float, *, partitioner: str = "balanced",
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


def _stage_bytes(layers: Layers, scale: float, states: int) -> tuple[np.ndarray, np.ndarray]:
    """``[i, j]``: what a stage of layers ``i .. j - 1`` holds whatever its microbatches (weights, gradients and
    optimizer state), and per microbatch in flight (outputs, its input and its sent output and gradient buffer)."""
    p_pre = np.concatenate([[0.0], np.cumsum(layers.param_bytes)])
    a_pre = np.concatenate([[0.0], np.cumsum(layers.output_bytes)]) * scale
    fixed = (2 + states) * (p_pre[None, :] - p_pre[:, None])
    act = (a_pre[None, :] - a_pre[:, None]) + (layers.cut_bytes[:, None] + 2 * layers.cut_bytes[None, :]) * scale
    return fixed, act


def _holds(layers: Layers, ends: list[int], scale: float, limit: MemoryLimit) -> bool:
    """Every stage of the split ``ends`` fits ``limit``."""
    fixed, act = _stage_bytes(layers, scale, limit.states)
    return all(fixed[a, z] + h * act[a, z] <= limit.capacity_bytes
               for a, z, h in zip([0, *ends[:-1]], ends, limit.held, strict=True))


def _cut(layers: Layers, stages: int, scale: float, partitioner: str, links_Bps: list[float] | None,  # noqa: PLR0913
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
