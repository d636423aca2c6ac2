"""The hierarchical solve (paper §3.1, "the algorithm is applied recursively"): level by level,
innermost first; a whole lower-level group acts as one worker of the next level.

Compat mode follows the release optimizer's semantics exactly; default mode fixes what is wrong in it
(the list of differences and why is in :mod:`pipedream.planner`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from pipedream import costmodel
from pipedream.errors import PipeDreamError
from pipedream.planner.banded import solve_rows_banded
from pipedream.planner.compat import data_parallel_total_time
from pipedream.planner.prune import all_pairs, by_end, undominated_pairs
from pipedream.planner.recurrence import (
    ComputeTable,
    LevelInput,
    LevelRules,
    RowSolution,
    solve_row,
    solve_rows,
    step_s,
    weight_sync_s,
)
from pipedream.planner.states import StateGraph
from pipedream.topology import Cluster


@dataclass
class Segment:
    """A final stage: states ``(start - 1, end]`` (``start = 0``: from the beginning).

    Attributes:
        start: row index (the stage begins after state ``start - 1``).
        end: last state index (inclusive).
        replicas: total replicas (product over the levels).
        per_level: replicas at each level, innermost first.
        offsets: position (in groups) of the stage's first replica inside its parent group, per level.
    """

    start: int
    end: int
    replicas: int
    per_level: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)


@dataclass
class Solution:
    """Result of the hierarchical solve: the bottleneck time per minibatch (s) and the final stages."""

    time_s: float
    dp_time_s: float
    segments: list[Segment]
    level_rules: list[LevelRules]


def level_rules(cluster: Cluster, *, compat: bool, memory_limit: bool, straight: bool, ratio: float | None,
                step: costmodel.StepRates | None = None) -> list[LevelRules]:
    """The :class:`LevelRules` of every level, innermost first. ``step``: the optimizer step default mode charges at
    the innermost level (None: :class:`pipedream.costmodel.StepRates`'s defaults, the memory-bound SGD step the
    simulator charges by default); compat mode charges none, as the release."""
    step = step or costmodel.StepRates()
    rules = []
    previous_width, devices = 1, 1
    for workers, bandwidth in cluster.levels:
        mem = cluster.device_memory_bytes if memory_limit else None
        if compat:
            rules.append(LevelRules(workers, bandwidth, group_init=previous_width, group_split=1.0,
                                    memory_limit_bytes=mem, comm_ratio=ratio, straight=straight, compat=True))
        else:
            rules.append(LevelRules(workers, bandwidth, group_init=devices, group_split=devices,
                                    memory_limit_bytes=mem, memory_divisor=devices, one_memory_model=True,
                                    comm_ratio=1.0 if ratio is None else ratio, straight=straight,
                                    latency_s=cluster.latency_s, step=step if not rules else None))
        previous_width = workers
        devices *= workers
    return rules


def data_parallel_time(states: StateGraph, rules: list[LevelRules]) -> float:
    """Predicted data-parallel time per minibatch on all workers, seconds, level by level innermost first:
    ``t = (t + W(P / g, M)) / M`` from the model's compute time and (default mode) one optimizer step of the
    whole model (:func:`pipedream.planner.recurrence.step_s`, every worker steps all of it), with the level's
    weight sync ``W`` (:func:`pipedream.planner.recurrence.weight_sync_s`: a ring allreduce in default mode, the
    release's ``data_parallel_total_time`` in compat mode).
    """
    t = float(states.compute_s[-1])
    p = float(states.param_bytes[-1])
    if rules and rules[0].compat:  # the release counts a tied tensor once per user
        return data_parallel_total_time(t, p, [(lv.workers, lv.bandwidth_Bps, lv.group_init) for lv in rules])
    p = model_param_bytes(states)
    tensors = float(states.param_tensors[-1] - np.maximum(states.tied_users[:, -1] - 1.0, 0.0).sum())  # tied once
    t += float(step_s(rules[0], p, tensors, 0))
    for lv in rules:
        t = (t + float(weight_sync_s(lv, p, lv.workers, lv.group_init))) / lv.workers
    return t


def model_param_bytes(states: StateGraph) -> float:
    """The whole model's parameter bytes, each tied tensor once (what one data-parallel worker holds)."""
    return float(states.param_bytes[-1] - states.tied_bytes @ np.maximum(states.tied_users[:, -1] - 1.0, 0.0))


def solve(states: StateGraph, cluster: Cluster, rules: list[LevelRules], *, compat: bool) -> Solution:
    """Run the dynamic program level by level and expand the chosen splits into final stages.

    Raises:
        PipeDreamError: if no plan fits (memory limit) or a straight pipeline needs more stages than
            the model has states.
    """
    n = states.n
    if rules[0].straight and cluster.workers > n:
        raise PipeDreamError(f"a straight pipeline on {cluster.workers} workers needs {cluster.workers} stages but the "
                             f"model has only {n} split points (antichain states); use fewer workers or drop --straight")
    # The release lets a segment end at any state at or after its start; difference 5: only at states
    # that contain the segment's start state.
    table: np.ndarray | ComputeTable = ComputeTable(states.compute_s, None if compat else states.nested)
    boundary = states.boundary_bytes if compat else states.cut_bytes
    inputs: list[LevelInput] = []
    # The split candidates (k, j) per level: at the innermost level stage times are functions of the
    # cumulative values, so dominated splits are dropped; above it every ancestor is a candidate.
    # default mode counts a tied tensor once per segment (a segment's bytes then depend on how many of its users
    # the segment holds: their counts are keys too); the release counts it once per user (as if none were tied)
    tied_users, tied_bytes = (np.zeros((0, 0)), np.zeros(0)) if compat else (states.tied_users, states.tied_bytes)
    keys = [states.compute_s, states.param_bytes, *(() if compat else states.tied_users)]
    if rules[0].memory_limit_bytes is not None:
        keys.append(states.activation_bytes)
    if rules[0].comm_ratio is not None:
        keys.append(boundary)
    if rules[0].step is not None:
        keys.append(states.param_tensors)
    pairs = [undominated_pairs(states, keys)]
    if len(rules) > 1:
        pairs += [all_pairs(states)] * (len(rules) - 1)
    for idx, lv in enumerate(rules):
        inp = LevelInput(table, states.param_bytes, states.activation_bytes, boundary, states.ancestors, tied_users,
                         tied_bytes, tensors=states.param_tensors)
        inputs.append(inp)
        if idx == len(rules) - 1:
            break
        if idx == 0:
            table = solve_rows_banded(inp, lv, by_end(pairs[0], n), states.compute_s)
        else:
            table = solve_rows(inp, lv, by_end(pairs[idx], n))
    top = solve_row(inputs[-1], rules[-1], 0, pairs[-1])
    time_s = float(top.time[n - 1, -1])
    if not math.isfinite(time_s):
        raise PipeDreamError(_no_plan_message(states, cluster, rules))
    segments = [Segment(0, n - 1, 1, [])]
    for idx in range(len(rules) - 1, -1, -1):
        expanded = []
        for seg in segments:
            row = top if (idx == len(rules) - 1) else solve_row(inputs[idx], rules[idx], seg.start, pairs[idx])
            offset = 0
            for start, end, reps in _backtrack(row, seg.start, seg.end, rules[idx].workers):
                expanded.append(Segment(start, end, seg.replicas * reps, [reps, *seg.per_level], [offset, *seg.offsets]))
                offset += reps
        segments = expanded
    return Solution(time_s, data_parallel_time(states, rules), segments, rules)


def _backtrack(row: RowSolution, start: int, end: int, workers: int) -> list[tuple[int, int, int]]:
    """Stages ``(start_row, end_state, replicas)`` of the best plan for ``(start - 1, end]``."""
    out = []
    j, m = end, workers - 1
    while True:
        k, reps = row.choice(j, m)
        if k < 0:
            out.append((start, j, reps))
            break
        out.append((k + 1, j, reps))
        j, m = k, m - reps
    return out[::-1]


def _no_plan_message(states: StateGraph, cluster: Cluster, rules: list[LevelRules]) -> str:
    if rules[0].memory_limit_bytes is not None:
        params = model_param_bytes(states)
        need = params + float(states.activation_bytes[-1])
        return (f"no plan fits the memory limit of {cluster.device_memory_bytes:.4g} bytes per device on cluster "
                f"{cluster.name!r} (the model has {params:.4g} parameter bytes and {states.activation_bytes[-1]:.4g} "
                f"activation bytes, {need:.4g} in all); drop --memory-limit or use a cluster with more memory")
    return f"no feasible plan for cluster {cluster.name!r} ({cluster.workers} workers)"
