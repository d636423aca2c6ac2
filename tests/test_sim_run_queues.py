"""Per-core run queues (pipedream/sim/run_queues.py) against hand computations, and where they equal the fluid
model of pipedream/sim/cores.py."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from pipedream.errors import PipeDreamError
from pipedream.schedules import Action, Kind, Schedule
from pipedream.sim.cores import Cores
from pipedream.sim.costs import StageCost
from pipedream.sim.engine import run
from pipedream.sim.network import Network
from pipedream.sim.predict import EpochShape, predict_epoch
from pipedream.sim.run_queues import DEFAULT_TICK_S, QueuedCores, RunQueues, make_cores, scheduler_tick_s
from pipedream.topology import Cluster
from tests.test_predict import chain


def shared(n: int) -> float:
    return max(1.0, n / 2)  # the fluid slowdown on 2 cores, no contention


def ends(pairs: list[tuple[float, int]]) -> dict[int, float]:
    return {r: t for t, r in pairs}


def test_an_idle_core_takes_a_queued_action_only_at_the_next_tick() -> None:
    """2 cores, tick 4 ms. Ranks 0 (4 ms of work), 1 (2 ms) and 2 (4 ms) start at 0: 0 and 1 get a core each, 2
    queues behind 0 (the least loaded core, the first of a tie). Rank 1 ends at 2 ms; its core idles until the
    tick at 4 ms, when rank 2 (the later start) moves there: by then 0 and 2 have 2 ms left each, done at full
    speed by 6 ms. The fluid model shares 2 cores 3 ways: rank 1 ends at 3 ms, the others at 5 ms."""
    queued = QueuedCores(shared, RunQueues(2, 0.004))
    queued.start(0, 0.004, 0.0)
    queued.start(1, 0.002, 0.0)
    assert ends(queued.start(2, 0.004, 0.0)) == pytest.approx({0: 0.008, 1: 0.002, 2: 0.008})
    _, moved = queued.finish(1, 0.002)
    assert ends(moved) == pytest.approx({0: 0.006, 2: 0.006})
    assert queued.core_of == {0: 0, 2: 0}  # the move happens at the tick, not before
    job, moved = queued.finish(0, 0.006)
    assert job.work_s == 0.004 and moved == [(pytest.approx(0.006), 2)] and queued.core_of == {2: 1}
    fluid = Cores(shared)
    fluid.start(0, 0.004, 0.0)
    fluid.start(1, 0.002, 0.0)
    fluid.start(2, 0.004, 0.0)
    _, moved = fluid.finish(1, 0.003)
    assert ends(moved) == pytest.approx({0: 0.005, 2: 0.005})


def test_a_rank_that_goes_on_computing_stays_on_its_core_and_one_that_woke_takes_an_idle_one() -> None:
    """Tick 1 s. Rank 0 (10 s) and rank 2 (1 s) share core 0, rank 1 (1 s) has core 1. Rank 1 ends at 1; rank 2
    at half speed ends at 2, when rank 0 has 9 s left. Rank 2 then starts 4 s more:
    - at once (no wait): it stays on core 0 beside rank 0, both at half speed until the tick at 3 moves it (the
      later start) to the idle core: 3.5 s left, so it ends at 6.5; rank 0, 8.5 s left, at 11.5;
    - after waiting until 3: it wakes on the idle core 1, ends at 7; rank 0 ran alone from 2, ends at 11."""
    for start, expected in ((2.0, {0: 11.5, 2: 6.5}), (3.0, {0: 11.0, 2: 7.0})):
        queued = QueuedCores(shared, RunQueues(2, 1.0))
        queued.start(0, 10.0, 0.0)
        queued.start(1, 1.0, 0.0)
        queued.start(2, 1.0, 0.0)
        queued.finish(1, 1.0)
        queued.finish(2, 2.0)
        assert ends(queued.start(2, 4.0, start)) == pytest.approx(expected)
        _, moved = queued.finish(2, expected[2])
        assert moved == [(pytest.approx(expected[0]), 0)]


def test_a_core_shared_two_ways_runs_each_at_half_speed_with_the_hosts_contention() -> None:
    """Contention 1.2 with every core busy (the fluid slowdown over its sharing factor): 2 actions on 2 cores
    each run at 1 / 1.2; a third queued beside one makes that core's two run at 1 / (2 x 1.2)."""
    queued = QueuedCores(lambda n: max(1.0, n / 2) * (1.2 if n >= 2 else 1.0), RunQueues(2, 1.0))
    assert ends(queued.start(0, 1.0, 0.0)) == pytest.approx({0: 1.0})
    assert ends(queued.start(1, 1.0, 0.0)) == pytest.approx({0: 1.2, 1: 1.2})
    assert ends(queued.start(2, 1.0, 0.0)) == pytest.approx({0: 2.4, 1: 1.2, 2: 2.4})


