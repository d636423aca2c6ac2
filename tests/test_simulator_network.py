"""Links and allreduce of the simulator: hand-computed transfer times, contention, ring formulas with latency."""

from __future__ import annotations

import pytest

from pipedream.errors import PipeDreamError
from pipedream.sim.network import Network
from pipedream.topology import Cluster

GB = 1e9


def two_level(gpus: int = 4, servers: int = 2, inner: float = 10 * GB, outer: float = 1 * GB,
              latency_s: float = 0.0) -> Cluster:
    """Servers x GPUs; no latency unless given, so the contention checks below are bytes over bandwidth."""
    return Cluster(name="t", levels=[(gpus, inner), (servers, outer)], latency_s=latency_s)


def test_transfer_time_is_bytes_over_bottleneck_bandwidth() -> None:
    net = Network(two_level())
    assert net.transfer_time(0, 1, 5 * GB) == pytest.approx(0.5)  # same server: 5 GB / 10 GB/s
    assert net.transfer_time(0, 4, 5 * GB) == pytest.approx(5.0)  # across servers: 5 GB / 1 GB/s
    assert net.transfer_time(3, 3, 5 * GB) == 0.0
    assert net.meet_level(0, 3) == 0 and net.meet_level(3, 4) == 1


def test_top_level_is_the_highest_meet_level_of_any_pair() -> None:
    import random

    rng = random.Random(0)
    net = Network(Cluster(name="t3", levels=[(2, 10 * GB), (3, 5 * GB), (2, 1 * GB)]))  # 12 ranks, 3 levels
    for _ in range(200):
        ranks = rng.sample(range(12), rng.randint(1, 6))
        pairs = max((net.meet_level(a, b) for a in ranks for b in ranks), default=-1)
        assert net.top_level(ranks) == pairs, ranks
    assert net.top_level([0, 1]) == 0 and net.top_level([0, 2]) == 1 and net.top_level([1, 6]) == 2
    assert net.top_level([5]) == -1


def test_bookings_out_of_order_keep_earliest_fit() -> None:
    net = Network(two_level())
    assert net.send(0, 4, 1 * GB, ready_s=5.0) == pytest.approx((5.0, 6.0))  # booked first, later in time
    assert net.send(1, 5, 1 * GB, ready_s=0.0) == pytest.approx((0.0, 1.0))  # fits in the gap before it
    assert net.send(2, 6, 1 * GB, ready_s=4.5) == pytest.approx((6.0, 7.0))  # overlaps it: after it
    assert net.send(3, 7, 1 * GB, ready_s=0.5) == pytest.approx((1.0, 2.0))  # after the gap's booking


def test_transfer_pays_the_cluster_latency_once() -> None:
    net = Network(two_level(latency_s=0.25))
    assert net.transfer_time(0, 4, 5 * GB) == pytest.approx(0.25 + 5.0)
    assert net.send(0, 1, 1 * GB, ready_s=1.0) == pytest.approx((1.0, 1.0 + 0.25 + 0.1))
    assert net.transfer_time(3, 3, 5 * GB) == 0.0  # a rank to itself: nothing crosses a link


def test_one_send_alone_on_a_link() -> None:
    net = Network(two_level())
    assert net.send(0, 4, 2 * GB, ready_s=1.0) == pytest.approx((1.0, 3.0))


def test_two_sends_through_one_nic_share_it() -> None:
    """GPUs 0 and 1 of server 0 both send 1 GB to server 1 at t=0: the NIC carries them one after the other."""
    net = Network(two_level())
    assert net.send(0, 4, 1 * GB, 0.0) == pytest.approx((0.0, 1.0))
    assert net.send(1, 5, 1 * GB, 0.0) == pytest.approx((1.0, 2.0))


def test_sends_on_disjoint_ports_run_in_parallel() -> None:
    net = Network(two_level())
    assert net.send(0, 1, 1 * GB, 0.0) == pytest.approx((0.0, 0.1))
    assert net.send(2, 3, 1 * GB, 0.0) == pytest.approx((0.0, 0.1))
    # opposite directions of the same link are separate (full duplex)
    net = Network(two_level())
    assert net.send(4, 0, 1 * GB, 0.0) == pytest.approx((0.0, 1.0))
    assert net.send(0, 4, 1 * GB, 0.0) == pytest.approx((0.0, 1.0))


