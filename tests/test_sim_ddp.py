"""The simulated DDP step against a hand computation: buckets, ring allreduce with latency, optimizer step.

Four layers n0 -> n1 -> n2 -> n3 on 4 data-parallel ranks, one flat level of 0.5 GB/s with 1 ms of
latency per message, a bucket cap of 6 MiB (an explicit cap: no 1 MiB first bucket, as in DDP) and a measured
optimizer step of 1 ns per parameter byte. Every number below is written out by hand.
"""

from __future__ import annotations

import pytest

from pipedream.costmodel import StepRates
from pipedream.graph import LayerGraph, Node
from pipedream.sim import SimOptions, run_minibatches, simulate_dp
from pipedream.sim.costs import stage_costs
from pipedream.topology import Cluster

MiB = 2**20
FWD_S = {"n0": 0.005, "n1": 0.005, "n2": 0.005, "n3": 0.005}
BWD_S = {"n0": 0.010, "n1": 0.030, "n2": 0.020, "n3": 0.010}
PARAM_BYTES = {"n0": 2 * MiB, "n1": 4 * MiB, "n2": 4 * MiB, "n3": 2 * MiB}
BATCH = 8


def graph() -> LayerGraph:
    g = LayerGraph(minibatch_size=BATCH)
    for i in range(4):
        n = f"n{i}"
        g.add_node(Node(n, "Linear", FWD_S[n], BWD_S[n], (0.0,), PARAM_BYTES[n]))
        if i:
            g.add_edge(f"n{i - 1}", n)
    return g


CLUSTER = Cluster(name="flat4", levels=[(4, 0.5e9)], latency_s=1e-3)
KW = dict(bucket_bytes=6 * MiB, step=StepRates(s_per_param_byte=1e-9), dataset_size=BATCH * 4 * 100, allreduce="ring")

# One round: every rank runs the forward (4 x 5 ms = 20 ms), then the backward in reverse order:
# n3 ends at 0.020 + 0.010 = 0.030, n2 at 0.030 + 0.020 = 0.050, n1 at 0.050 + 0.030 = 0.080,
# n0 at 0.080 + 0.010 = 0.090.
# Buckets in backward order: [n3, n2] (6 MiB >= 6 MiB), [n1, n0] (6 MiB).
# Ring allreduce of S bytes over 4 ranks: 2 * 3 * 1 ms + 2 * 3 / 4 * S / 0.5e9 s.
AR_2MIB = 6e-3 + 1.5 * 2097152 / 0.5e9   # 0.012291456 s
AR_6MIB = 6e-3 + 1.5 * 6291456 / 0.5e9   # 0.024874368 s
# bucket [n3, n2]: ready at 0.050, runs 0.050 .. 0.074874368
# bucket [n1, n0]: ready at 0.090 (the first has ended), runs 0.090 .. 0.114874368
BUCKET_SPANS = [(0.050, 0.050 + AR_6MIB), (0.090, 0.090 + AR_6MIB)]
STEP_S = 1e-9 * 12 * 1048576              # 12 MiB of parameters: 0.012582912 s
ROUND_S = 0.090 + AR_6MIB + STEP_S        # 0.12745728 s: the next forward starts after the step


def test_simulated_ddp_round_is_the_hand_computed_bucketed_ring_with_latency_and_step() -> None:
    res = simulate_dp(graph(), CLUSTER, SimOptions(keep_trace=True, **KW))
    assert ROUND_S == pytest.approx(0.12745728, rel=1e-12)
    # 4 ranks each take one minibatch per round
    assert res.time_per_minibatch_s * 4 == pytest.approx(ROUND_S, rel=1e-12)
    assert res.time_per_sample_s == pytest.approx(ROUND_S / (4 * BATCH), rel=1e-12)
    # the stall: from the end of the backward (0.090) to the end of the last bucket
    assert res.comm_stall_fraction == pytest.approx(AR_6MIB / ROUND_S, rel=1e-12)
    # each bucket: 4 ranks each send 2 (4 - 1) / 4 of it, 12 MiB in all per round of 4 x 8 samples
    assert res.allreduce_bytes_per_sample == pytest.approx(2 * 3 * 12 * 1048576 / (4 * BATCH), rel=1e-12)
    assert res.trace is not None
    spans = [(c.start, c.end) for c in res.trace.collectives[:2]]
    assert spans == [pytest.approx(s, rel=1e-12) for s in BUCKET_SPANS]


