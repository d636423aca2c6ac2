"""The host model, processor sharing of a host's cores (pipedream/sim/cores.py), against hand computations."""

from __future__ import annotations

import pytest

from pipedream.errors import PipeDreamError
from pipedream.schedules import Action, Kind, Schedule
from pipedream.sim.cores import Cores, Host, slowdown
from pipedream.sim.costs import StageCost
from pipedream.sim.engine import run
from pipedream.sim.network import Network
from pipedream.topology import Cluster


def test_slowdown_is_ranks_over_cores_and_never_below_one() -> None:
    assert [slowdown(n, 2) for n in (0, 1, 2, 3, 4)] == [1.0, 1.0, 1.0, 1.5, 2.0]
    with pytest.raises(PipeDreamError, match="cores must be positive"):
        slowdown(1, 0)


def test_host_numbers_ranks_as_torchrun_does() -> None:
    host = Host(cores=4, ranks_per_host=3)
    assert [host.host_of(r) for r in range(7)] == [0, 0, 0, 1, 1, 1, 2]
    with pytest.raises(PipeDreamError, match="must be positive"):
        Host(cores=0, ranks_per_host=1)


def test_without_sharing_an_action_ends_after_its_work() -> None:
    cores = Cores()
    assert cores.start(0, 2.0, 1.0) == [(3.0, 0)]
    assert cores.start(1, 1.0, 1.5) == [(2.5, 1)]  # nothing moves the other
    job, moved = cores.finish(1, 2.5)
    assert (job.start_s, job.work_s, moved) == (1.5, 1.0, [])


def test_two_actions_started_together_share_one_core() -> None:
    """Work 1 and 2 from t = 0 at half speed each: the first ends at 2; the other has 1 s of work left and
    then runs alone: it ends at 3."""
    cores = Cores(Host(cores=1, ranks_per_host=2))
    cores.start(0, 1.0, 0.0)
    ends = dict((r, t) for t, r in cores.start(1, 2.0, 0.0))
    assert ends == pytest.approx({0: 2.0, 1: 4.0})
    _, moved = cores.finish(0, 2.0)
    assert moved == [(pytest.approx(3.0), 1)]


def test_a_late_start_slows_the_action_already_running() -> None:
    """Work 2 from t = 0 alone until t = 1 (1 s left), then work 1 joins: both at half speed end at t = 3."""
    cores = Cores(Host(cores=1, ranks_per_host=2))
    assert cores.start(0, 2.0, 0.0) == [(2.0, 0)]
    ends = dict((r, t) for t, r in cores.start(1, 1.0, 1.0))
    assert ends == pytest.approx({0: 3.0, 1: 3.0})


def test_hosts_share_only_their_own_cores() -> None:
    """Ranks 0 and 1 on host 0, rank 2 on host 1 (one core each): rank 2 runs at full speed beside the pair."""
    cores = Cores(Host(cores=1, ranks_per_host=2))
    cores.start(0, 1.0, 0.0)
    cores.start(1, 1.0, 0.0)
    assert cores.start(2, 1.0, 0.0) == [(1.0, 2)]
    assert cores.running(0) is not None and cores.running(3) is None


def test_a_rank_blocked_in_an_allreduce_takes_no_share() -> None:
    """Ranks 0 and 1 (stage 0, replicated) run F 1 s, B 1 s and one allreduce of 1 MB over a slow link; rank 2
    (stage 1) runs one F of 4 s. One host of 2 cores. By hand: three ranks compute at 1/1.5 speed, so the
    replicas' F ends at 1.5 and their B at 3.0; rank 2 has done 2 of its 4 s by then and, the replicas now
    blocked in their allreduce, does the other 2 alone: it ends at 5.0."""
    sched = Schedule("dp", [[0, 1], [2]], 1, 1, {
        0: [Action(0, Kind.F, 0), Action(0, Kind.B, 0), Action(0, Kind.ALLREDUCE, 0)],
        1: [Action(0, Kind.F, 1), Action(0, Kind.B, 1), Action(0, Kind.ALLREDUCE, 1)],
        2: [Action(1, Kind.F, 0)]})
    costs = [StageCost(1.0, 1.0, 0.0, 0.0, 1e6, buckets=[(1.0, 1e6)]), StageCost(4.0, 0.0, 0.0, 0.0, 0.0)]
    cluster = Cluster(name="slow", levels=[(3, 1e5)], latency_s=0.0)  # the allreduce takes 10 s
    tr = run(sched, costs, Network(cluster), cores=Cores(Host(cores=2, ranks_per_host=3)))
    assert [(sp.start, sp.end) for sp in tr.compute[0]] == [pytest.approx((0.0, 1.5)), pytest.approx((1.5, 3.0))]
    assert tr.compute[2][0].end == pytest.approx(5.0)
    assert tr.makespan_s == pytest.approx(3.0 + 1e6 / 1e5)  # then the ring: 2 (n - 1) / n of 1 MB at 1e5 B/s
