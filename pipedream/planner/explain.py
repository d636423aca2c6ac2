"""What ``pipedream plan`` prints: the stage table (:func:`format_plan`) and, with ``--explain``, why the
chosen split won, in words (:func:`explain`).

The numbers are those of the plan (:attr:`pipedream.plan.Plan.extra` ``stage_details``): per stage its
share of the compute and of the weights, its replicas, its weight synchronisation (§3.1's ``W``),
activation transfers (§3.1's ``C``) and optimizer step, compared with data parallelism and with a straight
pipeline.
"""

from __future__ import annotations

import math

from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph
from pipedream.plan import Plan
from pipedream.topology import Cluster


def _ranks(ranks: list[int]) -> str:
    if ranks and ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(str(r) for r in ranks)


def _nodes(nodes: list[str]) -> str:
    if len(nodes) <= 3:
        return " ".join(nodes)
    return f"{nodes[0]} .. {nodes[-1]} ({len(nodes)})"


def format_plan(plan: Plan) -> str:
    """The plan as a table: config, one row per stage, predicted times and speedup over DP."""
    ex = plan.extra
    lines = [
        f"model {plan.model} on cluster {plan.cluster} ({plan.workers} workers), {ex.get('mode', 'default')} mode"
        + (", memory limit" if ex.get("memory_limit") else "")
        + (", straight" if ex.get("straight") else "")
        + (f", activation compression {ex['activation_compression_ratio']:g}" if ex.get("activation_compression_ratio") else ""),
        f"config {plan.config}  ({len(plan.stages)} stage{'s' if len(plan.stages) != 1 else ''}, "
        f"{ex.get('states', '?')} antichain states, minibatch {plan.minibatch_size})",
        "",
        f"{'stage':>5}  {'layers':<28} {'replicas':>8}  {'ranks':<14} {'compute ms':>10} {'comm ms':>9} {'memory GB':>9}",
    ]
    lines += [f"{i:>5}  {_nodes(s.nodes):<28} {s.replicas:>8}  {_ranks(s.ranks):<14} {s.compute_s * 1e3:>10.3f} "
              f"{s.comm_s * 1e3:>9.3f} {s.memory_bytes / 1e9:>9.3f}" for i, s in enumerate(plan.stages)]
    bottleneck_ms = ex.get("bottleneck_time_per_minibatch_s", 0.0) * 1e3
    how = (f"simulated: epoch / samples, {bottleneck_ms:.3f} ms per minibatch in steady state"
           if ex.get("estimate") == "simulated" else f"bottleneck {bottleneck_ms:.3f} ms per minibatch")
    lines += [
        "",
        f"predicted time per sample      {plan.time_per_sample_s * 1e6:12.3f} us  ({how})",
        f"predicted DP time per sample   {plan.dp_time_per_sample_s * 1e6:12.3f} us  "
        f"(data parallelism on all {plan.workers} workers)",
        f"predicted speedup over DP      {plan.predicted_speedup:12.3f} x",
    ]
    solver_est = ex.get("solver_estimate")
    if solver_est:
        lines.append(f"the dynamic program chose {solver_est['config']}, estimated by its own cost model at "
                     f"{solver_est['dp_time_per_sample_s'] / solver_est['time_per_sample_s']:.3f} x; "
                     f"{sum(1 for c in ex.get('candidates', []) if c.get('simulated_epoch_s'))} candidates simulated "
                     f"(pipedream/planner/rerank.py)")
    if len(ex.get("levels", [])) > 1 and any(s.ranks != sorted(s.ranks) for s in plan.stages):
        lines.append("placement across servers (stage: ranks in round-robin order, replica i takes the minibatches "
                     "m with m % replicas == i): " + "; ".join(f"{i}: {_ranks(s.ranks)}" for i, s in enumerate(plan.stages)))
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def _layers(nodes: list[str]) -> str:
    return nodes[0] if len(nodes) == 1 else f"{nodes[0]}..{nodes[-1]} ({len(nodes)} layers)"


