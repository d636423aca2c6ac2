"""Simulator: exact bubble formulas, 1F1B's bubble-free steady state, allreduce stalls, closed form."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipedream import schedules
from pipedream.costmodel import StepRates
from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph, Node
from pipedream.memory import copies_on_write
from pipedream.schedules import Action, Kind, Schedule
from pipedream.sim import SimOptions, extrapolate, run_minibatches, simulate_dp, simulate_stages
from pipedream.sim.costs import measured_costs, stage_costs, uniform_costs
from pipedream.sim.engine import run
from pipedream.sim.network import Network
from pipedream.topology import Cluster
from tests.conftest import PROFILES

GB = 1e9


def chain(layers: int, fwd_s: float = 0.001, bwd_s: float = 0.002, act_bytes: float = 0.0, param_bytes: float = 0.0,
          batch: int = 8) -> LayerGraph:
    """A chain of identical layers profiled at ``batch`` samples."""
    g = LayerGraph(minibatch_size=batch)
    for i in range(layers):
        g.add_node(Node(f"n{i}", "Linear", fwd_s, bwd_s, (act_bytes,), param_bytes))
        if i:
            g.add_edge(f"n{i - 1}", f"n{i}")
    return g


def flat(workers: int, bandwidth: float = 1 * GB, latency_s: float = 0.0) -> Cluster:
    """One level of ``workers`` at ``bandwidth`` B/s; no latency unless given, so the hand computations
    below are bytes over bandwidth."""
    return Cluster(name=f"flat{workers}", levels=[(workers, bandwidth)], latency_s=latency_s)


def one_per_stage(p: int) -> tuple[list[list[str]], list[list[int]]]:
    return [[f"n{i}"] for i in range(p)], [[i] for i in range(p)]


@pytest.mark.parametrize("p,m", [(2, 1), (2, 4), (4, 1), (4, 4), (4, 8), (8, 3), (8, 16)])
def test_gpipe_bubble_is_exactly_p_minus_1_over_m_plus_p_minus_1(p: int, m: int) -> None:
    g = chain(p, fwd_s=0.003, bwd_s=0.007)
    nodes, ranks = one_per_stage(p)
    res = simulate_stages(g, nodes, ranks, flat(p), SimOptions(schedule="gpipe", microbatches=m, dataset_size=10_000))
    expected = (p - 1) / (m + p - 1)
    assert res.bubble_fraction == pytest.approx(expected, rel=1e-12)
    assert res.steady_bubble_fraction == pytest.approx(expected, rel=1e-12)
    # one minibatch takes (m + p - 1)(f + b): fill, m microbatches, drain, flush
    assert res.time_per_minibatch_s == pytest.approx((m + p - 1) * 0.010, rel=1e-12)
    tr = run_minibatches(ranks, stage_costs(g, nodes, 8), flat(p), 1, SimOptions(schedule="gpipe", microbatches=m))
    assert 1 - sum(tr.busy_s.values()) / (p * tr.makespan_s) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_pipedream_1f1b_steady_state_has_no_bubble(p: int) -> None:
    g = chain(p, fwd_s=0.002, bwd_s=0.004)
    nodes, ranks = one_per_stage(p)
    res = simulate_stages(g, nodes, ranks, flat(p), SimOptions(schedule="1f1b", dataset_size=8 * 10_000))
    assert res.steady_bubble_fraction == pytest.approx(0.0, abs=1e-12)
    assert res.utilisation == pytest.approx([1.0] * p, rel=1e-12)
    assert res.time_per_minibatch_s == pytest.approx(0.006, rel=1e-12)  # one F and one B per minibatch
    # an epoch of N minibatches: N periods plus the fill and drain of (p - 1) (f + b)
    assert res.epoch_time_s == pytest.approx((10_000 + p - 1) * 0.006, rel=1e-12)
    # 2BW runs the same 1F1B stream of microbatches: no steady bubble either
    bw = simulate_stages(g, nodes, ranks, flat(p), SimOptions(schedule="2bw", microbatches=p, dataset_size=8 * 10_000))
    assert bw.steady_bubble_fraction == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("p,m", [(3, 4), (4, 2), (2, 8)])
def test_pipedream_flush_epoch_by_hand(p: int, m: int) -> None:
    """Every minibatch fills and drains the pipeline, as GPipe's: (m + p - 1)(f + b) each, so 10 minibatches
    take 10 (m + p - 1)(f + b). Recomputation runs every forward again in its backward: b becomes b + f, with
    b = 2f the 2BW paper's 4/3 more compute."""
    f, b = 0.002, 0.004
    g = chain(p, fwd_s=f, bwd_s=b)
    nodes, ranks = one_per_stage(p)
    flush = SimOptions(schedule="pipedream_flush", microbatches=m, dataset_size=10 * 8 * m)
    res = simulate_stages(g, nodes, ranks, flat(p), flush)
    assert res.epoch_minibatches == 10 and res.samples_per_minibatch == 8 * m
    assert res.epoch_time_s == pytest.approx(10 * (m + p - 1) * (f + b), rel=1e-12)
    assert res.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), rel=1e-12)
    again = simulate_stages(g, nodes, ranks, flat(p), replace(flush, recompute=True))
    assert again.epoch_time_s == pytest.approx(10 * (m + p - 1) * (f + b + f), rel=1e-12)
    assert again.epoch_time_s / res.epoch_time_s == pytest.approx(4 / 3, rel=1e-12)


