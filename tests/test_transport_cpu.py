"""The transport's CPU on a CPU host: hand-computed charges per action, the prediction's work, and the probe."""

from __future__ import annotations

import pytest

from pipedream.runtime.allreduce_cost import allreduce_cost, measure_allreduce_cpu_s
from pipedream.runtime.message_cost import message_end_cpu_s
from pipedream.schedules import Action, Kind, Schedule
from pipedream.sim.cores import Cores
from pipedream.sim.costs import StageCost
from pipedream.sim.engine import run
from pipedream.sim.network import Network
from pipedream.sim.predict import EpochShape, predict_epoch
from pipedream.sim.profiled import profiled_host
from pipedream.sim.transport_cpu import allreduce_cpu_of, allreduce_cpu_s, measured_allreduce_cpu_s, with_transport_cpu
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
    none = {"contention": 1.0, "oversubscribed": None, "message_s": 0.0, "message_s_per_byte": 0.0, "allreduce_s": {},
            "layouts": ()}
    # below 1 is noise: other copies cannot speed a step up
    assert profiled_host(meta, 2) == {"contention": 1.1, "oversubscribed": 1.0, "message_s": 1e-4,
                                      "message_s_per_byte": 4e-10, "allreduce_s": {}, "layouts": (0.9, 1.1)}
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


def test_the_measured_allreduce_is_read_per_member_count_and_malformed_lines_are_left_out() -> None:
    """``host.allreduce_s`` as the profiler writes it (JSON keys are strings): counts 2 and 4 kept, a negative
    part clipped to 0 (noise), a count below 2, a non-count, a short line and a text left out."""
    meta = {"host": {"cores": 2, "allreduce_s": {"2": [1e-3, 5e-10], "4": [-1e-4, 6e-10], "1": [1.0, 1.0],
                                                 "x": [1.0, 1.0], "3": [1.0], "5": "fast"}}}
    assert profiled_host(meta, 2)["allreduce_s"] == {2: (1e-3, 5e-10), 4: (0.0, 6e-10)}
    assert profiled_host(meta, 4)["allreduce_s"] == {}  # another host


def test_a_measured_allreduce_takes_its_member_counts_line_or_scales_the_nearest_as_a_ring() -> None:
    """Measured over 2 (1 ms + 1 ns/byte) and 4 (2 ms + 0.5 ns/byte). 4 MB over 4: 2 + 2 = 4 ms; over 2: 1 + 4 =
    5 ms; over 3, from 2: the fixed part x 2/1 steps = 2 ms, the bytes x (2/3) / (1/2) = 4/3: 4 MB x 1 ns x 4/3 =
    5.33 ms, 7.33 ms in all; over 8, from 4: 2 ms x 7/3 + 2 ms x (7/8) / (3/4) = 4.67 + 2.33 = 7 ms; one member:
    nothing; an empty table: refused."""
    table = {2: (1e-3, 1e-9), 4: (2e-3, 5e-10)}
    assert measured_allreduce_cpu_s(table, 4, 4e6) == pytest.approx(4e-3)
    assert measured_allreduce_cpu_s(table, 2, 4e6) == pytest.approx(5e-3)
    assert measured_allreduce_cpu_s(table, 3, 4e6) == pytest.approx(2e-3 + 4e-3 * 4 / 3)
    assert measured_allreduce_cpu_s(table, 8, 4e6) == pytest.approx(7e-3)
    assert measured_allreduce_cpu_s({4: (2e-3, 5e-10)}, 2, 4e6) == pytest.approx(2e-3 / 3 + 2e-3 * (1 / 2) / (3 / 4))
    assert measured_allreduce_cpu_s(table, 1, 4e6) == 0.0
    with pytest.raises(ValueError, match="empty"):
        measured_allreduce_cpu_s({}, 4, 4e6)


