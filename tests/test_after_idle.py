"""Coming back cold: the extra CPU of a step after an idle gap, measured (pipedream/host_timing.py) and charged by the
simulator to the first compute action a rank starts after a wait (pipedream/sim/engine.py), against hand
computations."""

from __future__ import annotations

import time

import pytest

from pipedream.host_timing import after_idle_s
from pipedream.sim import run_minibatches
from pipedream.sim.costs import stage_costs
from pipedream.sim.engine import IDLE_MIN_S
from pipedream.topology import Cluster
from tests.test_predict import chain
from tests.test_sim_ddp import AR_6MIB, BATCH, CLUSTER, MiB, graph


def _burn(cpu_s: float) -> None:
    c0 = time.thread_time()
    while time.thread_time() - c0 < cpu_s:
        pass


class ColdAfterSleep:
    """A step of 2 ms of CPU, 5 ms when it starts 10 ms or more after the last one ended."""

    def __init__(self) -> None:
        self.last = float("-inf")

    def __call__(self) -> None:
        _burn(0.005 if time.perf_counter() - self.last >= 0.010 else 0.002)
        self.last = time.perf_counter()


def test_the_measured_extra_is_the_steps_cpu_after_a_gap_over_one_right_after_another() -> None:
    assert after_idle_s(ColdAfterSleep(), gap_s=0.02, seconds=0.2) == pytest.approx(0.003, abs=5e-4)


def test_a_step_that_never_comes_back_cold_costs_nothing_more() -> None:
    assert after_idle_s(lambda: _burn(0.002), gap_s=0.02, seconds=0.1) == pytest.approx(0.0, abs=5e-4)


def no_sharing(n: int) -> float:
    return 1.0  # every rank on a core of its own, but a CPU host: the cost after a wait applies


def test_dp_ranks_pay_it_in_the_step_after_the_allreduce() -> None:
    """The DDP round of tests/test_sim_ddp.py (4 ranks, forward 20 ms, backward 70 ms, buckets of 6 MiB, a 12 MiB
    optimizer step of 12.58 ms) with 4 ms more for a cold action. Each round: the forward, then at once the
    backward, 0 .. 0.090 from the round's start; the last bucket is ready at 0.090 and ends AR later; every rank
    has waited for it, so its step is cold: 12.58 + 4 ms; the next forward follows the step at once (warm)."""
    costs = stage_costs(graph(), [["n0", "n1", "n2", "n3"]], BATCH, bucket_bytes=6 * MiB, step_s_per_param_byte=1e-9)
    step = 1e-9 * 12 * MiB
    tr = run_minibatches("dp", [[0, 1, 2, 3]], costs, CLUSTER, 8, sharing=no_sharing, after_idle_s=0.004)
    assert tr.makespan_s == pytest.approx(2 * (0.090 + AR_6MIB + step + 0.004), rel=1e-12)
    # without sharing (ranks on GPUs) nothing is charged
    plain = run_minibatches("dp", [[0, 1, 2, 3]], costs, CLUSTER, 8, after_idle_s=0.004)
    assert plain.makespan_s == pytest.approx(2 * (0.090 + AR_6MIB + step), rel=1e-12)


def test_a_pipeline_stage_pays_it_after_each_receive_it_waited_for() -> None:
    """Two stages of one layer each (forward 1 s, backward 2 s), one minibatch, free transfers, 0.5 s more for a
    cold action. Stage 0's forward, 0 .. 1. Stage 1 waited for it: its forward is cold, 1 .. 2.5, and its
    backward follows at once, 2.5 .. 4.5. Stage 0 waited for that gradient: its backward is cold, 4.5 .. 7.
    Without the cost: 1 + 1 + 2 + 2 = 6 s."""
    g = chain(2, 1.0, 2.0)
    costs = stage_costs(g, [["node0", "node1"], ["node2"]], 8)
    free = Cluster("c", [(2, 1e18)])
    tr = run_minibatches("1f1b", [[0], [1]], costs, free, 1, sharing=no_sharing, after_idle_s=0.5)
    assert tr.makespan_s == pytest.approx(7.0)
    assert run_minibatches("1f1b", [[0], [1]], costs, free, 1, sharing=no_sharing).makespan_s == pytest.approx(6.0)


def test_a_wait_shorter_than_the_minimum_leaves_the_rank_warm() -> None:
    """As above, but stage 0's forward takes half the minimum wait: stage 1 waits that long for it, and its
    forward is warm; stage 0 still waits for the gradient, and its backward is cold."""
    g = chain(2, 1.0, 2.0)
    costs = stage_costs(g, [["node0", "node1"], ["node2"]], 8)
    costs[0].fwd_s = IDLE_MIN_S / 2
    free = Cluster("c", [(2, 1e18)])
    tr = run_minibatches("1f1b", [[0], [1]], costs, free, 1, sharing=no_sharing, after_idle_s=0.5)
    assert tr.makespan_s == pytest.approx(IDLE_MIN_S / 2 + 1.0 + 2.0 + 2.5)