def test_recomputation_costs_a_forward_in_every_backward() -> None:
    """By hand: forward 1 s, backward 2 s, the stage's one gradient bucket ready at the end of the backward."""
    from pipedream.sim.costs import recomputed

    (c,) = recomputed(uniform_costs(1, 1.0, 2.0, param_bytes=100.0, step_s=0.5))
    assert (c.fwd_s, c.bwd_s, c.buckets, c.step_s, c.param_bytes) == (1.0, 3.0, [(3.0, 100.0)], 0.5, 100.0)


def test_activation_transfer_delays_the_next_stage_by_bytes_over_bandwidth() -> None:
    """Two stages, 0.5 GB activations on a 1 GB/s link: F1 starts 0.5 s after F0 ends."""
    g = chain(2, fwd_s=1.0, bwd_s=2.0, act_bytes=0.5 * GB, batch=8)
    nodes, ranks = one_per_stage(2)
    tr = run_minibatches(ranks, stage_costs(g, nodes, 8), flat(2), 1, record=True)
    f1 = tr.compute[1][0]
    assert (f1.what, f1.start, f1.end) == ("1F0", pytest.approx(1.5), pytest.approx(2.5))
    b0 = tr.compute[0][1]  # B1 ends at 4.5, the 0.5 GB gradient arrives at 5.0
    assert (b0.what, b0.start) == ("0B0", pytest.approx(5.0))
    assert tr.makespan_s == pytest.approx(7.0)
    assert tr.p2p_bytes == pytest.approx(1.0 * GB)
    assert tr.recv_wait_s == {0: pytest.approx(4.0), 1: pytest.approx(1.5)}


def test_bytes_per_sample_pipeline_vs_data_parallel() -> None:
    """Pipeline: 2 a per boundary per minibatch; DP: 2 (n - 1) P per round of n minibatches."""
    a, w, batch, p = 4e6, 1e8, 16, 4
    g = chain(p, 0.01, 0.02, act_bytes=a, param_bytes=w, batch=batch)
    nodes, ranks = one_per_stage(p)
    pipe = simulate_stages(g, nodes, ranks, flat(p, 100 * GB), SimOptions(dataset_size=batch * 1000))
    assert pipe.p2p_bytes_per_sample == pytest.approx(2 * a * (p - 1) / batch)
    assert pipe.allreduce_bytes_per_sample == 0.0
    dp = simulate_dp(g, flat(p, 100 * GB), SimOptions(dataset_size=batch * 1000))
    assert dp.allreduce_bytes_per_sample == pytest.approx(2 * (p - 1) * p * w / (p * batch))
    assert dp.p2p_bytes_per_sample == 0.0


@pytest.mark.parametrize("n", [2, 4, 8])
def test_dp_without_overlap_adds_the_ring_allreduce(n: int) -> None:
    """A DP round: compute f + b, then the ring allreduce of two buckets (one per layer, 0.4 GB each)
    2 x (2 (n - 1) L + 2 (n - 1) / n * P / 2 / B), then the SGD step and zeroing the gradients 6 P / 900 GB/s
    (the default V100 memory bound; one weight version, no copy); the stall is the allreduce's share."""
    f, b, w, bw, lat, batch = 0.010, 0.020, 0.8 * GB, 2 * GB, 1e-3, 32
    g = chain(2, f / 2, b / 2, param_bytes=w / 2, batch=batch)
    res = simulate_dp(g, flat(n, bw, lat), SimOptions(overlap=False, dataset_size=batch * n * 1000))
    ar = 2 * (2 * (n - 1) * lat + 2 * (n - 1) / n * (w / 2) / bw)
    step = 6 * w / 900e9
    assert res.time_per_sample_s * n * batch == pytest.approx(f + b + ar + step, rel=1e-12)
    assert res.comm_stall_fraction == pytest.approx(ar / (f + b + ar + step), rel=1e-12)
    assert res.epoch_time_s == pytest.approx(1000 * (f + b + ar + step), rel=1e-12)


