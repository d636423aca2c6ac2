"""Default mode's last step: simulate candidate plans and keep the fastest (what the runtime runs).

The dynamic program (:mod:`.hierarchy`) optimises §3.1's cost model; the runtime runs 1F1B-RR with the consistent
warm-up, replicas synchronised in lockstep by a ring allreduce overlapped with the backward, and links shared. On
the paper's models that gap decides the plan, so the candidates (the solver's plans with and without a straight
pipeline, the memory limit and the optimizer step; :mod:`.fixed_split`'s split of their replica vectors; the
paper's shapes; every split where the model and cluster are small, :func:`every_split`) that fit the device
(:func:`runtime_memory_bytes`) and that the runtime accepts (:func:`pipedream.tied.plan_conflict`) are simulated
as ``pipedream simulate`` simulates a written plan, in order of a lower bound on their epoch
(:func:`compute_bound_s`), and the fastest wins; within :data:`NEAR_TIE` of it, the one with the fewest stages.
The plan's estimate is the simulated epoch; the solver's stays in ``extra["solver_estimate"]``. The rules and
their reasons: docs/planner.md.
"""

from __future__ import annotations

import copy
import itertools
import math
from dataclasses import dataclass
from typing import Any

from pipedream import costmodel, memory, tied
from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph
from pipedream.placement import replica_ranks
from pipedream.plan import Plan, Stage, config_string
from pipedream.planner.fixed_split import split_for_replicas
from pipedream.sim import DEFAULT_ALLREDUCE, IMAGENET_TRAIN_SAMPLES, SimOptions, SimResult, simulate_dp, simulate_plan
from pipedream.sim.costs import stage_costs
from pipedream.sim.network import Network
from pipedream.topology import Cluster

PAPER_SHAPES = 3  # "W-1-1", up to this many single stages after one replicated stage
NEAR_TIE = 0.02  # relative epoch-time margin within which the plan with fewer stages wins (step 4)
EVERY_SPLIT_LIMIT = 256  # at most this many (split, replica vector) pairs: all are candidates (step 1)


@dataclass
class Candidate:
    """One plan the re-ranking considered.

    Attributes:
        plan: the plan (stages, ranks, placement).
        source: where it came from, e.g. ``"solver"``, ``"solver straight"``, ``"split 15-1"``.
        memory_bytes: per stage, what one replica needs (:func:`runtime_memory_bytes`).
        fits: every stage fits the device memory (always True without the memory limit).
        epoch_s: simulated epoch time (None if not simulated).
        time_per_minibatch_s: simulated steady-state time per minibatch (None if not simulated).
        bound_s: a lower bound on its epoch (:func:`compute_bound_s`), seconds.
        refused: why the runtime would refuse it (:func:`pipedream.tied.plan_conflict`), or None.
    """

    plan: Plan
    source: str
    memory_bytes: list[float]
    fits: bool
    epoch_s: float | None = None
    time_per_minibatch_s: float | None = None
    bound_s: float = 0.0
    refused: str | None = None

    def summary(self) -> dict[str, Any]:
        """JSON-ready record for ``plan.extra["candidates"]``."""
        return {"config": self.plan.config, "source": self.source, "fits": self.fits,
                "peak_memory_bytes": max(self.memory_bytes), "epoch_lower_bound_s": self.bound_s,
                "simulated_epoch_s": self.epoch_s, **({"refused": self.refused} if self.refused else {})}


def compute_bound_s(graph: LayerGraph, plan: Plan, dataset_size: int) -> float:
    """A lower bound on the simulated epoch of ``plan``: every replica of a stage runs the forward and
    backward of one in ``replicas`` minibatches, so the epoch takes at least the busiest replica's compute."""
    minibatches = math.ceil(dataset_size / plan.minibatch_size)
    per_mb = max(sum(graph.nodes[n].fwd_s + graph.nodes[n].bwd_s for n in s.nodes if not graph.nodes[n].is_input)
                 / s.replicas for s in plan.stages)
    return minibatches * per_mb


def simulation_options(dataset_size: int | None = None, step: costmodel.StepRates | None = None) -> SimOptions:
    """What the re-ranking simulates with: the defaults of ``pipedream simulate`` and of the runtime (1F1B, the
    ring allreduce, overlap, the consistent warm-up), and the optimizer step the dynamic program charges (``step``;
    None: :class:`pipedream.costmodel.StepRates`'s defaults)."""
    return SimOptions(dataset_size=dataset_size or IMAGENET_TRAIN_SAMPLES, step=step or costmodel.StepRates())


def runtime_memory_bytes(graph: LayerGraph, stages: list[list[str]], replicas: list[int]) -> list[float]:
    """Bytes one replica of each stage needs under 1F1B-RR with weight stashing and SGD with momentum:
    the total of the one memory model, :func:`pipedream.memory.plan_memory`."""
    return [m.total for m in memory.plan_memory(graph, stages, replicas)]