def _levels(plan: Plan, cluster: Cluster) -> str | None:
    """How the hierarchy split the work: the top level's segments and the split inside their groups."""
    per_level = plan.extra.get("replicas_per_level") or []
    offsets = plan.extra.get("offsets_per_level") or []
    if len(cluster.levels) < 2 or not per_level or len(offsets) != len(per_level):
        return None
    segments: list[tuple[int, list[int]]] = []  # (groups at the top level, inner replicas of its stages)
    previous = None
    for reps, offs in zip(per_level, offsets, strict=True):
        if offs[-1] != previous:
            segments.append((reps[-1], []))
        previous = offs[-1]
        segments[-1][1].append(math.prod(reps[:-1]))  # replicas inside one top-level group
    groups, width = cluster.levels[-1][0], cluster.workers // cluster.levels[-1][0]
    if len(segments) == 1:
        inner = "-".join(map(str, segments[0][1]))
        return (f"The top level does not split the model: each of the {groups} groups of {width} workers runs the same "
                f"{inner} pipeline and the groups are data-parallel.")
    parts = "; ".join(f"{g} group{'s' if g > 1 else ''} running {'-'.join(map(str, inner))}" for g, inner in segments)
    return f"The top level split the model into {len(segments)} segments over its {groups} groups of {width} workers: {parts}."


def _straight(plan: Plan, graph: LayerGraph, cluster: Cluster) -> Plan | None:
    from pipedream.planner.core import PlanOptions, plan_pipeline

    if plan.config == "straight":
        return None
    options = PlanOptions(memory_limit=bool(plan.extra.get("memory_limit")), straight=True,
                          compat=plan.extra.get("mode") == "compat",
                          activation_compression_ratio=plan.extra.get("activation_compression_ratio"))
    try:
        return plan_pipeline(graph, cluster, model=plan.model, minibatch_size=plan.minibatch_size, options=options)
    except PipeDreamError:
        return None


def explain(plan: Plan, graph: LayerGraph, cluster: Cluster) -> str:
    """A short account of why ``plan`` won: its bottleneck, data parallelism, a straight pipeline,
    what each stage holds, how the levels split the work, and the mode's caveats."""
    ex = plan.extra
    mb = plan.minibatch_size
    per_mb = float(ex.get("bottleneck_time_per_minibatch_s", plan.time_per_sample_s * mb))
    dp_mb = float(ex.get("dp_time_per_minibatch_s", plan.dp_time_per_sample_s * mb))
    total = sum(n.fwd_s + n.bwd_s for n in graph.nodes.values() if not n.is_input)
    weights = graph.param_bytes_of(graph.nodes)  # a tied tensor once
    n = plan.workers
    out = [f"Why {plan.config} won for {plan.model} on {cluster.name} ({n} workers, {ex.get('mode', 'default')} mode):"]
    compute_share = total / n
    dp_line = (f"data parallelism on all {n} workers needs {_ms(dp_mb)} per minibatch of {mb}: {_ms(compute_share)} of "
               f"compute per worker plus {_ms(max(dp_mb - compute_share, 0.0))} to synchronise all "
               f"{weights / 1e6:.1f} MB of weights")
    if ex.get("estimate") == "simulated":
        out += _simulated(plan)
    elif len(plan.stages) == 1:
        out.append(f"- No split beats {dp_line}; every pipeline found has a stage slower than that.")
    else:
        out.append(f"- The slowest stage needs {_ms(per_mb)} per minibatch of {mb} ({plan.time_per_sample_s * 1e6:.2f} us "
                   f"per sample), while {dp_line}: the pipeline is {plan.predicted_speedup:.2f}x faster.")
    alt = None if ex.get("estimate") == "simulated" else _straight(plan, graph, cluster)
    if alt is not None:
        verdict = "slower" if alt.time_per_sample_s > plan.time_per_sample_s else "no faster"
        out.append(f"- A straight pipeline ({len(alt.stages)} stages, one worker each) would need "
                   f"{_ms(float(alt.extra['bottleneck_time_per_minibatch_s']))} per minibatch: {verdict}.")
    details = ex.get("stage_details") or [{} for _ in plan.stages]
    slowest = max(range(len(details)), key=lambda i: details[i].get("time_s", 0.0))
    for i, (stage, d) in enumerate(zip(plan.stages, details, strict=True)):
        share_c = stage.compute_s / total if total else 0.0
        share_w = d.get("param_bytes", 0.0) / weights if weights else 0.0
        line = (f"- Stage {i}{' (the slowest)' if i == slowest and len(details) > 1 else ''}: {_layers(stage.nodes)}, "
                f"{share_c:.0%} of the compute and {share_w:.0%} of the weights, on {stage.replicas} "
                f"worker{'s' if stage.replicas > 1 else ''}")
        sync, act = d.get("sync_s", 0.0), d.get("activation_s", 0.0)
        if stage.compute_s <= 0.0:
            line += ": it computes nothing and only passes activations on"
        elif stage.replicas > 1:
            line += (f": its {_ms(stage.compute_s)} of compute is split {stage.replicas} ways, and synchronising its "
                     f"weights costs {_ms(sync)} per minibatch")
        elif share_w > share_c:
            line += ": it holds more of the weights than of the compute, so replicas would mostly add weight sync"
        if act > 0:
            line += f"; sending and receiving its activations takes {_ms(act)}"
        step = d.get("step_s", 0.0)
        if step > 0.01 * stage.compute_s:  # a step that weighs in the balance (CPU profiles, weight-heavy stages)
            line += f"; each replica's optimizer step takes {_ms(step)}"
        out.append(line + ".")
    levels = _levels(plan, cluster)
    if levels:
        out.append(f"- {levels}")
    if ex.get("mode") == "compat" and ex.get("activation_compression_ratio") is None:
        out.append("- Compat mode ignores activation transfers between stages (the release charges them only "
                   "with --activation-compression-ratio); default mode charges them.")
    out.extend(f"- Warning: {w}" for w in ex.get("warnings", []))
    if ex.get("memory_limit"):
        limit = ex.get("memory_limit_bytes") or cluster.device_memory_bytes
        out.append(f"- Every stage's stashed weights and activations had to fit {limit / 1e9:.3g} GB per device.")
    return "\n".join(out)