def test_hosts_keep_queues_of_their_own() -> None:
    """Ranks 0-2 on host 0 (2 cores), rank 3 on host 1: rank 3 has a core alone whatever host 0 does."""
    queued = QueuedCores(shared, RunQueues(2, 1.0), host_of=lambda r: 0 if r < 3 else 1)
    for r in range(3):
        queued.start(r, 1.0, 0.0)
    assert queued.start(3, 1.0, 0.0) == [(1.0, 3)]


def test_the_queues_run_an_allreduce_beside_a_third_rank_by_hand() -> None:
    """test_sim_cores's two replicas (F 1 s, B 1 s, an allreduce over a slow link) beside rank 2 (F 4 s) on 2
    cores, tick 1 s. Rank 0 and rank 1 take a core each, rank 2 queues behind rank 0: rank 1's F and B end at 1
    and 2; rank 0's F at half speed ends at 2 and its B goes on beside rank 2 (no wake-up) while core 1 idles
    until the tick at 3 moves the B (the later start) there: 0.5 s of it left, it ends at 3.5; rank 2 has done
    1.5 s by 3 and ends at 5.5. (The fluid model: 5.0.)"""
    sched = Schedule("dp", [[0, 1], [2]], 1, 1, {
        0: [Action(0, Kind.F, 0), Action(0, Kind.B, 0), Action(0, Kind.ALLREDUCE, 0)],
        1: [Action(0, Kind.F, 1), Action(0, Kind.B, 1), Action(0, Kind.ALLREDUCE, 1)],
        2: [Action(1, Kind.F, 0)]})
    costs = [StageCost(1.0, 1.0, 0.0, 0.0, 1e6, buckets=[(1.0, 1e6)]), StageCost(4.0, 0.0, 0.0, 0.0, 0.0)]
    cluster = Cluster(name="slow", levels=[(3, 1e5)], latency_s=0.0)
    tr = run(sched, costs, Network(cluster), cores=QueuedCores(shared, RunQueues(2, 1.0)))
    assert [t for s in tr.compute[1] for t in (s.start, s.end)] == pytest.approx([0.0, 1.0, 1.0, 2.0])
    assert [t for s in tr.compute[0] for t in (s.start, s.end)] == pytest.approx([0.0, 2.0, 2.0, 3.5])
    assert tr.compute[2][0].end == pytest.approx(5.5)


def test_make_cores_takes_the_queues_only_with_sharing() -> None:
    assert type(make_cores(shared, RunQueues(2))) is QueuedCores
    assert type(make_cores(shared, None)) is Cores
    assert make_cores(None, RunQueues(2)).slowdown is None  # GPUs: no sharing at all


def test_run_queues_refuse_no_cores_or_no_tick() -> None:
    with pytest.raises(PipeDreamError, match="positive cores and tick"):
        RunQueues(0)
    with pytest.raises(PipeDreamError, match="positive cores and tick"):
        RunQueues(2, 0.0)


def test_the_tick_is_read_from_the_kernels_configuration(tmp_path: Path) -> None:
    gz, plain, bad = tmp_path / "config.gz", tmp_path / "config-6.1", tmp_path / "config-bad"
    with gzip.open(gz, "wt") as f:
        f.write("CONFIG_NO_HZ=y\nCONFIG_HZ_1000=y\nCONFIG_HZ=1000\n")
    plain.write_text("# CONFIG_HZ_250 is not set\nCONFIG_HZ=300\n")
    bad.write_text("CONFIG_HZ=fast\n")
    assert scheduler_tick_s((str(gz), str(plain))) == pytest.approx(0.001)
    assert scheduler_tick_s((str(tmp_path / "missing.gz"), str(plain))) == pytest.approx(1 / 300)
    assert scheduler_tick_s((str(bad),)) == DEFAULT_TICK_S
    assert scheduler_tick_s((str(tmp_path / "missing"),)) == DEFAULT_TICK_S


def pipeline(cores: int, threads: int = 1, tick_s: float | None = None) -> float:
    g = chain(4, 1e-3, 2e-3, act_bytes=1e5)
    return predict_epoch(g, [["node1"], ["node2"], ["node3"], ["node4"]], [[0], [1], [2], [3]],
                         Cluster("c", [(4, 1e9)]), EpochShape("1f1b", 8, 1, 40, 320), cores=cores, threads=threads,
                         tick_s=tick_s).epoch_s


