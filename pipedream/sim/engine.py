"""Event-driven execution of per-rank action lists (pipedream.schedules) on a simulated cluster.

Each rank runs its list in order, like the runtime does: ``F``/``B`` occupy the rank for the stage's compute
time, and so do the two halves of a split backward, ``I`` and ``W`` (:attr:`pipedream.sim.costs.StageCost.split_s`);
a rank may run several stages (chunks), each priced by its own costs; ``SEND_*`` are asynchronous and occupy links
(:mod:`pipedream.sim.network`); ``RECV_*`` block until the
matching transfer has arrived; the k-th ``ALLREDUCE`` of every replica of a stage reduces the stage's gradient
buckets (:mod:`pipedream.sim.costs`) and ends when the slowest replica's gradients have been reduced; ``STEP``
occupies the rank for the stage's optimizer step, after the sums of its tied tensors' gradients (the k-th
``STEP`` of every rank of the stages holding a tied tensor joins one collective of its bytes, as
:class:`pipedream.runtime.shared.SharedGrads` runs them). Ranks are advanced in global time order (a heap keyed by
their clocks), so links are booked in the order the sends are issued.

Buckets, as DDP and the runtime reduce them: one collective per bucket
(:meth:`pipedream.sim.network.Network.allreduce_time`, latency included), one after another in order. With
wait-free backpropagation (``overlap=True``, paper §2.1, §5.1) bucket ``k`` starts at ``max(its last gradient is
ready on every replica, end of bucket k - 1)``, measured from the start of the backward that precedes the
``ALLREDUCE`` (with GPipe and 2BW only the last microbatch's backward overlaps: the earlier ones accumulate, DDP's
``no_sync``). Without overlap the buckets are reduced once every replica has finished its backward.

Replica synchronisation (``sync``). ``"lockstep"`` (the default) is what the release runtime does: DDP over each
replicated stage's ranks, so each backward ends with a blocking allreduce all replicas join, and a replica whose
gradients are ready waits for the slowest. ``"independent"`` is the planner's assumption (§3.1): each replica
pays its stage's bucketed allreduce alone after its own backward, never overlapped, never waiting for the others
and booking no links; it isolates the cost of lockstep synchronisation.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from pipedream.errors import PipeDreamError
from pipedream.schedules import COMPUTE, Action, Kind, Schedule
from pipedream.sim.cores import Cores
from pipedream.sim.costs import StageCost
from pipedream.sim.network import Network


@dataclass
class Span:
    """One timed piece of work: an action on a rank, a transfer, or a collective (seconds; a compute action's
    ``end - start`` is longer than its work where ranks share cores)."""

    start: float
    end: float
    what: str
    rank: int = -1
    peer: int = -1


@dataclass
class Trace:
    """Everything one run produced.

    Attributes:
        makespan_s: time at which the last action ended, seconds.
        busy_s: rank -> seconds spent in ``F``/``B``/``I``/``W``.
        recv_wait_s: rank -> seconds blocked in ``RECV_*``.
        allreduce_wait_s: rank -> seconds blocked in ``ALLREDUCE`` (communication stall after its backward).
        step_s: rank -> seconds in ``STEP`` (optimizer steps).
        compute: rank -> ``F``/``B``/``I``/``W`` spans in order.
        steps: ``STEP`` spans (``rank`` the rank stepping).
        transfers: point-to-point transfers (``rank`` sender, ``peer`` receiver).
        collectives: allreduce pieces (``rank`` = first rank of the group).
        p2p_bytes: bytes moved by point-to-point transfers.
        allreduce_bytes: bytes all participants sent in allreduces.
    """

    makespan_s: float = 0.0
    busy_s: dict[int, float] = field(default_factory=dict)
    recv_wait_s: dict[int, float] = field(default_factory=dict)
    allreduce_wait_s: dict[int, float] = field(default_factory=dict)
    step_s: dict[int, float] = field(default_factory=dict)
    compute: dict[int, list[Span]] = field(default_factory=dict)
    steps: list[Span] = field(default_factory=list)
    transfers: list[Span] = field(default_factory=list)
    collectives: list[Span] = field(default_factory=list)
    p2p_bytes: float = 0.0
    allreduce_bytes: float = 0.0


def _recv_key(a: Action) -> tuple[str, int, int, int]:
    """Key shared by a receive and the send it matches: (direction, receiving stage, minibatch, microbatch)."""
    j = a.microbatch or 0
    if a.kind == Kind.SEND_F:
        return ("F", a.stage + 1, a.minibatch, j)
    if a.kind == Kind.SEND_B:
        return ("B", a.stage - 1, a.minibatch, j)
    return ("F" if a.kind == Kind.RECV_F else "B", a.stage, a.minibatch, j)


SYNC_KINDS = ("lockstep", "independent")


def run(schedule: Schedule, costs: list[StageCost], network: Network, overlap: bool = True,
        record: bool = True, sync: str = "lockstep", cores: Cores | None = None) -> Trace:
    """Time ``schedule`` with per-stage ``costs`` on ``network``.

    Args:
        schedule: per-rank action lists; its ranks must exist in the network's cluster.
        costs: one :class:`StageCost` per stage of the schedule.
        network: the links (fresh: reservations of an earlier run would carry over).
        overlap: wait-free backpropagation for allreduces (see the module docstring).
        record: keep the spans (for plots); totals are kept either way.
        sync: ``"lockstep"`` or ``"independent"`` replicas (see the module docstring).
        cores: how compute actions share the hosts' cores (:mod:`pipedream.sim.cores`, fresh); None: every
            rank computes at full speed.
    Raises:
        PipeDreamError: stage/cost count mismatch, a rank outside the cluster, or a deadlock (names the
            stuck actions).
    """
    if len(costs) != schedule.num_stages:
        raise PipeDreamError(f"schedule has {schedule.num_stages} stages but {len(costs)} stage costs were given")
    if sync not in SYNC_KINDS:
        raise PipeDreamError(f"unknown replica sync {sync!r}; use {' or '.join(SYNC_KINDS)}")
    order = schedule.order
    for r in order:
        network.check_rank(r)
    tr = Trace(busy_s=dict.fromkeys(order, 0.0), recv_wait_s=dict.fromkeys(order, 0.0),
               allreduce_wait_s=dict.fromkeys(order, 0.0), step_s=dict.fromkeys(order, 0.0),
               compute={r: [] for r in order})
    cores = cores or Cores()
    clock = dict.fromkeys(order, 0.0)
    pos = dict.fromkeys(order, 0)
    last_b_start = dict.fromkeys(order, 0.0)
    last_b_stretch = dict.fromkeys(order, 1.0)  # wall seconds per second of work of the rank's last backward
    arrivals: dict[tuple[str, int, int, int], float] = {}
    waiting: dict[tuple[str, int, int, int], int] = {}
    groups: dict[tuple[int, int], dict[int, float]] = {}
    ar_count = dict.fromkeys(order, 0)
    tied_groups: dict[tuple[tuple[int, ...], int], dict[int, float]] = {}  # (holding stages, k) -> rank -> joined at
    tied_count: dict[tuple[int, tuple[int, ...]], int] = {}  # (rank, holding stages) -> sums it has joined
    tied_pos = dict.fromkeys(order, 0)  # sums of the current STEP done
    stamp = dict.fromkeys(order, 0)  # a rank's heap entries older than its latest are stale
    heap = [(0.0, r, 0) for r in sorted(order)]
    heapq.heapify(heap)

    def wake(r: int, t: float) -> None:
        stamp[r] += 1
        heapq.heappush(heap, (t, r, stamp[r]))

    def reduce_buckets(stage: int, group: list[int], after_s: float, ready_ranks: list[int] | None,
                       book: bool) -> float:
        """Allreduce the stage's buckets in order over ``group``, each no earlier than the end of the previous
        one and than ``after_s``; with ``ready_ranks`` (overlap) bucket ``k`` also waits until its last
        gradient is ready on every one of them (measured from the start of each rank's last backward). One
        collective per bucket, latency included; ``book`` places it on the links, else it only takes its
        time. Returns when the last bucket ends."""
        prev = after_s
        for ready_in_bwd, nbytes in costs[stage].buckets:
            ready = (max(last_b_start[r] + ready_in_bwd * last_b_stretch[r] for r in ready_ranks)
                     if ready_ranks else prev)
            if book:
                start, prev = network.collective(group, nbytes, max(ready, prev))
                if record and prev > start:
                    tr.collectives.append(Span(start, prev, f"{stage}ALLREDUCE", group[0]))
            else:
                prev = max(ready, prev) + network.allreduce_time(group, nbytes)
        return prev

    def finish_allreduce(stage: int, members: dict[int, float]) -> None:
        ranks = sorted(members)
        if overlap:
            last = reduce_buckets(stage, ranks, 0.0, ranks, book=True)
            end = max(last, *members.values())
        else:
            end = reduce_buckets(stage, ranks, max(members.values()), None, book=True)
        tr.allreduce_bytes += sum(network.allreduce_bytes(ranks, nbytes) for _, nbytes in costs[stage].buckets)
        for r in ranks:
            tr.allreduce_wait_s[r] += end - members[r]
            clock[r] = end
            pos[r] += 1
            wake(r, end)

    def finish_tied_sum(stages: tuple[int, ...], nbytes: float, members: dict[int, float]) -> None:
        ranks = sorted(members)
        start, end = network.collective(ranks, nbytes, max(members.values()))
        if record and end > start:
            tr.collectives.append(Span(start, end, f"{'+'.join(map(str, stages))}TIED_SUM", ranks[0]))
        tr.allreduce_bytes += network.allreduce_bytes(ranks, nbytes)
        for q in ranks:
            tr.allreduce_wait_s[q] += end - members[q]
            clock[q] = end
            tied_pos[q] += 1
            wake(q, end)

    def compute(r: int, work_s: float, t: float) -> None:
        for end, q in cores.start(r, work_s, t):
            wake(q, end)

    def computed(r: int, t: float) -> None:
        """``r``'s compute action (``F``, ``B`` or ``STEP``) ends at ``t``."""
        job, moved = cores.finish(r, t)
        for end, q in moved:
            wake(q, end)
        a = order[r][pos[r]]
        if a.kind == Kind.STEP:
            tied_pos[r] = 0
            tr.step_s[r] += t - job.start_s
            if record:
                tr.steps.append(Span(job.start_s, t, str(a), r))
        else:
            tr.busy_s[r] += t - job.start_s
            if record:
                tr.compute[r].append(Span(job.start_s, t, str(a), r))
            if a.kind == Kind.B:
                last_b_start[r] = job.start_s
                last_b_stretch[r] = (t - job.start_s) / job.work_s if job.work_s > 0 else 1.0
        clock[r] = t
        pos[r] += 1

    while heap:
        t, r, k = heapq.heappop(heap)
        if k != stamp[r]:
            continue  # a stale entry
        if cores.running(r):
            computed(r, t)
        acts = order[r]
        while pos[r] < len(acts):
            a = acts[pos[r]]
            t = clock[r]
            cost = costs[a.stage]
            if a.kind in COMPUTE:
                work = {Kind.F: cost.fwd_s, Kind.B: cost.bwd_s}.get(a.kind)
                compute(r, work if work is not None else cost.split_s[a.kind == Kind.W], t)
                break
            if a.kind in (Kind.SEND_F, Kind.SEND_B):
                nbytes = cost.send_fwd_bytes if a.kind == Kind.SEND_F else cost.send_bwd_bytes
                peer = schedule.peer(a)
                assert peer is not None
                network.check_rank(peer)
                start, end = network.send(r, peer, nbytes, t)
                tr.p2p_bytes += nbytes if peer != r else 0.0
                if record and end > start:
                    tr.transfers.append(Span(start, end, str(a), r, peer))
                key = _recv_key(a)
                arrivals[key] = end
                if key in waiting:
                    other = waiting.pop(key)
                    wake(other, max(clock[other], end))
                pos[r] += 1
            elif a.kind in (Kind.RECV_F, Kind.RECV_B):
                key = _recv_key(a)
                if key not in arrivals:
                    waiting[key] = r
                    break
                arrive = arrivals.pop(key)
                pos[r] += 1
                if arrive > t:
                    tr.recv_wait_s[r] += arrive - t
                    clock[r] = arrive
                    wake(r, arrive)
                    break
            elif a.kind == Kind.ALLREDUCE and sync == "independent":
                group_ranks = schedule.stage_ranks[a.stage]
                end = reduce_buckets(a.stage, group_ranks, t, None, book=False)
                tr.allreduce_bytes += sum(network.allreduce_bytes(group_ranks, nbytes)
                                          for _, nbytes in cost.buckets) / len(group_ranks)
                tr.allreduce_wait_s[r] += end - t
                clock[r] = end
                pos[r] += 1
                wake(r, end)
                break
            elif a.kind == Kind.ALLREDUCE:
                members = groups.setdefault((a.stage, ar_count[r]), {})
                members[r] = t
                ar_count[r] += 1
                if len(members) == len(schedule.stage_ranks[a.stage]):
                    del groups[(a.stage, ar_count[r] - 1)]
                    finish_allreduce(a.stage, members)
                break
            elif tied_pos[r] < len(cost.tied_sums):  # STEP, first: the next sum of tied gradients
                stages, nbytes = cost.tied_sums[tied_pos[r]]
                k = tied_count.get((r, stages), 0)
                tied_count[(r, stages)] = k + 1
                members = tied_groups.setdefault((stages, k), {})
                members[r] = t
                if len(members) == len({q for s in stages for q in schedule.stage_ranks[s]}):  # a rank joins once
                    del tied_groups[(stages, k)]
                    finish_tied_sum(stages, nbytes, members)
                break
            else:  # STEP: the optimizer step over the stage's parameters
                if cost.step_s > 0:
                    compute(r, cost.step_s, t)
                    break
                tied_pos[r] = 0
                pos[r] += 1
        tr.makespan_s = max(tr.makespan_s, clock[r])
    stuck = {r: str(acts[pos[r]]) for r, acts in order.items() if pos[r] < len(acts)}
    if stuck:
        raise PipeDreamError(f"schedule {schedule.name!r} deadlocks in the simulator; ranks stuck at {stuck}")
    return tr
