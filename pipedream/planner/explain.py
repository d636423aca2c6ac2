"""``pipedream plan --explain``: why the chosen split won, in words."""

from __future__ import annotations

from pipedream.graph import LayerGraph
from pipedream.plan import Plan
from pipedream.topology import Cluster


def explain(plan: Plan, graph: LayerGraph, cluster: Cluster) -> str:
    """A few sentences: the bottleneck, the comparison with data parallelism, what limits the split."""
    ex = plan.extra
    per_mb = ex.get("bottleneck_time_per_minibatch_s", plan.time_per_sample_s * plan.minibatch_size)
    dp_mb = ex.get("dp_time_per_minibatch_s", plan.dp_time_per_sample_s * plan.minibatch_size)
    total = sum(n.fwd_s + n.bwd_s for n in graph.nodes.values() if not n.is_input)
    params = sum(n.param_bytes for n in graph.nodes.values())
    out = []
    if len(plan.stages) == 1:
        out.append(
            f"Data parallelism won: no pipeline split of {plan.model} on {cluster.name} beats replicating the whole model "
            f"on all {plan.workers} workers ({dp_mb * 1e3:.3f} ms per minibatch of {plan.minibatch_size})."
        )
    else:
        loads = [(s.compute_s + s.comm_s) / s.replicas for s in plan.stages]
        worst = max(range(len(loads)), key=loads.__getitem__)
        out.append(
            f"Config {plan.config} won: its slowest stage takes {per_mb * 1e3:.3f} ms per minibatch of {plan.minibatch_size}, "
            f"against {dp_mb * 1e3:.3f} ms for data parallelism on all {plan.workers} workers "
            f"({plan.predicted_speedup:.2f}x)."
        )
        out.append(
            f"Stage {worst} ({len(plan.stages[worst].nodes)} layers, {plan.stages[worst].replicas} replica(s)) carries the most "
            f"work per replica; more replicas there would take them from a stage that would then become slower."
        )
    sync = 4.0 * (plan.workers - 1) * params / (cluster.levels[-1][1] * plan.workers)
    out.append(
        f"The model computes for {total * 1e3:.1f} ms per minibatch and has {params / 1e6:.1f} MB of weights; "
        f"synchronising them across all workers at {cluster.levels[-1][1] / 1e9:g} GB/s would cost about {sync * 1e3:.1f} ms "
        "per minibatch, which is what replicated stages pay and pipelining avoids."
    )
    if ex.get("mode") == "compat":
        ratio = ex.get("activation_compression_ratio")
        out.append(
            "Compat mode: activation transfers between stages are "
            + (
                "ignored (the release charges them only with --activation-compression-ratio)."
                if ratio is None
                else f"charged, compressed {ratio:g}x."
            )
        )
    if ex.get("memory_limit"):
        gb = cluster.device_memory_bytes / 1e9
        out.append(f"Every stage's stashed weights and activations had to fit {gb:g} GB per device.")
    return "\n".join(out)
