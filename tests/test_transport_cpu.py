"""The transport's CPU on a CPU host: hand-computed charges per action, the prediction's work, and the probe."""

from __future__ import annotations

import pytest

from pipedream.runtime.message_cost import message_end_cpu_s
from pipedream.schedules import Action, Kind, Schedule
from pipedream.sim.cores import Cores
from pipedream.sim.costs import StageCost
from pipedream.sim.engine import run
from pipedream.sim.network import Network
from pipedream.sim.predict import EpochShape, predict_epoch
from pipedream.sim.profiled import profiled_host
from pipedream.sim.transport_cpu import allreduce_cpu_s, with_transport_cpu
from pipedream.topology import Cluster
from tests.test_predict import chain


def test_each_action_pays_the_message_ends_it_sends_and_receives() -> None:
    """3 stages sending 100 / 50 bytes forward and 40 / 30 back; a message end costs 1 ms + 10 us/byte. Stage 1's
    forward receives 100 and sends 50, its backward receives 30 and sends 40; its step (after a gradient
    allreduce, whose CPU the simulator runs beside the actions: allreduce_cpu_s) is unchanged."""
    costs = [StageCost(1.0, 2.0, 100.0, 0.0, 0.0), StageCost(1.0, 2.0, 50.0, 40.0, 1000.0, [(0.5, 1000.0)], 0.25),
             StageCost(1.0, 2.0, 0.0, 30.0, 0.0)]
    got = with_transport_cpu(costs, 1e-3, 1e-5)

    def end(b: float) -> float:
        return 1e-3 + 1e-5 * b

    assert [x for c in got for x in (c.fwd_s, c.bwd_s, c.step_s)] == pytest.approx([
        1.0 + end(100), 2.0 + end(40), 0.0,
        1.0 + end(100) + end(50), 2.0 + end(30) + end(40), 0.25,
        1.0 + end(50), 2.0 + end(30), 0.0])
    assert with_transport_cpu(costs, 0.0, 0.0) == costs  # nothing measured: unchanged
    dp = [StageCost(1.0, 2.0, 0.0, 0.0, 1000.0, [(0.5, 1000.0)], 0.25)]
    assert with_transport_cpu(dp, 1e-3, 1e-5) == dp  # one stage (DP): no activations to send


def test_a_replicated_backward_pays_the_allreduces_of_the_buckets_launched_while_it_goes_on() -> None:
    """4 replicas, buckets of 1000, 2000 and 3000 bytes ready 0.5, 1.5 and 2.0 s into a 2 s backward; a message
    end costs 1 ms + 10 us/byte. A ring over 4 costs each member 12 ends of a quarter bucket: 12 x 3.5 ms = 42 ms
    for the first, 12 x 6 ms = 72 ms for the second, both in the backward; the second is ready 42 ms later, the
    last 114 ms later, and its own CPU stays the simulator's background work. One replica, or one bucket: nothing."""
    dp = StageCost(1.0, 2.0, 0.0, 0.0, 6000.0, [(0.5, 1000.0), (1.5, 2000.0), (2.0, 3000.0)], 0.25)
    got, = with_transport_cpu([dp], 1e-3, 1e-5, [4])
    assert got.bwd_s == pytest.approx(2.114) and got.fwd_s == 1.0 and got.step_s == 0.25
    assert [x for b in got.buckets for x in b] == pytest.approx([0.5, 1000.0, 1.542, 2000.0, 2.114, 3000.0])
    assert got.buckets_cpu_in_bwd == 2
    assert with_transport_cpu([dp], 1e-3, 1e-5, [1]) == [dp]
    one_bucket = StageCost(1.0, 2.0, 0.0, 0.0, 6000.0, [(2.0, 6000.0)])
    assert with_transport_cpu([one_bucket], 1e-3, 1e-5, [4]) == [one_bucket]
    with pytest.raises(ValueError, match="one count per stage"):
        with_transport_cpu([dp], 1e-3, 1e-5, [4, 1])