def _split_plan(graph: LayerGraph, cluster: Cluster, replicas: list[int], model: str, minibatch_size: int,
                step: costmodel.StepRates | None = None) -> Plan | None:
    """A plan of :mod:`.fixed_split` for ``replicas``, placed by :func:`.placement.replica_ranks` (copies of
    the pipeline on whole servers where the replica counts allow, else consecutive ranks), or None if it
    cannot be split."""
    non_input = sum(1 for n in graph.nodes.values() if not n.is_input)
    if len(replicas) > non_input:
        return None
    ranks = replica_ranks(replicas, cluster)
    nodes = split_for_replicas(graph, replicas, Network(cluster, DEFAULT_ALLREDUCE), minibatch_size, ranks, step)
    stages = [Stage(nodes=ns, replicas=r, ranks=rk) for ns, r, rk in zip(nodes, replicas, ranks, strict=True)]
    return Plan(model=model, cluster=cluster.name, workers=sum(replicas), stages=stages, minibatch_size=minibatch_size,
                time_per_sample_s=math.nan, dp_time_per_sample_s=math.nan)


def paper_shapes(workers: int, layers: int) -> list[list[int]]:
    """Replica vectors of the paper's Table 1 shapes for ``workers``: data parallelism, ``W-1-1..`` with
    up to :data:`PAPER_SHAPES` single stages, and a straight pipeline (if the model has enough layers)."""
    shapes = [[workers]]
    shapes += [[workers - k] + [1] * k for k in range(1, PAPER_SHAPES + 1) if workers - k >= 1 and k + 1 <= layers]
    if 1 < workers <= layers:
        shapes.append([1] * workers)
    return shapes


def _vectors(workers: int, stages: int, straight: bool) -> list[list[int]]:
    """Replica vectors of ``stages`` stages on ``workers`` workers (each at least 1; all 1 if ``straight``)."""
    if straight:
        return [[1] * stages] if stages == workers else []
    return [[b - a for a, b in zip((0, *bars), (*bars, workers), strict=True)]
            for bars in itertools.combinations(range(1, workers), stages - 1)]


