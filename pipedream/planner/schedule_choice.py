"""The plan ``pipedream plan --schedule`` writes: the fastest fitting of every schedule's best
(:func:`pipedream.planner.schedule_search.search`) and PipeDream's own plan, with every schedule's best in
``extra["schedules"]`` (:func:`to_plan`, :func:`format_schedules`)."""

from __future__ import annotations

import math
from typing import Any

from pipedream import costmodel, memory
from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph
from pipedream.plan import Plan, Stage
from pipedream.planner.core import PlanOptions, plan_pipeline
from pipedream.planner.schedule_search import Option, SearchSettings
from pipedream.topology import Cluster

RERANK_WORKERS = 16  # up to this many workers, auto weighs PipeDream's re-ranked (simulated) plan (pipedream_plan)


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