def test_dp_wait_free_backprop_overlaps_layer_allreduces_with_backward() -> None:
    """Two layers, backward 1 s each, each layer one bucket whose allreduce takes 1.5 s (2 workers,
    1.5 GB at 1 GB/s), then a step of 0.1 s (3 GB at a measured 1 / 30 ns per byte).

    Backward order is n1 then n0: n1's gradients are ready at 1 s and reduced over [1, 2.5]; n0's are
    ready at 2 s and reduced over [2.5, 4]. The round takes f + 4 + 0.1 s instead of f + 2 + 3 + 0.1 s.
    """
    g = chain(2, fwd_s=0.5, bwd_s=1.0, param_bytes=1.5 * GB, batch=8)
    kw = dict(dataset_size=8 * 200, step=StepRates(s_per_param_byte=0.1 / (3 * GB)))
    over = simulate_dp(g, flat(2), SimOptions(overlap=True, **kw))
    assert over.time_per_minibatch_s * 2 == pytest.approx(1.0 + 4.0 + 0.1, rel=1e-12)
    assert over.comm_stall_fraction == pytest.approx(2.0 / 5.1, rel=1e-12)
    serial = simulate_dp(g, flat(2), SimOptions(overlap=False, **kw))
    assert serial.time_per_minibatch_s * 2 == pytest.approx(1.0 + 2.0 + 3.0 + 0.1, rel=1e-12)


def _split(g: LayerGraph, sizes: list[int]) -> list[list[str]]:
    order = [n for n in g.topological_order() if not g.nodes[n].is_input]
    out, i = [], 0
    for k in sizes:
        out.append(order[i:i + k])
        i += k
    out[-1] += order[i:]
    return out


CASES = [  # (profile, minibatch, stage sizes, stage ranks, cluster levels, schedule, microbatches)
    ("vgg16", 128, [30, 11], [list(range(3)), [3]], [(2, 15.75 * GB), (2, 1.25 * GB)], "1f1b", 1),
    ("vgg16", 128, [41], [list(range(4))], [(2, 15.75 * GB), (2, 1.25 * GB)], "dp", 1),
    ("gnmt", 64, [12, 12, 12, 12], [[0], [1], [2], [3]], [(4, 15.75 * GB)], "1f1b", 1),
    ("gnmt", 64, [12, 12, 12, 12], [[0], [1], [2], [3]], [(2, 25 * GB), (2, 3.125 * GB)], "gpipe", 4),
    ("resnet50", 128, [60, 60, 57], [[0, 1], [2], [3]], [(2, 15.75 * GB), (2, 1.25 * GB)], "1f1b", 1),
    ("alexnet", 256, [15, 7], [[0], [1]], [(2, 1.25 * GB)], "2bw", 4),
    ("resnet50", 128, [60, 60, 57], [[0, 1], [2], [3]], [(2, 15.75 * GB), (2, 1.25 * GB)], "pipedream_flush", 4),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[5]}" for c in CASES])
def test_closed_form_equals_event_simulation_on_short_runs(case: tuple) -> None:
    name, mb, sizes, ranks, levels, sched, m = case
    g = LayerGraph.read(PROFILES / name / "graph.txt", mb)
    cluster = Cluster(name="t", levels=levels)
    costs = stage_costs(g, _split(g, sizes), 64)
    unit = max(len(r) for r in ranks) if sched != "1f1b" else 6
    n_a = unit * 6
    options = SimOptions(schedule=sched, microbatches=m)
    t = {n: run_minibatches(ranks, costs, cluster, n, options).makespan_s for n in (n_a, 2 * n_a, 3 * n_a, 5 * n_a)}
    for n in (3 * n_a, 5 * n_a):
        assert extrapolate(t[n_a], t[2 * n_a], n_a, 2 * n_a, n) == pytest.approx(t[n], rel=1e-9)


def test_epoch_extrapolation_matches_a_full_event_simulation() -> None:
    g = LayerGraph.read(PROFILES / "gnmt" / "graph.txt", 64)
    nodes = _split(g, [16, 16, 16])
    ranks = [[0, 1], [2], [3]]
    cluster = Cluster(name="t", levels=[(2, 15.75 * GB), (2, 1.25 * GB)])
    res = simulate_stages(g, nodes, ranks, cluster, SimOptions(batch_size=64, dataset_size=64 * 400))
    costs = stage_costs(g, nodes, 64, copies_on_write=copies_on_write("1f1b", [2, 1, 1]))  # as simulate_stages
    full = run_minibatches(ranks, costs, cluster, 400)
    assert res.epoch_time_s == pytest.approx(full.makespan_s, rel=1e-9)
    assert res.bubble_fraction == pytest.approx(1 - sum(full.busy_s.values()) / (4 * full.makespan_s), rel=1e-9)


