"""Where the planner's cost model (paper §3.1) and the simulator assume the same thing, they agree.

* A straight pipeline with free communication: the steady period is the bottleneck stage's compute,
  which is the planner's estimate.
* A replicated stage with no weights to synchronise: ``r`` replicas give ``r / T`` minibatches/s.
* With weights: the simulator charges, per DDP bucket, a ring allreduce ``2 (r - 1) L + 2 (r - 1) / r * P / B``
  after each backward (latency ``L`` per step of the ring; lockstep, as DDP in the release runtime) and then
  the optimizer step ``5 P / M`` (SGD with momentum, memory bound at ``M`` B/s), i.e.
  ``(T + 2 (r - 1) L + 2 (r - 1) P / (r B) + 5 P / M) / r`` per minibatch without overlap for one bucket.
  The release planner's term is ``4 (r - 1) P / (r B)``: twice the ring's bytes over the link, so the
  simulator's bandwidth term equals the planner's formula at bandwidth ``B / 2`` (and is faster at ``B``).
* Lockstep vs independent replicas and the two warm-up counts differ only where the paper's assumption
  breaks: a single stage feeding a replicated one.
"""

from __future__ import annotations

import pytest

from pipedream.costmodel import StepRates
from pipedream.graph import LayerGraph, Node
from pipedream.planner import PlanOptions, plan_pipeline
from pipedream.schedules import warmup_count, warmup_count_consistent
from pipedream.sim import SimOptions, simulate_stages
from pipedream.sim.costs import stage_costs
from pipedream.topology import Cluster

GB = 1e9


def chain(times: list[float], param_bytes: float = 0.0, act_bytes: float = 0.0, batch: int = 8) -> LayerGraph:
    """A chain of layers with forward ``t / 3`` and backward ``2 t / 3`` seconds each."""
    g = LayerGraph(minibatch_size=batch)
    for i, t in enumerate(times):
        g.add_node(Node(f"n{i}", "Linear", t / 3, 2 * t / 3, (act_bytes,), param_bytes))
        if i:
            g.add_edge(f"n{i - 1}", f"n{i}")
    return g


def flat(workers: int, bandwidth: float = 1 * GB, latency_s: float = 0.0) -> Cluster:
    return Cluster(name=f"flat{workers}", levels=[(workers, bandwidth)], device_memory_bytes=16 * GB,
                   latency_s=latency_s)


def test_straight_pipeline_period_is_the_bottleneck_stage_and_the_planner_estimate() -> None:
    g = chain([0.030, 0.045, 0.060, 0.015, 0.030, 0.030])
    plan = plan_pipeline(g, flat(4), model="chain", minibatch_size=8, options=PlanOptions(straight=True, compat=True))
    stages = [s.nodes for s in plan.stages]
    res = simulate_stages(g, stages, [[i] for i in range(len(stages))], flat(4), SimOptions(dataset_size=8 * 1000))
    bottleneck = max(c.fwd_s + c.bwd_s for c in stage_costs(g, stages, 8))
    assert bottleneck == pytest.approx(0.075)  # the best 4-way split of 30/45/60/15/30/30 ms
    assert res.time_per_minibatch_s == pytest.approx(bottleneck, rel=1e-9)
    assert plan.extra["bottleneck_time_per_minibatch_s"] == pytest.approx(bottleneck, rel=1e-9)
    assert res.time_per_sample_s == pytest.approx(plan.time_per_sample_s, rel=1e-9)


@pytest.mark.parametrize("r", [2, 3, 5])
def test_replicated_stage_without_weights_gives_r_over_t(r: int) -> None:
    """``r``-15-1... here r-1: stage 0 replicated r times (T = 90 ms), stage 1 fast (9 ms)."""
    g = chain([0.090, 0.009])
    res = simulate_stages(g, [["n0"], ["n1"]], [list(range(r)), [r]], flat(r + 1), SimOptions(dataset_size=8 * 3000))
    assert res.time_per_minibatch_s == pytest.approx(0.090 / r, rel=1e-9)