def test_an_early_buckets_cpu_delays_the_last_launch_and_only_the_last_runs_beside() -> None:
    """Two replicas on one core (each at 1/n speed), F 1 s, B 2 s, step 1 s; bucket 0 (100 kB) ready 0.5 s and
    bucket 1 (200 kB) 2 s into the backward; the link moves 100 kB/s (a ring over 2: a bucket's bytes); a bucket's
    allreduce costs each member 4 x 0.25 s = 1 s of CPU. By hand: the forwards end at 2; the backwards, 2 + 1 s of
    work each at half speed, at 8; bucket 0 is ready at 2 + 0.5 x 2 = 3 and on the link 3-4, bucket 1 at 8 and
    on the link 8-10; bucket 1's CPU, 1 s a replica beside nothing else, runs 8-10 at half speed; the steps 10-12.
    (Both buckets' CPU as background from 8, the model before: the backwards end at 6 and the replicas step at 8.)"""
    sched = Schedule("dp", [[0, 1]], 1, 1, {
        r: [Action(0, Kind.F, r), Action(0, Kind.B, r), Action(0, Kind.ALLREDUCE, r), Action(0, Kind.STEP, r)]
        for r in (0, 1)})
    raw = StageCost(1.0, 2.0, 0.0, 0.0, 3e5, buckets=[(0.5, 1e5), (2.0, 2e5)], step_s=1.0)
    costs = with_transport_cpu([raw], 0.25, 0.0, [2])
    cluster = Cluster(name="slow", levels=[(2, 1e5)], latency_s=0.0)
    tr = run(sched, costs, Network(cluster),
             cores=Cores(lambda n: float(n), collective_cpu=lambda n, nbytes: allreduce_cpu_s(n, nbytes, 0.25, 0.0)))
    assert [sp.end for sp in tr.compute[0]] == pytest.approx([2.0, 8.0])
    assert [x for sp in sorted(tr.collectives, key=lambda sp: sp.start) for x in (sp.start, sp.end)] == pytest.approx(
        [3.0, 4.0, 8.0, 10.0])
    assert [x for sp in sorted(tr.background, key=lambda sp: sp.rank) for x in (sp.rank, sp.start, sp.end, sp.work_s)] \
        == pytest.approx([0, 8.0, 10.0, 1.0, 1, 8.0, 10.0, 1.0])
    assert tr.makespan_s == pytest.approx(12.0)


def test_the_prediction_charges_the_transport_on_shared_cores_only() -> None:
    """2 stages, F = 1 s, B = 2 s, 100-byte activations and gradients, 6 minibatches; a message end costs 0.1 s +
    1 ms/byte = 0.2 s. On a host each stage's forward and backward each pay one end: 6 x (3 + 0.4) s of work
    per stage, while the compute the runtime times stays 6 x 3 s (2 ranks on 2 cores: no sharing). On GPUs
    (cores None) nothing is charged."""
    g = chain(2, 1.0, 2.0, act_bytes=100.0)
    shape = EpochShape("1f1b", 8, 1, 6, 48)
    args = (g, [["node1"], ["node2"]], [[0], [1]], Cluster("c", [(2, 1e12)]), shape)
    host = predict_epoch(*args, cores=2, message_s=0.1, message_s_per_byte=1e-3)
    assert host.work_s == pytest.approx([6 * 3.4, 6 * 3.4])
    assert host.compute_s == pytest.approx([18.0, 18.0])
    gpu = predict_epoch(*args, cores=None, message_s=0.1, message_s_per_byte=1e-3)
    assert gpu.work_s == pytest.approx([18.0, 18.0])
    assert host.epoch_s > gpu.epoch_s


def test_host_measurements_are_read_only_from_a_profile_of_this_host() -> None:
    meta = {"host": {"cores": 2, "contention": 1.1, "oversubscribed": 0.9, "message_s": 1e-4,
                     "message_s_per_byte": 4e-10, "layouts": [0.9, 1.1]}}
    none = {"contention": 1.0, "oversubscribed": None, "message_s": 0.0, "message_s_per_byte": 0.0, "layouts": ()}
    # below 1 is noise: other copies cannot speed a step up
    assert profiled_host(meta, 2) == {"contention": 1.1, "oversubscribed": 1.0, "message_s": 1e-4,
                                      "message_s_per_byte": 4e-10, "layouts": (0.9, 1.1)}
    assert profiled_host(meta, 4) == none  # another host
    assert profiled_host(meta, None) == none  # GPUs
    assert profiled_host({}, 2) == none  # the release's profiles
    assert profiled_host({"host": {"cores": 2, "contention": 1.05}}, 2) == {**none, "contention": 1.05}  # older


@pytest.mark.slow
def test_the_probe_measures_a_positive_cost_through_the_runtimes_transport() -> None:
    """Two processes bounce 50 small messages through :class:`pipedream.runtime.comm.P2P` on gloo: each end
    costs some CPU (gloo's threads included), well under the 0.1 s that would mean the probe waited on a timeout."""
    cost = message_end_cpu_s(256, messages=50, timeout_s=60.0)
    assert 0.0 < cost < 0.1


def test_a_ring_allreduce_costs_each_member_four_n_minus_one_chunk_ends() -> None:
    """3 replicas, 3 MB: reduce-scatter and all-gather take 2 steps each, every step one send and one receive
    of a 1 MB chunk: 8 ends of (50 us + 1e6 B * 1 ns) = 8.4 ms; one replica reduces nothing."""
    assert allreduce_cpu_s(3, 3e6, 50e-6, 1e-9) == pytest.approx(8 * 1.05e-3)
    assert allreduce_cpu_s(1, 3e6, 50e-6, 1e-9) == 0.0