def test_deadlock_and_bad_inputs_raise_clear_errors() -> None:
    lonely = Schedule("broken", [[0], [1]], 1, 1, {0: [Action(0, Kind.F, 0)], 1: [Action(1, Kind.RECV_F, 0)]})
    with pytest.raises(PipeDreamError, match="deadlocks.*1RECV_F0"):
        run(lonely, uniform_costs(2, 1.0, 1.0), Network(flat(2)))
    g = chain(2, 0.01, 0.02)
    with pytest.raises(PipeDreamError, match="rank 5 is outside cluster"):
        simulate_stages(g, [["n0"], ["n1"]], [[0], [5]], flat(2))
    with pytest.raises(PipeDreamError, match="node 'nope'"):
        simulate_stages(g, [["n0"], ["nope"]], [[0], [1]], flat(2))
    with pytest.raises(PipeDreamError, match="before its producer"):
        simulate_stages(g, [["n1"], ["n0"]], [[0], [1]], flat(2))
    with pytest.raises(PipeDreamError, match="unknown schedule"):
        simulate_stages(g, [["n0"], ["n1"]], [[0], [1]], flat(2), SimOptions(schedule="pipe"))


def test_closed_form_waits_for_the_end_of_a_long_transient() -> None:
    """VGG-16 15-1 on cluster A settles only after 4 rounds of 15 minibatches; the epoch still matches."""
    g = LayerGraph.read(PROFILES / "vgg16" / "graph.txt", 128)
    cluster = Cluster(name="A", levels=[(4, 15.75 * GB), (4, 1.25 * GB)])
    nodes = _split(g, [25, 15])
    ranks = [list(range(15)), [15]]
    res = simulate_stages(g, nodes, ranks, cluster, SimOptions(batch_size=64, dataset_size=64 * 600))
    costs = stage_costs(g, nodes, 64, copies_on_write=copies_on_write("1f1b", [15, 1]))  # as simulate_stages
    full = run_minibatches(ranks, costs, cluster, 600)
    assert res.steady_state_converged
    assert res.epoch_time_s == pytest.approx(full.makespan_s, rel=1e-9)


def test_measured_costs_two_stage_1f1b_by_hand() -> None:
    """f = 1 s, b = 2 s per stage; 1F1B on 2 stages: stage 0 warms up with 2 forwards, then its
    backward k ends at 3 + 3 (k + 1) s (one f + b per minibatch, no bubble), so N minibatches take
    3 N + 3 s. One minibatch with a 0.5 s transfer each way: f + c + f + b + c + b = 7 s."""
    costs = measured_costs([1.0, 1.0], [2.0, 2.0], [1e6])
    assert [(c.send_fwd_bytes, c.send_bwd_bytes) for c in costs] == [(1e6, 0.0), (0.0, 1e6)]
    free = Cluster(name="fast", levels=[(2, 1e30)], latency_s=0.0)
    for n in (1, 2, 4, 9):
        tr = run(schedules.build("1f1b", schedules.consecutive_ranks([1, 1]), n), costs, Network(free))
        assert tr.makespan_s == pytest.approx(3 * n + 3, rel=1e-12)
    slow = Cluster(name="slow", levels=[(2, 2e6)], latency_s=0.0)  # 1e6 bytes take 0.5 s
    assert run(schedules.build("1f1b", [[0], [1]], 1), costs, Network(slow)).makespan_s == pytest.approx(7.0)
    # a latency of 0.25 s per message and a measured 0.5 s optimizer step on each stage after its backward:
    # f + (L + c) + f + b + (L + c) + b + step = 1 + 0.75 + 1 + 2 + 0.75 + 2 + 0.5 = 8 s (stage 1's step runs
    # while the gradient travels to stage 0)
    stepped = measured_costs([1.0, 1.0], [2.0, 2.0], [1e6], step_s=[0.5, 0.5])
    late = Cluster(name="late", levels=[(2, 2e6)], latency_s=0.25)
    assert run(schedules.build("1f1b", [[0], [1]], 1), stepped, Network(late)).makespan_s == pytest.approx(8.0)
    with pytest.raises(PipeDreamError, match="n - 1 boundary sizes"):
        measured_costs([1.0, 1.0], [2.0, 2.0], [])
