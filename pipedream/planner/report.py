"""Human-readable output of a :class:`pipedream.plan.Plan`: the stage table and ``--explain`` text."""

from __future__ import annotations

from pipedream.plan import Plan


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
    for i, s in enumerate(plan.stages):
        lines.append(
            f"{i:>5}  {_nodes(s.nodes):<28} {s.replicas:>8}  {_ranks(s.ranks):<14} {s.compute_s * 1e3:>10.3f} "
            f"{s.comm_s * 1e3:>9.3f} {s.memory_bytes / 1e9:>9.3f}"
        )
    bottleneck_ms = ex.get("bottleneck_time_per_minibatch_s", 0.0) * 1e3
    lines += [
        "",
        f"predicted time per sample      {plan.time_per_sample_s * 1e6:12.3f} us  "
        f"(bottleneck {bottleneck_ms:.3f} ms per minibatch)",
        f"predicted DP time per sample   {plan.dp_time_per_sample_s * 1e6:12.3f} us  "
        f"(data parallelism on all {plan.workers} workers)",
        f"predicted speedup over DP      {plan.predicted_speedup:12.3f} x",
    ]
    placement = ex.get("placement_rank_map")
    if placement and len(ex.get("levels", [])) > 1:
        lines.append("hierarchical placement (stage: ranks): " + "; ".join(f"{k}: {_ranks(v)}" for k, v in placement.items()))
    return "\n".join(lines)
