"""Processor sharing of a host's cores (pipedream/sim/cores.py) against hand computations."""

from __future__ import annotations

import pytest

from pipedream.sim.cores import Cores


def one_core(n: int) -> float:
    return float(n)  # n jobs on one core: each at 1 / n of full speed


def test_without_sharing_an_action_ends_after_its_work() -> None:
    cores = Cores()
    assert cores.start(0, 2.0, 1.0) == [(3.0, 0)]
    assert cores.start(1, 1.0, 1.5) == [(2.5, 1)]  # nothing moves the other
    job, moved = cores.finish(1, 2.5)
    assert (job.start_s, job.work_s, moved) == (1.5, 1.0, [])


def test_two_actions_started_together_share_one_core() -> None:
    """Work 1 and 2 from t = 0 at half speed each: the first ends at 2; the other has 1 s of work left and
    then runs alone: it ends at 3."""
    cores = Cores(one_core)
    cores.start(0, 1.0, 0.0)
    ends = dict((r, t) for t, r in cores.start(1, 2.0, 0.0))
    assert ends == pytest.approx({0: 2.0, 1: 4.0})
    _, moved = cores.finish(0, 2.0)
    assert moved == [(pytest.approx(3.0), 1)]


def test_a_late_start_slows_the_action_already_running() -> None:
    """Work 2 from t = 0 alone until t = 1 (1 s left), then work 1 joins: both at half speed end at t = 3."""
    cores = Cores(one_core)
    assert cores.start(0, 2.0, 0.0) == [(2.0, 0)]
    ends = dict((r, t) for t, r in cores.start(1, 1.0, 1.0))
    assert ends == pytest.approx({0: 3.0, 1: 3.0})


def test_hosts_share_only_their_own_cores() -> None:
    """Ranks 0 and 1 on host 0, rank 2 on host 1: rank 2 runs at full speed beside the pair."""
    cores = Cores(one_core, host_of=lambda r: 0 if r < 2 else 1)
    cores.start(0, 1.0, 0.0)
    cores.start(1, 1.0, 0.0)
    assert cores.start(2, 1.0, 0.0) == [(1.0, 2)]
    assert cores.running(0) is not None and cores.running(3) is None