def _simulated(plan: Plan) -> list[str]:
    """What the re-ranking did (:mod:`pipedream.planner.rerank`): the simulated times of the candidates."""
    ex = plan.extra
    sim = ex.get("simulation", {})
    dp_epoch = float(ex.get("simulated_dp_epoch_s", math.nan))
    rates = "the profile's measured" if sim.get("step_s_per_param_byte") else "memory-bound"
    out = [f"- Simulated as `pipedream simulate` runs this plan (1F1B-RR, {sim.get('warmup')} warm-up, "
           f"{sim.get('allreduce')} allreduce overlapped with the backward, {sim.get('optimizer', 'sgd')} steps at "
           f"{rates} rates, an epoch of {sim.get('dataset_size')} samples): "
           f"{ex.get('simulated_epoch_s', math.nan):.1f} s per epoch, {_ms(ex.get('bottleneck_time_per_minibatch_s', 0.0))} "
           f"per minibatch of {plan.minibatch_size} in steady state; data parallelism {dp_epoch:.1f} s: "
           f"{plan.predicted_speedup:.2f}x."]
    solver_est = ex.get("solver_estimate") or {}
    if solver_est:
        out.append(f"- The dynamic program's own cost model (§3.1: no warm-up, independent replicas, no contention) chose "
                   f"{solver_est['config']} at "
                   f"{solver_est['dp_time_per_sample_s'] / solver_est['time_per_sample_s']:.2f}x; its plan "
                   "and the others below were simulated and the fastest kept, or the one with the fewest stages "
                   "among those within 2% of it (a near-tie, pipedream/planner/rerank.py):")
    for c in ex.get("candidates", []):
        if not c.get("fits"):
            verdict = f"does not fit ({c['peak_memory_bytes'] / 1e9:.1f} GB on one device)"
        elif c.get("refused"):
            verdict = f"refused, the runtime would not run it: {c['refused']}"
        elif c.get("simulated_epoch_s"):
            verdict = f"{dp_epoch / c['simulated_epoch_s']:.3f}x"
            if c["simulated_epoch_s"] < ex.get("simulated_epoch_s", 0.0):
                verdict += (f", {ex['simulated_epoch_s'] / c['simulated_epoch_s'] - 1:.1%} faster than {plan.config} but "
                            f"with more stages: a near-tie")
        else:
            verdict = (f"not simulated: its compute alone takes {c['epoch_lower_bound_s']:.0f} s per epoch, more than "
                       "the best")
        out.append(f"  - {c['config']} ({c['source']}): {verdict}")
    return out