@pytest.mark.parametrize("r", [2, 4])
def test_replicated_stage_with_weight_sync(r: int) -> None:
    """T = 90 ms, P = 0.1 GB (one bucket) at 1 GB/s with 1 ms latency: after every backward a ring allreduce
    of 2 (r-1) ms + 2 (r-1)/r * 0.1 s, then a step of (6 + 2) * 0.1 GB / 100 GB/s = 8 ms (SGD with momentum and
    zeroing the gradients: 6 bytes per parameter byte; the replicas stash versions, so the step first copies the
    weights: 2 more)."""
    t, p, bw, lat, mem = 0.090, 0.1 * GB, 1 * GB, 1e-3, 100 * GB
    g = chain([t, 0.001], param_bytes=0.0)
    g.nodes["n0"].param_bytes = p
    ring = 2 * (r - 1) * lat + 2 * (r - 1) / r * p / bw
    step = (6 + 2) * p / mem
    kw = dict(dataset_size=8 * 3000, overlap=False, allreduce="ring", step=StepRates(memory_Bps=mem))
    res = simulate_stages(g, [["n0"], ["n1"]], [list(range(r)), [r]], flat(r + 1, bw, lat), SimOptions(**kw))
    assert res.time_per_minibatch_s == pytest.approx((t + ring + step) / r, rel=1e-9)
    planner_term = 4 * (r - 1) * p / (r * bw)  # the release planner: twice the ring's bandwidth term
    assert planner_term == pytest.approx(2 * (ring - 2 * (r - 1) * lat))
    half = simulate_stages(g, [["n0"], ["n1"]], [list(range(r)), [r]], flat(r + 1, bw / 2, lat), SimOptions(**kw))
    assert half.time_per_minibatch_s == pytest.approx((t + 2 * (r - 1) * lat + planner_term + step) / r, rel=1e-9)
    # independent replicas (the planner's assumption) give the same period when nothing staggers them
    ind = simulate_stages(g, [["n0"], ["n1"]], [list(range(r)), [r]], flat(r + 1, bw, lat), SimOptions(sync="independent", **kw))
    assert ind.time_per_minibatch_s == pytest.approx((t + ring + step) / r, rel=1e-9)


def test_consistent_warmup_equals_the_release_where_replicas_divide() -> None:
    for reps in ([1, 1, 1, 1], [15, 1], [4, 4, 4, 4], [2, 1, 1]):
        assert [warmup_count_consistent(reps, s) for s in range(len(reps))] == \
            [warmup_count(reps, s) for s in range(len(reps))]
    reps = [1, 5, 1, 1, 7, 1]
    assert [warmup_count(reps, s) for s in range(6)] == [16, 3, 10, 9, 2, 1]
    assert [warmup_count_consistent(reps, s) for s in range(6)] == [26, 5, 16, 15, 2, 1]


def test_single_stage_feeding_a_replicated_one_starves_under_the_release_warmup() -> None:
    """1-7-1 with T = 10, 210, 10 ms: balanced at 30 ms per minibatch. The release's warm-up lets stage 0
    hold 9 minibatches, but the 7 replicas of stage 1 each need their 2nd forward before their first
    backward (14 in flight): the chain B(j) <- F(j + 7) <- B(j - 2) at stage 0 serialises replicas."""
    g = chain([0.010, 0.210, 0.010])
    nodes, ranks = [["n0"], ["n1"], ["n2"]], [[0], list(range(1, 8)), [8]]
    kw = dict(dataset_size=8 * 7000)
    release = simulate_stages(g, nodes, ranks, flat(9), SimOptions(warmup="release", **kw))
    consistent = simulate_stages(g, nodes, ranks, flat(9), SimOptions(**kw))  # the default, as the runtime's
    assert release.time_per_minibatch_s == pytest.approx(0.87 / 7, rel=1e-9)  # 4.1x the balanced 30 ms
    assert consistent.time_per_minibatch_s == pytest.approx(0.240 / 7, rel=1e-9)
    # what is left is lockstep: each round of 7 waits for the last replica, 30 ms behind the first
    # (one stage-0/2 minibatch); independent replicas (the planner's assumption) reach the balanced 30 ms
    ind = simulate_stages(g, nodes, ranks, flat(9), SimOptions(warmup="consistent", sync="independent", **kw))
    assert ind.time_per_minibatch_s == pytest.approx(0.030, rel=1e-9)
