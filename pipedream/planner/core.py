"""``plan_pipeline``: profile + cluster -> :class:`pipedream.plan.Plan` (paper §3.1).

The solve itself is in :mod:`pipedream.planner.hierarchy`; this module turns the chosen state splits
into stages of graph nodes, places them on ranks (:mod:`pipedream.placement`) and fills in the
per-stage numbers shown to the user.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, replace

from pipedream import costmodel, memory, tied
from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph
from pipedream.placement import hierarchical_ranks
from pipedream.plan import Plan, Stage
from pipedream.planner.compat import data_parallel_communication_time, transfer_time
from pipedream.planner.hierarchy import Segment, Solution, data_parallel_time, level_rules, solve
from pipedream.planner.recurrence import step_s
from pipedream.planner.rerank import rerank as rerank_plans
from pipedream.planner.states import StateGraph, build_states
from pipedream.topology import Cluster


@dataclass(frozen=True)
class PlanOptions:
    """How :func:`plan_pipeline` plans: the mode and the flags of ``pipedream plan``.

    Attributes:
        memory_limit: reject stages that do not fit the device memory (:attr:`Cluster.device_memory_bytes`, bytes);
            None: on in default mode, off in compat mode, as the release's optimizer without
            ``--use_memory_constraint``.
        straight: one replica per stage (no data parallelism inside stages).
        compat: reproduce the release optimizer's predicted time exactly (see :mod:`pipedream.planner` for what
            default mode changes and why).
        activation_compression_ratio: divide activation transfer bytes by this (> 0, a ratio of bytes); None: 1 in
            default mode, no activation transfers in compat mode (the release without
            ``--activation_compression_ratio``).
        rerank: simulate the dynamic program's plans and other candidates and return the fastest in simulation, its
            estimate the simulated time (:mod:`pipedream.planner.rerank`); None: on in default mode. Off (always in
            compat mode) returns the dynamic program's plan and estimate.
    """

    memory_limit: bool | None = None
    straight: bool = False
    compat: bool = False
    activation_compression_ratio: float | None = None
    rerank: bool | None = None

    @property
    def checks_memory(self) -> bool:
        """:attr:`memory_limit` with its default resolved."""
        return not self.compat if self.memory_limit is None else self.memory_limit

    @property
    def reranks(self) -> bool:
        """:attr:`rerank` with its default resolved."""
        return not self.compat if self.rerank is None else self.rerank


def plan_pipeline(graph: LayerGraph, cluster: Cluster, *, model: str, minibatch_size: int,
                  options: PlanOptions | None = None, step: costmodel.StepRates | None = None) -> Plan:
    """Partition ``graph`` into replicated pipeline stages for ``cluster`` (paper §3.1).

    Tied parameters (:attr:`LayerGraph.tied`): the plan is for 1F1B, so it never has stages holding one tied
    tensor with different replica counts, which the runtime refuses (:func:`pipedream.tied.plan_conflict`):
    the re-ranking drops such candidates, and without it a refused solver plan gives way to the faster of the
    solver's straight pipeline and data parallelism (:func:`_runnable_solver_plan`).

    Args:
        graph: the layer profile; times are seconds per profiled minibatch, sizes bytes.
        cluster: levels innermost first, bandwidths in bytes/s, device memory in bytes.
        model: model name recorded in the plan.
        minibatch_size: samples in the profiled minibatch (times per sample divide by it).
        options: the mode and flags (:class:`PlanOptions`; None: its defaults, default mode).
        step: how an optimizer step is priced, in the dynamic program (default mode) and in the re-ranking's
            simulation alike: the run's optimizer and, where the profile measured them, its seconds per byte,
            tensor and call (:func:`pipedream.sim.profiled.step_rates`); None: :class:`pipedream.costmodel.StepRates`'s
            defaults (SGD, memory-bound at a V100's bandwidth). Compat mode charges no step, as the release.
    Returns:
        the plan: stages in pipeline order with nodes in topological order, ranks, predicted time per
        sample (seconds) and predicted data-parallel time per sample on all workers (seconds).
    Raises:
        PipeDreamError: on a bad minibatch size or ratio, a node without times, a cycle, a memory limit
            that no plan fits, a straight pipeline longer than the model, or no plan the runtime can run
            (tied parameters) that fits.
    """
    options = options or PlanOptions()
    if options.reranks and options.compat:
        raise PipeDreamError("compat mode reproduces the release's optimizer, which does not re-rank; drop rerank")
    step = step or costmodel.StepRates()
    if not options.reranks:
        return _runnable_solver_plan(graph, cluster, model=model, minibatch_size=minibatch_size, options=options, step=step)
    straight, memory_limit = options.straight, options.checks_memory
    solver_plans: list[tuple[str, Plan]] = []
    # the dynamic program's answers to the flags, without the memory limit and straight; and to the flags under
    # §3.1's own cost model, without the optimizer step (a more faithful candidate generator can simulate slower)
    variants = [(straight, memory_limit, True), (straight, memory_limit, False), (straight, False, True),
                (True, memory_limit, True)]
    errors = []
    for st, mem, stepped in dict.fromkeys(variants):
        if straight and not st:
            continue
        try:
            label = f"solver{' straight' if st else ''}{'' if mem else ', no memory limit'}"
            solver_step = step if stepped else costmodel.StepRates(step.optimizer, memory_Bps=None)
            solver_plans.append((label if stepped else f"{label}, no optimizer step (§3.1)",
                                 _solver_plan(graph, cluster, model=model, minibatch_size=minibatch_size,
                                              options=replace(options, straight=st, memory_limit=mem), step=solver_step)))
        except PipeDreamError as e:  # e.g. a straight pipeline longer than the model, or nothing fits
            errors.append(e)
    if not solver_plans:
        raise errors[0]
    return rerank_plans(graph, cluster, solver_plans, model=model, minibatch_size=minibatch_size,
                        memory_limit=memory_limit, straight=straight, step=step)


def _runnable_solver_plan(graph: LayerGraph, cluster: Cluster, *, model: str, minibatch_size: int, options: PlanOptions,
                          step: costmodel.StepRates) -> Plan:
    """The dynamic program's plan (:func:`_solver_plan`) if the runtime runs it under 1F1B; else, since the dynamic
    program does not model the rule for tied parameters (:func:`pipedream.tied.plan_conflict`), the faster by
    the solver's estimate of its straight pipeline and data parallelism, which never break it.

    Raises:
        PipeDreamError: those of :func:`_solver_plan`, or the plan is refused and neither alternative exists or
            fits (naming the rule it breaks).
    """
    plan = _solver_plan(graph, cluster, model=model, minibatch_size=minibatch_size, options=options, step=step)
    why = tied.plan_conflict(graph.tied, [s.nodes for s in plan.stages], [s.replicas for s in plan.stages])
    if why is None:
        return plan
    alternatives = []
    for opts, data_parallel in ((replace(options, straight=True), False), (options, True)):
        with contextlib.suppress(PipeDreamError):  # a straight pipeline longer than the model, or nothing fits
            alternatives.append(_solver_plan(graph, cluster, model=model, minibatch_size=minibatch_size, options=opts,
                                             step=step, data_parallel=data_parallel))
    if not alternatives:
        raise PipeDreamError(f"the dynamic program's plan {plan.config} cannot run: {why}; neither a straight pipeline "
                             "nor data parallelism fits this cluster: plan with the re-ranking (the default mode)")
    best = min(alternatives, key=lambda p: p.time_per_sample_s)
    best.extra.setdefault("warnings", []).append(
        f"the dynamic program's plan {plan.config} was refused ({why}); this is the faster of its straight pipeline "
        "and data parallelism")
    return best


def _solver_plan(graph: LayerGraph, cluster: Cluster, *, model: str, minibatch_size: int, options: PlanOptions,
                 step: costmodel.StepRates, data_parallel: bool = False) -> Plan:
    """The dynamic program's plan and estimate (see :func:`plan_pipeline`); with ``data_parallel``, its data
    parallelism (one stage on every worker, its estimate the solver's data-parallel time).

    Raises:
        PipeDreamError: see :func:`plan_pipeline`; with ``data_parallel`` and the memory limit, also when the
            whole model does not fit one device.
    """
    memory_limit, straight, compat = options.checks_memory, options.straight, options.compat
    activation_compression_ratio = options.activation_compression_ratio
    if not isinstance(minibatch_size, int) or minibatch_size < 1:
        raise PipeDreamError(f"minibatch size {minibatch_size!r} must be a positive integer (samples per profiled minibatch)")
    if activation_compression_ratio is not None and not activation_compression_ratio > 0:
        raise PipeDreamError(f"activation compression ratio {activation_compression_ratio!r} must be > 0")
    states = build_states(graph)
    rules = level_rules(cluster, compat=compat, memory_limit=memory_limit, straight=straight, ratio=activation_compression_ratio,
                        step=step)
    if data_parallel:
        dp_s = data_parallel_time(states, rules)
        whole = Segment(0, states.n - 1, cluster.workers, [w for w, _ in cluster.levels], [0] * len(cluster.levels))
        solution = Solution(dp_s, dp_s, [whole], rules)
    else:
        solution = solve(states, cluster, rules, compat=compat)
    stages, details = _stages(graph, states, solution, cluster)
    if data_parallel and memory_limit and stages[0].memory_bytes > cluster.device_memory_bytes:
        raise PipeDreamError(f"data parallelism needs {memory.format_bytes(stages[0].memory_bytes)} per device, more "
                             f"than the {memory.format_bytes(cluster.device_memory_bytes)} of {cluster.name}")
    extra = {"mode": "compat" if compat else "default", "memory_limit": memory_limit, "straight": straight,
             "activation_compression_ratio": activation_compression_ratio, "optimizer": step.optimizer,
             "device_memory_bytes": cluster.device_memory_bytes, "levels": [list(lv) for lv in cluster.levels],
             "states": states.n, "bottleneck_time_per_minibatch_s": solution.time_s,
             "dp_time_per_minibatch_s": solution.dp_time_s,
             "replicas_per_level": [seg.per_level for seg in solution.segments],
             "offsets_per_level": [seg.offsets for seg in solution.segments], "stage_details": details}
    plan = Plan(model=model, cluster=cluster.name, workers=cluster.workers, stages=stages, minibatch_size=minibatch_size,
                time_per_sample_s=solution.time_s / minibatch_size,
                dp_time_per_sample_s=solution.dp_time_s / minibatch_size, extra=extra)
    slowest = max(s.compute_s / s.replicas for s in stages)
    if slowest > solution.time_s * (1 + 1e-9):
        plan.extra["warnings"] = [
            f"a stage of this plan computes for {slowest * 1e3:.3f} ms per minibatch per replica, more than the "
            f"predicted bottleneck of {solution.time_s * 1e3:.3f} ms: the release's model (--compat) split a "
            "segment at a state that does not contain its start (see pipedream/planner/__init__.py, difference 5)"
        ]
    empty = [i for i, s in enumerate(stages) if not s.nodes]
    if empty:  # the release's model only (difference 5): report it, the runtime cannot run it
        plan.extra.setdefault("warnings", []).append(
            f"stage(s) {empty} of this plan have no layers (the release's model, --compat, split a segment at a state "
            "that does not contain its start): it cannot be run; plan without --compat")
    plan.validate(allow_empty_stages=compat)
    return plan


def _stages(graph: LayerGraph, states: StateGraph, solution: Solution,
            cluster: Cluster) -> tuple[list[Stage], list[dict[str, float]]]:
    """Graph nodes per stage (the first stage whose end state contains a node gets it, the release's rule),
    and per stage the parts of its cost: ``sync_s``, ``activation_s``, ``step_s`` (one optimizer step of a replica, as
    the dynamic program charges it: :func:`pipedream.planner.recurrence.step_s`, with the stashing of the innermost
    level's recurrence), ``param_bytes``, ``time_s``."""
    stage_of: dict[str, int] = {}
    taken = 0
    for idx, seg in enumerate(solution.segments):
        fresh = states.ideals[seg.end] & ~taken
        taken |= states.ideals[seg.end]
        for b, node_id in enumerate(states.node_ids):
            if (fresh >> b) & 1:
                stage_of[node_id] = idx
    last = len(solution.segments) - 1
    for node_id in states.node_ids:
        stage_of.setdefault(node_id, last)
    for node_id in states.dropped_inputs:
        stage_of[node_id] = 0
    order = graph.topological_order()
    for node_id in order:
        if node_id in states.dropped_sinks:
            stage_of[node_id] = max((stage_of[p] for p in graph.predecessors(node_id)), default=last)
    out: list[Stage] = []
    details: list[dict[str, float]] = []
    placement = hierarchical_ranks([seg.per_level for seg in solution.segments],
                                   [seg.offsets for seg in solution.segments], cluster)
    members = [[n for n in order if stage_of[n] == idx] for idx in range(len(solution.segments))]
    need = memory.plan_memory(graph, members, [seg.replicas for seg in solution.segments])
    for idx, seg in enumerate(solution.segments):
        nodes = members[idx]
        compute = sum(graph.nodes[n].fwd_s + graph.nodes[n].bwd_s for n in nodes if not graph.nodes[n].is_input)
        params = graph.param_bytes_of(nodes)  # a tied tensor once per stage, in each stage holding a user
        sync, act = _comm_s(states, solution, idx, params, cluster)
        inner = seg.per_level[0]  # replicas in the innermost level's group; downstream of it there: versions
        versions = math.ceil((cluster.levels[0][0] - seg.offsets[0] - inner) / inner)
        step = float(step_s(solution.level_rules[0], params, graph.param_tensors_of(nodes), versions))
        out.append(Stage(nodes=nodes, replicas=seg.replicas, ranks=placement[idx], compute_s=compute,
                         comm_s=sync + act, memory_bytes=need[idx].total))
        details.append({"sync_s": sync, "activation_s": act, "step_s": step, "param_bytes": params,
                        "time_s": max(compute + step + sync, act) / seg.replicas})
    return out, details


def _comm_s(states: StateGraph, solution: Solution, idx: int, params: float, cluster: Cluster) -> tuple[float, float]:
    """Communication of stage ``idx`` per minibatch on one replica, seconds: the weight sync at every level
    where the stage is replicated (§3.1's W) and sending its boundary activations and receiving their
    gradients (§3.1's C, at the bandwidth of the level the boundary crosses).

    Default mode: per level ``l``, a ring allreduce of ``P / g_l`` bytes over the stage's ``r_l`` groups
    (``g_l`` devices per group, as the recurrence charges it) and ``2 (latency + a / B)`` per boundary, both
    from :mod:`pipedream.costmodel` with the cluster's latency. Compat mode: the release's ``4 (r - 1) P / (B r)``
    per level and ``2 a / B`` per boundary (:mod:`pipedream.planner.compat`)."""
    seg: Segment = solution.segments[idx]
    segs = solution.segments
    compat = solution.level_rules[0].compat
    latency = cluster.latency_s
    sync = 0.0
    devices = 1
    for r, (workers, bw) in zip(seg.per_level, cluster.levels, strict=False):
        if r > 1:
            sync += float(data_parallel_communication_time(params, r, bw) if compat
                          else costmodel.ring_allreduce_s(params / devices, r, bw, latency))
        devices *= workers
    bounds = []
    if idx > 0:
        bounds.append((float(states.cut_bytes[segs[idx - 1].end]), _link_bandwidth(segs[idx - 1], seg, cluster)))
    if idx < len(segs) - 1:
        bounds.append((float(states.cut_bytes[seg.end]), _link_bandwidth(seg, segs[idx + 1], cluster)))
    act = sum(float(transfer_time(a, 1, bw, 1.0)) if compat else 2.0 * costmodel.transfer_s(a, bw, latency)
              for a, bw in bounds)
    return sync, act


def _link_bandwidth(a: Segment, b: Segment, cluster: Cluster) -> float:
    """Bandwidth between two consecutive stages: that of the outermost level at which they differ."""
    differ = [lv for lv in range(len(cluster.levels)) if a.offsets[lv] != b.offsets[lv]]
    return cluster.levels[max(differ, default=0)][1]