def test_a_replicated_backward_pays_the_measured_allreduce_when_given_one() -> None:
    """The buckets of the hand charge above (4 replicas, 1000 / 2000 / 3000 bytes ready 0.5 / 1.5 / 2.0 s into a
    2 s backward) with a measured allreduce of 10 ms + 10 us/byte a member: 20 ms and 30 ms in the backward, the
    ready times 0.5 / 1.52 / 2.05 s; with no message cost measured the allreduce is still charged."""
    dp = StageCost(1.0, 2.0, 0.0, 0.0, 6000.0, [(0.5, 1000.0), (1.5, 2000.0), (2.0, 3000.0)], 0.25)
    seen = []

    def measured(members: int, nbytes: float) -> float:
        seen.append(members)
        return 1e-2 + 1e-5 * nbytes

    for fixed, per_byte in ((1e-3, 1e-5), (0.0, 0.0)):
        got, = with_transport_cpu([dp], fixed, per_byte, [4], measured)
        assert got.bwd_s == pytest.approx(2.05) and got.buckets_cpu_in_bwd == 2
        assert [x for b in got.buckets for x in b] == pytest.approx([0.5, 1000.0, 1.52, 2000.0, 2.05, 3000.0])
    assert seen == [4, 4, 4, 4]


def test_the_prediction_takes_the_measured_allreduce_where_the_profile_has_one() -> None:
    """DP over 4 ranks on 2 cores, two layers of 2 MB of parameters each (buckets of 1 MiB first: two buckets or
    more). A measured table that says what the message-cost estimate says (4 (n - 1) ends of 1/n of a bucket: over
    4, 12 x 0.5 ms fixed and 12/4 x 1 ns a byte) predicts the same epoch to the last digit; a table of free
    allreduces predicts a shorter one, as does the estimate with free messages, the same."""
    g = chain(2, 0.05, 0.1, act_bytes=1e5, param_bytes=2e6)
    args = (g, [["node1", "node2"]], [[0, 1, 2, 3]], Cluster("c", [(4, 1e12)]), EpochShape("dp", 8, 1, 8, 256))
    estimate = predict_epoch(*args, cores=2, message_s=5e-4, message_s_per_byte=1e-9)
    same = predict_epoch(*args, cores=2, message_s=5e-4, message_s_per_byte=1e-9,
                         allreduce_s={4: (12 * 5e-4, 3 * 1e-9)})
    assert same.epoch_s == pytest.approx(estimate.epoch_s, rel=1e-12)
    free = predict_epoch(*args, cores=2, message_s=5e-4, message_s_per_byte=1e-9, allreduce_s={4: (0.0, 0.0)})
    no_messages = predict_epoch(*args, cores=2)
    assert free.epoch_s < estimate.epoch_s
    assert free.epoch_s == pytest.approx(no_messages.epoch_s, rel=1e-12)  # DP sends no activations
    assert same.sim_kwargs["allreduce_s"] == {"4": pytest.approx([12 * 5e-4, 3e-9])}


def test_the_allreduce_probe_refuses_what_it_cannot_measure() -> None:
    with pytest.raises(ValueError, match="2 members or more"):
        measure_allreduce_cpu_s(1, (4096,), (2,))
    with pytest.raises(ValueError, match="one positive call count per size"):
        measure_allreduce_cpu_s(2, (4096, 8192), (2,))


@pytest.mark.slow
def test_the_allreduce_probe_measures_a_positive_cost_that_grows_with_the_bytes() -> None:
    """Two gloo processes allreduce 4 KiB and 4 MiB: each costs a member some CPU, the larger more (a thousand
    times the bytes), neither near the 0.1 s that would mean a wait on a timeout; the line through them is
    non-negative."""
    small, large = measure_allreduce_cpu_s(2, (4096, 4 << 20), (8, 4), rounds=1, timeout_s=60.0)
    assert 0.0 < small < large < 0.1
    fixed, per_byte = allreduce_cost(2, 4096, 4 << 20, rounds=1)
    assert fixed >= 0.0 and per_byte > 0.0


def test_a_prediction_charges_the_measured_allreduce_else_the_estimate_else_nothing() -> None:
    """4 MB over 4: measured (2 ms + 0.5 ns/byte) 4 ms even where a message cost is known; without the table the
    message-cost estimate (12 ends of 1 MB at 100 us + 1 ns/byte: 13.2 ms); with neither, no charge."""
    measured = allreduce_cpu_of({4: (2e-3, 5e-10)}, 1e-4, 1e-9)
    assert measured is not None and measured(4, 4e6) == pytest.approx(4e-3)
    estimate = allreduce_cpu_of({}, 1e-4, 1e-9)
    assert estimate is not None and estimate(4, 4e6) == pytest.approx(0.0132)
    assert allreduce_cpu_of(None, 0.0, 0.0) is None