def test_one_queue_per_core_is_the_fluid_model_on_one_core_or_with_a_core_per_rank() -> None:
    """One core: one queue, shared equally as the fluid model shares it. Four cores for four single-threaded
    ranks: each wakes on an idle core. Two threads a worker: the queues model single threads, the fluid model
    stays. On 2 cores the queues leave a core idle between ticks, which the fluid model never does."""
    assert pipeline(1, tick_s=0.004) == pytest.approx(pipeline(1), rel=1e-12)
    assert pipeline(4, tick_s=0.004) == pytest.approx(pipeline(4), rel=1e-12)
    assert pipeline(4, threads=2, tick_s=0.004) == pytest.approx(pipeline(4, threads=2), rel=1e-12)
    assert pipeline(2, tick_s=0.004) > pipeline(2) * 1.001


def test_a_short_epoch_gets_one_look_for_the_steady_state_then_is_simulated_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four uneven stages on 2 tick-balanced cores do not settle to a periodic state in runs of 10 to 120
    minibatches. Without the steady-state figures (as a prediction asks), an epoch of 64 minibatches gets one look
    (runs of 10, 20, 30), then is simulated once: its time is that of one event simulation of 64 minibatches. With
    them (the default) the search runs past the epoch, then simulates the epoch: the same time. Past
    EXACT_EPOCH_MINIBATCHES the search runs either way. On cores of their own the stages settle at once: an epoch
    of 640 minibatches is extrapolated from the one look, to the time of its exact simulation."""
    from pipedream.graph import LayerGraph, Node
    from pipedream.sim import simulate
    from pipedream.sim.costs import stage_costs

    g = LayerGraph(minibatch_size=8)
    for i, (f, b) in enumerate([(0.0031, 0.0067), (0.0043, 0.0081), (0.0029, 0.0059), (0.0052, 0.011)]):
        g.add_node(Node(f"n{i}", "Linear", f, b, (1e5,), 0.0))
        if i:
            g.add_edge(f"n{i - 1}", f"n{i}")
    nodes, ranks, cluster = [[f"n{i}"] for i in range(4)], [[i] for i in range(4)], Cluster("c", [(4, 1e9)])
    queues, lengths = RunQueues(2, 0.004), []
    real = simulate.run_minibatches

    def recorded(kind, stage_ranks, costs, net, n, *args, **kwargs):  # type: ignore[no-untyped-def]
        lengths.append(n)
        return real(kind, stage_ranks, costs, net, n, *args, **kwargs)

    monkeypatch.setattr(simulate, "run_minibatches", recorded)
    res = simulate.simulate_stages(g, nodes, ranks, cluster, dataset_size=8 * 64, sharing=shared, queues=queues,
                                   steady_figures=False)
    assert lengths == [10, 20, 30, 64]
    assert not res.steady_state_converged
    exact = real("1f1b", ranks, stage_costs(g, nodes, 8), cluster, 64, sharing=shared, queues=queues)
    assert res.epoch_time_s == pytest.approx(exact.makespan_s, rel=1e-12)
    lengths.clear()
    full = simulate.simulate_stages(g, nodes, ranks, cluster, dataset_size=8 * 64, sharing=shared, queues=queues)
    assert lengths[:7] == [10, 20, 30, 40, 60, 80, 120] and max(lengths) > 120 and lengths[-1] == 64
    assert full.epoch_time_s == res.epoch_time_s
    lengths.clear()
    monkeypatch.setattr(simulate, "EXACT_EPOCH_MINIBATCHES", 63)
    searched = simulate.simulate_stages(g, nodes, ranks, cluster, dataset_size=8 * 64, sharing=shared,
                                        queues=queues, steady_figures=False)
    assert lengths[:7] == [10, 20, 30, 40, 60, 80, 120] and lengths[-1] == 64
    assert searched.epoch_time_s == res.epoch_time_s
    lengths.clear()
    alone = simulate.simulate_stages(g, nodes, ranks, cluster, dataset_size=8 * 640, steady_figures=False)
    assert lengths == [10, 20, 30] and alone.steady_state_converged
    exact = real("1f1b", ranks, stage_costs(g, nodes, 8), cluster, 640)
    assert alone.epoch_time_s == pytest.approx(exact.makespan_s, rel=1e-9)