def every_split(graph: LayerGraph, cluster: Cluster, *, model: str, minibatch_size: int,
                straight: bool) -> list[tuple[str, Plan]]:
    """Every split of the layers' topological order into contiguous stages with every replica vector,
    placed by :func:`.placement.replica_ranks`, if there are at most :data:`EVERY_SPLIT_LIMIT` (else none).

    On a small model and cluster the solver's cost model and the fixed splitter's balance can both miss the
    split that simulates fastest (by a third on random 4-6 layer chains on 4 workers,
    ``tests/test_planner_rerank.py``); simulating all of them costs little there. On a chain these are all
    the splits; on a DAG, those of one topological order.
    """
    layers = [n for n in graph.topological_order() if not graph.nodes[n].is_input]
    workers, n = cluster.workers, len(layers)
    shapes = [(k, _vectors(workers, k, straight)) for k in range(1, min(workers, n) + 1)]
    if sum(math.comb(n - 1, k - 1) * len(vs) for k, vs in shapes) > EVERY_SPLIT_LIMIT:
        return []
    out = []
    for k, vectors in shapes:
        placed = [(reps, replica_ranks(reps, cluster)) for reps in vectors]
        for cuts in itertools.combinations(range(1, n), k - 1):
            bounds = (0, *cuts, n)
            nodes = [layers[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
            for reps, ranks in placed:
                stages = [Stage(nodes=ns, replicas=r, ranks=list(rk))
                          for ns, r, rk in zip(nodes, reps, ranks, strict=True)]
                plan = Plan(model=model, cluster=cluster.name, workers=workers, stages=stages,
                            minibatch_size=minibatch_size, time_per_sample_s=math.nan, dp_time_per_sample_s=math.nan)
                out.append((f"every split: {config_string(reps)} after layers {list(cuts)}", plan))
    return out


def candidates(graph: LayerGraph, cluster: Cluster, solver_plans: list[tuple[str, Plan]], *, model: str,
               minibatch_size: int, straight: bool, step: costmodel.StepRates | None = None) -> list[tuple[str, Plan]]:
    """The solver's plans, :mod:`.fixed_split`'s split of each of their replica vectors and of the paper's
    shapes (straight ones only if ``straight``), and, when there are at most :data:`EVERY_SPLIT_LIMIT` of
    them, every split and replica vector (:func:`every_split`); without duplicates, in that order."""
    layers = sum(1 for n in graph.nodes.values() if not n.is_input)
    vectors = [[s.replicas for s in p.stages] for _, p in solver_plans]
    vectors += [v for v in paper_shapes(cluster.workers, layers) if not straight or all(r == 1 for r in v)]
    out = list(solver_plans)
    for reps in vectors:
        plan = _split_plan(graph, cluster, reps, model, minibatch_size, step)
        if plan is not None:
            out.append((f"split {config_string(reps)}", plan))
    out += every_split(graph, cluster, model=model, minibatch_size=minibatch_size, straight=straight)
    seen: set[tuple[Any, ...]] = set()
    unique = []
    for source, plan in out:
        key = tuple((tuple(s.nodes), tuple(s.ranks)) for s in plan.stages)
        if key not in seen:
            seen.add(key)
            unique.append((source, plan))
    return unique


def rerank(graph: LayerGraph, cluster: Cluster, solver_plans: list[tuple[str, Plan]], *, model: str, minibatch_size: int,
           memory_limit: bool, straight: bool, step: costmodel.StepRates | None = None) -> Plan:
    """Simulate every candidate (see the module docstring) and return the fastest, its estimate the simulation.

    Args:
        graph: the profile, times per minibatch of ``minibatch_size`` samples.
        cluster: the cluster (device memory for the limit).
        solver_plans: ``(source, plan)`` from the dynamic program, the first being the solver's answer to the flags.
        model, minibatch_size: recorded in the plan; the simulated batch.
        memory_limit: drop candidates with a stage that does not fit ``cluster.device_memory_bytes``.
        straight: only straight pipelines.
        step: the optimizer step the simulation charges (:func:`simulation_options`).
    Raises:
        PipeDreamError: with the memory limit, no candidate fits; or every candidate that fits is one the runtime
            refuses (tied parameters on stages with different replica counts).
    """
    g = graph
    if g.minibatch_size != minibatch_size:
        g = copy.copy(graph)
        g.minibatch_size = minibatch_size
    step = step or costmodel.StepRates()
    opts = simulation_options(step=step)
    device = cluster.device_memory_bytes
    limit = max(device, runtime_memory_bytes(g, [list(g.nodes)], [1])[0])
    cands, exact_bytes = [], []  # per candidate, per stage: weights, gradients, optimizer state
    for source, plan in candidates(g, cluster, solver_plans, model=model, minibatch_size=minibatch_size, straight=straight,
                                   step=step):
        need = memory.plan_memory(g, [s.nodes for s in plan.stages], [s.replicas for s in plan.stages])
        # weights, gradients and optimizer state are exact: a hard limit at the device's memory
        exact = [m.weights + m.gradients + m.optimizer for m in need]
        fits = not memory_limit or (max(m.total for m in need) <= limit and max(exact) <= device)
        refused = tied.plan_conflict(g.tied, [s.nodes for s in plan.stages], [s.replicas for s in plan.stages])
        cands.append(Candidate(plan, source, [m.total for m in need], fits,
                               bound_s=compute_bound_s(g, plan, opts.dataset_size), refused=refused))
        exact_bytes.append(exact)
    fitting = sorted((c for c in cands if c.fits and c.refused is None), key=lambda c: c.bound_s)
    if not fitting and any(c.fits for c in cands):
        why = next(c.refused for c in cands if c.fits)
        raise PipeDreamError(f"no plan that fits {cluster.name} can run under 1F1B: every one that fits is refused, "
                             f"e.g. {why}")
    if not fitting:
        runnable = [i for i, c in enumerate(cands) if c.refused is None] or list(range(len(cands)))
        over = all(max(exact_bytes[i]) > device for i in runnable)  # then name the one whose exact bytes are smallest
        k = min(runnable, key=lambda i: max(exact_bytes[i]) if over else max(cands[i].memory_bytes))
        least, worst = cands[k], max(range(len(exact_bytes[k])), key=lambda s: exact_bytes[k][s])
        if over:
            raise PipeDreamError(
                f"no plan fits {memory.format_bytes(device)} per device of {cluster.name}: even in the smallest "
                f"candidate, {least.plan.config}, stage {worst} holds {memory.format_bytes(exact_bytes[k][worst])} of weights, "
                "gradients and optimizer state; use a cluster with more memory or more workers")
        raise PipeDreamError(f"no plan fits {memory.format_bytes(limit)} per device: the smallest candidate, "
                             f"{least.plan.config}, needs {memory.format_bytes(max(least.memory_bytes))} on one device; use a "
                             "cluster with more memory or more workers, a smaller minibatch, or drop the memory limit")
    fastest = math.inf
    for c in fitting:
        if c.bound_s >= fastest * (1 + NEAR_TIE):
            continue
        res = simulate_plan(g, c.plan, cluster, opts)
        c.epoch_s, c.time_per_minibatch_s = res.epoch_time_s, res.time_per_minibatch_s
        fastest = min(fastest, c.epoch_s)
    near = [c for c in fitting if c.epoch_s is not None and c.epoch_s <= fastest * (1 + NEAR_TIE)]
    best = min(near, key=lambda c: (len(c.plan.stages), c.epoch_s))
    dp = simulate_dp(g, cluster, opts, workers=best.plan.workers)
    return _finish(g, cluster, best, dp, cands, solver_plans[0][1], opts, memory_limit=memory_limit, straight=straight,
                   limit=limit)


def _finish(graph: LayerGraph, cluster: Cluster, best: Candidate, dp: SimResult,  # noqa: PLR0913 (private)
            cands: list[Candidate], solver_answer: Plan, opts: SimOptions, *,
            memory_limit: bool, straight: bool, limit: float) -> Plan:
    """The chosen plan with the simulated estimate, the simulator's per-stage cost terms and the record of
    what was considered."""
    plan = copy.deepcopy(best.plan)
    step = opts.step or costmodel.StepRates()  # simulation_options sets it
    samples = opts.dataset_size
    assert best.epoch_s is not None and best.time_per_minibatch_s is not None
    plan.time_per_sample_s = best.epoch_s / samples
    plan.dp_time_per_sample_s = dp.epoch_time_s / samples
    net = Network(cluster, opts.allreduce)
    latency = cluster.latency_s
    ranks = [s.ranks for s in plan.stages]
    cow = memory.copies_on_write("1f1b", [s.replicas for s in plan.stages], 1, opts.warmup)
    costs = stage_costs(graph, [s.nodes for s in plan.stages], plan.minibatch_size, copies_on_write=cow, step=step)
    details = []
    for i, (stage, cost) in enumerate(zip(plan.stages, costs, strict=True)):
        # a flat ring over the stage's ranks at its slowest link (DEFAULT_ALLREDUCE), one transfer each way per boundary
        ring_bw = min((net.path(ranks[i][0], r)[1] for r in ranks[i][1:]), default=math.inf)
        sync = costmodel.ring_allreduce_s(cost.param_bytes, stage.replicas, ring_bw, latency)
        act = 0.0
        if i > 0:
            act += 2 * costmodel.transfer_s(costs[i - 1].send_fwd_bytes, net.path(ranks[i - 1][0], ranks[i][0])[1], latency)
        if i < len(plan.stages) - 1:
            act += 2 * costmodel.transfer_s(cost.send_fwd_bytes, net.path(ranks[i][0], ranks[i + 1][0])[1], latency)
        stage.compute_s = cost.fwd_s + cost.bwd_s
        stage.comm_s = sync + act
        stage.memory_bytes = best.memory_bytes[i]
        details.append({"sync_s": sync, "activation_s": act, "step_s": cost.step_s, "param_bytes": cost.param_bytes,
                        "time_s": max(stage.compute_s + cost.step_s + sync, act) / stage.replicas})
    ex = plan.extra
    if not best.source.startswith("solver"):  # a fixed split: the solver's per-level record does not describe it
        for key in ("replicas_per_level", "offsets_per_level", "warnings"):
            ex.pop(key, None)
    ex.update({
        "mode": "default",
        "memory_limit": memory_limit,
        "straight": straight,
        "optimizer": step.optimizer,
        "device_memory_bytes": cluster.device_memory_bytes,
        "memory_limit_bytes": limit if memory_limit else None,
        "levels": [list(lv) for lv in cluster.levels],
        "estimate": "simulated",
        "source": best.source,
        "simulation": {"schedule": "1f1b", "allreduce": opts.allreduce, "warmup": opts.warmup, "overlap": opts.overlap,
                       "dataset_size": opts.dataset_size, **step.record()},
        "bottleneck_time_per_minibatch_s": best.time_per_minibatch_s,
        "dp_time_per_minibatch_s": dp.time_per_minibatch_s,
        "simulated_epoch_s": best.epoch_s,
        "simulated_dp_epoch_s": dp.epoch_time_s,
        "stage_details": details,
        "solver_estimate": {"config": solver_answer.config, "time_per_sample_s": solver_answer.time_per_sample_s,
                        "dp_time_per_sample_s": solver_answer.dp_time_per_sample_s,
                        "bottleneck_time_per_minibatch_s": solver_answer.extra.get("bottleneck_time_per_minibatch_s")},
        "candidates": [c.summary() for c in cands],
    })
    for key in ("states", "activation_compression_ratio"):
        ex.setdefault(key, solver_answer.extra.get(key))
    if memory_limit and limit > cluster.device_memory_bytes:
        ex.setdefault("warnings", []).append(
            f"by the profile's bytes, data parallelism needs {limit / 1e9:.3g} GB per device, more than the "
            f"{cluster.device_memory_bytes / 1e9:g} GB of {cluster.name}; the profile's activation bytes overcount what "
            "PyTorch keeps, so stages were checked against that need instead (pipedream/planner/rerank.py)")
    plan.validate()
    return plan
