"""Processor sharing of a host's cores (pipedream/sim/cores.py) against hand computations."""

from __future__ import annotations

import pytest

from pipedream.schedules import Action, Kind, Schedule
from pipedream.sim.cores import Cores
from pipedream.sim.costs import StageCost
from pipedream.sim.engine import Trace, run
from pipedream.sim.network import Network
from pipedream.topology import Cluster


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


def test_a_background_job_on_a_named_host_shares_it() -> None:
    """A collective's CPU (a negative key, :mod:`pipedream.sim.cores`) on host 1: it shares that host's core
    with rank 2 (both at half speed), not host 0's."""
    cores = Cores(one_core, host_of=lambda r: 0 if r < 2 else 1)
    cores.start(0, 1.0, 0.0)
    cores.start(2, 2.0, 0.0)
    ends = dict((r, t) for t, r in cores.start(-1, 0.5, 0.0, host=1))
    assert ends == pytest.approx({2: 4.0, -1: 1.0})  # rank 0 (host 0) keeps its end at 1.0


def two_replicas_beside_a_third_rank(collective_cpu: float | None) -> Trace:
    """Ranks 0 and 1 (stage 0, replicated) run F 1 s, B 1 s and one allreduce of 1 MB over a slow link; rank 2
    (stage 1, on its own) runs one F of 4 s. One host of 2 cores: n computing share them (``max(1, n / 2)``)."""
    sched = Schedule("dp", [[0, 1], [2]], 1, 1, {
        0: [Action(0, Kind.F, 0), Action(0, Kind.B, 0), Action(0, Kind.ALLREDUCE, 0)],
        1: [Action(0, Kind.F, 1), Action(0, Kind.B, 1), Action(0, Kind.ALLREDUCE, 1)],
        2: [Action(1, Kind.F, 0)]})
    costs = [StageCost(1.0, 1.0, 0.0, 0.0, 1e6, buckets=[(1.0, 1e6)]), StageCost(4.0, 0.0, 0.0, 0.0, 0.0)]
    cluster = Cluster(name="slow", levels=[(3, 1e5)], latency_s=0.0)  # the allreduce's link takes ~13 s
    cpu = None if collective_cpu is None else (lambda n, nbytes: collective_cpu)
    return run(sched, costs, Network(cluster), cores=Cores(lambda n: max(1.0, n / 2), collective_cpu=cpu))


def test_an_allreduces_cpu_slows_a_rank_computing_beside_it() -> None:
    """By hand: three ranks compute at 1/1.5 speed, so the replicas' F ends at 1.5 and B at 3.0; rank 2 has
    done 2 of its 4 s by then. Without the collective's CPU rank 2 is then alone: it ends at 5.0. With 1 s of
    CPU for each replica from the bucket's start (3.0), three jobs again run at 1/1.5: the two end at 4.5,
    when rank 2 has 1 s left, done alone by 5.5."""
    without = two_replicas_beside_a_third_rank(None)
    with_cpu = two_replicas_beside_a_third_rank(1.0)
    assert without.compute[2][0].end == pytest.approx(5.0) and not without.background
    assert with_cpu.compute[2][0].end == pytest.approx(5.5)
    spans = sorted((s.rank, s.start, s.end, s.work_s) for s in with_cpu.background)
    assert [v for sp in spans for v in sp] == pytest.approx([0, 3.0, 4.5, 1.0, 1, 3.0, 4.5, 1.0])
    assert with_cpu.makespan_s == without.makespan_s  # the replicas wait for the link either way


def test_without_sharing_a_collective_has_no_cpu_job() -> None:
    """On GPUs (no ``slowdown``) the collective's CPU is not the prediction's: Cores drops it."""
    assert Cores(None, collective_cpu=lambda n, b: 1.0).collective_cpu is None