def test_intra_server_send_contends_with_the_gpu_port_of_a_cross_server_send() -> None:
    net = Network(two_level())
    assert net.send(0, 4, 1 * GB, 0.0) == pytest.approx((0.0, 1.0))  # holds GPU 0's port for 1 s
    assert net.send(0, 1, 1 * GB, 0.5) == pytest.approx((1.0, 1.1))
    # earliest fit: a later booking may use a gap before an earlier one
    assert net.send(2, 3, 1 * GB, 5.0) == pytest.approx((5.0, 5.1))
    assert net.send(2, 3, 1 * GB, 4.0) == pytest.approx((4.0, 4.1))


@pytest.mark.parametrize("n", [2, 3, 4, 8, 16])
def test_ring_allreduce_formula(n: int) -> None:
    """2 (n - 1) latency + 2 (n - 1) / n * bytes / bandwidth on one level, for both allreduce kinds."""
    flat = Cluster(name="flat", levels=[(16, 2 * GB)], latency_s=1e-3)
    for kind in ("ring", "hierarchical"):
        net = Network(flat, kind)
        expected = 2 * (n - 1) * 1e-3 + 2 * (n - 1) / n * 3 * GB / (2 * GB)
        assert net.allreduce_time(list(range(n)), 3 * GB) == pytest.approx(expected, rel=1e-12)
        assert net.allreduce_time(list(range(n)), 3 * GB) == pytest.approx(expected, rel=1e-12)  # cached
        assert net.allreduce_bytes(list(range(n)), 3 * GB) == pytest.approx(2 * (n - 1) * 3 * GB)
    assert Network(flat).allreduce_time([5], 3 * GB) == 0.0  # one rank: nothing to reduce, no latency


def test_hierarchical_allreduce_sums_one_ring_per_level() -> None:
    lat = 1e-4
    c = two_level(gpus=4, servers=4, inner=15.75 * GB, outer=1.25 * GB, latency_s=lat)  # cluster A
    s = 0.5 * GB
    hier = Network(c, "hierarchical").allreduce_time(list(range(16)), s)
    assert hier == pytest.approx(2 * 3 * lat + 2 * 3 / 4 * s / (15.75 * GB) + 2 * 3 * lat + 2 * 3 / 4 * s / (1.25 * GB))
    ring = Network(c, "ring").allreduce_time(list(range(16)), s)
    assert ring == pytest.approx(2 * 15 * lat + 2 * 15 / 16 * s / (1.25 * GB))
    # 15 ranks (a 15-1 plan's first stage): 4 GPUs in the fullest server, 4 servers
    assert Network(c).allreduce_time(list(range(15)), s) == pytest.approx(hier)
    # inside one server only the inner level counts
    assert Network(c).allreduce_time([4, 5, 6], s) == pytest.approx(2 * 2 * lat + 2 * 2 / 3 * s / (15.75 * GB))
    # bytes: three 4-GPU rings and one 3-GPU ring inside, a 4-server ring across
    assert Network(c).allreduce_bytes(list(range(15)), s) == pytest.approx((3 * 6 + 4 + 6) * s)


def test_allreduce_contends_with_transfers_only_when_exclusive() -> None:
    net = Network(two_level(), contention="exclusive")
    assert net.send(0, 4, 1 * GB, 0.0) == pytest.approx((0.0, 1.0))
    start, end = net.collective([0, 4], 1 * GB, 0.0)  # 2 (2-1)/2 * 1 GB / 1 GB/s = 1 s
    assert (start, end) == pytest.approx((1.0, 2.0))
    lanes = Network(two_level())  # default: separate lanes, the collective does not queue behind the send
    assert lanes.send(0, 4, 1 * GB, 0.0) == pytest.approx((0.0, 1.0))
    assert lanes.collective([0, 4], 1 * GB, 0.0) == pytest.approx((0.0, 1.0))
    assert lanes.collective([0, 4], 1 * GB, 0.0) == pytest.approx((1.0, 2.0))  # collectives still queue


def test_errors_name_the_problem() -> None:
    with pytest.raises(PipeDreamError, match="unknown allreduce"):
        Network(two_level(), "tree")
    with pytest.raises(PipeDreamError, match="unknown contention"):
        Network(two_level(), contention="fair")
    with pytest.raises(PipeDreamError, match="rank 8 is outside cluster"):
        Network(two_level()).check_rank(8)