def test_without_overlap_the_buckets_follow_the_backward_one_after_another() -> None:
    res = simulate_dp(graph(), CLUSTER, SimOptions(overlap=False, **KW))
    # 0.090 + 0.024874368 + 0.024874368 + 0.012582912 = 0.152331648 s
    expected = 0.090 + AR_6MIB + AR_6MIB + STEP_S
    assert expected == pytest.approx(0.152331648, rel=1e-12)
    assert res.time_per_minibatch_s * 4 == pytest.approx(expected, rel=1e-12)


def test_one_big_bucket_pays_the_latency_once() -> None:
    """DDP's default 25 MiB cap closes its 1 MiB first bucket after n3; n2, n1, n0 (10 MiB) share the second."""
    res = simulate_dp(graph(), CLUSTER, SimOptions(overlap=False, **{**KW, "bucket_bytes": 25 * MiB}))
    ar_10mib = 6e-3 + 1.5 * 10485760 / 0.5e9  # 0.03745728 s
    # 0.090 + 0.012291456 + 0.03745728 + 0.012582912 = 0.152331648 s: as two 6 MiB buckets (the same 2 latencies)
    assert res.time_per_minibatch_s * 4 == pytest.approx(0.090 + AR_2MIB + ar_10mib + STEP_S, rel=1e-12)


@pytest.mark.parametrize("schedule", ["gpipe", "2bw", "pipedream_flush"])
def test_gpipe_and_2bw_overlap_only_the_last_backward_before_the_allreduce(schedule: str) -> None:
    """One stage on 2 replicas, 4 microbatches of 8 samples: each replica runs 2 microbatches (GPipe: F F B B;
    2BW and PipeDream-Flush: F B F B), then ALLREDUCE and STEP. The earlier backward only accumulates gradients; the buckets
    are ready during the last one, which runs 0.110 .. 0.180 in both schedules: [n3, n2] at 0.140, [n1, n0] at
    0.180."""
    costs = stage_costs(graph(), [["n0", "n1", "n2", "n3"]], BATCH, bucket_bytes=6 * MiB,
                        step=StepRates(s_per_param_byte=1e-9))
    tr = run_minibatches([[0, 1]], costs, CLUSTER, 1, SimOptions(schedule=schedule, microbatches=4), record=True)
    # the last backward starts at 0.020 + 0.020 + 0.070 (GPipe) or 0.020 + 0.070 + 0.020 (2BW, PipeDream-Flush) = 0.110; its
    # layers end at 0.120 (n3), 0.140 (n2), 0.170 (n1), 0.180 (n0). Ring over 2 ranks: 2 * 1 ms + S / 0.5e9.
    ar_6mib = 2e-3 + 6291456 / 0.5e9  # 0.014582912 s
    spans = [(0.140, 0.140 + ar_6mib), (0.180, 0.180 + ar_6mib)]
    assert [(c.start, c.end) for c in tr.collectives] == [pytest.approx(s, rel=1e-12) for s in spans]
    # 0.180 + 0.014582912 + 0.012582912 = 0.207165824 s
    assert tr.makespan_s == pytest.approx(0.207165824, rel=1e-12)


def test_the_ddp_step_pays_its_call_and_each_tensor_besides_its_bytes() -> None:
    """The same round with each layer's weight and bias as two tensors (8 in all) and a step of 1 ms a call and
    0.1 ms a tensor beside its 1 ns a byte: the step is 0.012582912 + 0.001 + 0.0008 s, so the round
    0.090 + 0.024874368 + 0.014382912 = 0.12925728 s."""
    g = graph()
    g.tensors = {n: 2 for n in g.nodes}
    step = StepRates(s_per_param_byte=1e-9, s_per_call=1e-3, s_per_tensor=1e-4)
    res = simulate_dp(g, CLUSTER, SimOptions(**{**KW, "step": step}))
    assert res.time_per_minibatch_s * 4 == pytest.approx(0.12925728, rel=1e-12)
    assert 0.090 + AR_6MIB + STEP_S + 1e-3 + 8 * 1e-4 == pytest.approx(0.12925728, rel=1e-12)
