"""Links of a hierarchical cluster: point-to-point transfers, allreduce, and contention (paper §3.1, §5.1).

Model. A :class:`pipedream.topology.Cluster` has levels innermost first, ``(workers, bandwidth_Bps)``. At level
``l`` every group (a GPU at level 0, a server at level 1, ...) owns one full-duplex port of ``bandwidth_Bps``
bytes/s into the switch that joins it to its siblings. A transfer from rank ``a`` to rank ``b`` that first meet
at level ``L + 1`` uses, for every ``l <= L``, the egress port of ``a``'s level-``l`` group and the ingress port
of ``b``'s; it takes :func:`pipedream.costmodel.transfer_s` at the bottleneck ``min(bandwidth_l for l <= L)`` with
the cluster's ``latency_s`` (0 between a rank and itself).

Contention: a port carries one transfer at a time; a transfer is placed at the earliest time at or after it is
ready when all ports on its path are free for its whole duration (earliest fit: it may start in a gap before a
transfer placed earlier). Two transfers through one NIC take twice as long together as one alone; transfers on
disjoint ports run in parallel.

Allreduce (one collective, one DDP bucket; paper §2.1, §3.1): every time is one of :mod:`pipedream.costmodel`'s,
with ``latency_s`` paid per step of every ring. ``ring``: one flat ring over all ``n`` ranks at the slowest link
it crosses (:func:`~pipedream.costmodel.ring_allreduce_s`; NCCL 2.4's ring, what PyTorch 1.1's DDP used, paper
§5.1). ``hierarchical`` (NCCL-style for servers x GPUs): one ring per level
(:func:`~pipedream.costmodel.hierarchical_allreduce_s`), level ``l`` over ``n_l`` groups, the most level-``l``
groups taking part inside one level-``l+1`` group. Bytes sent: :func:`~pipedream.costmodel.ring_allreduce_bytes`
per ring.

Lanes (``contention``). ``"lanes"`` (the default): collectives and point-to-point transfers book separate lanes
of each port, so an activation send never queues behind a whole allreduce (NCCL and the runtime's send/receive
use separate connections, which share the link's bandwidth rather than take turns): optimistic when the two
together exceed it. ``"exclusive"``: one lane per port, a transfer waits for a whole collective on any port it
shares: pessimistic.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from pipedream import costmodel
from pipedream.errors import PipeDreamError
from pipedream.topology import Cluster

ALLREDUCE_KINDS = ("hierarchical", "ring")
CONTENTION_KINDS = ("lanes", "exclusive")
Port = tuple[int, int, str]  # (level, group index at that level, "out" | "in")


@dataclass
class _Timeline:
    """Busy intervals ``[start, end)`` of one port, sorted by start, non-overlapping (seconds)."""

    starts: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)

    def conflict(self, start: float, end: float) -> float | None:
        """End of a busy interval overlapping ``[start, end)``, or None if the port is free then."""
        ends = self.ends
        if not ends or ends[-1] <= start:  # the usual case: free after every booking so far
            return None
        i = bisect.bisect_left(self.starts, end)  # intervals starting before `end`
        if i > 0 and ends[i - 1] > start:
            return ends[i - 1]
        return None

    def add(self, start: float, end: float) -> None:
        if not self.starts or start >= self.starts[-1]:  # the usual case: the latest booking so far
            self.starts.append(start)
            self.ends.append(end)
            return
        i = bisect.bisect_left(self.starts, start)
        self.starts.insert(i, start)
        self.ends.insert(i, end)


class Network:
    """Ports, paths and reservations of one cluster for one simulation run.

    Args:
        cluster: the topology; ranks are ``0 .. cluster.workers - 1``, consecutive ranks share a server.
        allreduce: ``"hierarchical"`` or ``"ring"`` (see the module docstring).
        contention: ``"lanes"`` or ``"exclusive"`` (see the module docstring).
    Raises:
        PipeDreamError: for an unknown allreduce or contention kind.
    """

    def __init__(self, cluster: Cluster, allreduce: str = "hierarchical", contention: str = "lanes") -> None:
        if allreduce not in ALLREDUCE_KINDS:
            raise PipeDreamError(f"unknown allreduce {allreduce!r}; use {' or '.join(ALLREDUCE_KINDS)}")
        if contention not in CONTENTION_KINDS:
            raise PipeDreamError(f"unknown contention {contention!r}; use {' or '.join(CONTENTION_KINDS)}")
        self.contention = contention
        self.cluster = cluster
        self.allreduce_kind = allreduce
        self.bandwidths = [float(b) for _, b in cluster.levels]
        self.group_size = [math.prod(w for w, _ in cluster.levels[:lv]) for lv in range(len(cluster.levels))]
        self.workers = cluster.workers
        self.latency_s = float(cluster.latency_s)
        self._ports: dict[Port, _Timeline] = {}
        # the timelines a transfer a -> b books and its bottleneck (bytes/s), and those a group's collective books:
        # a run sends between the same ranks and reduces over the same groups again and again
        self._path_lines: dict[tuple[int, int], tuple[list[_Timeline], float]] = {}
        self._group_lines: dict[tuple[int, ...], list[_Timeline]] = {}
        self._allreduce_s: dict[tuple[tuple[int, ...], float], float] = {}
        self._allreduce_bytes: dict[tuple[tuple[int, ...], float], float] = {}

    # ------------------------------------------------------------------ topology
    def check_rank(self, rank: int) -> None:
        """Raise PipeDreamError if ``rank`` is not a worker of the cluster."""
        if not 0 <= rank < self.workers:
            raise PipeDreamError(f"rank {rank} is outside cluster {self.cluster.name!r} "
                                 f"({self.workers} workers: ranks 0..{self.workers - 1})")

    def meet_level(self, a: int, b: int) -> int:
        """Highest level whose groups differ for ranks ``a`` and ``b`` (-1 if ``a == b``)."""
        return max((lv for lv, g in enumerate(self.group_size) if a // g != b // g), default=-1)

    def top_level(self, ranks: list[int]) -> int:
        """Highest level whose groups differ for some two of ``ranks`` (the most :meth:`meet_level` over their
        pairs; -1 for one rank), in one pass per level."""
        return max((lv for lv, g in enumerate(self.group_size) if len({r // g for r in ranks}) > 1), default=-1)

    def path(self, a: int, b: int) -> tuple[list[Port], float]:
        """Ports used by a transfer ``a -> b`` and its bottleneck bandwidth, bytes/s."""
        top = self.meet_level(a, b)
        ports: list[Port] = [p for lv in range(top + 1)
                             for p in ((lv, a // self.group_size[lv], "out"), (lv, b // self.group_size[lv], "in"))]
        bw = min(self.bandwidths[: top + 1]) if top >= 0 else math.inf
        return ports, bw

    def transfer_time(self, a: int, b: int, nbytes: float) -> float:
        """Seconds to move ``nbytes`` from rank ``a`` to rank ``b`` with no contention:
        :func:`pipedream.costmodel.transfer_s` on the path's bottleneck with the cluster's latency (0 if ``a == b``)."""
        _, bw = self.path(a, b)
        return costmodel.transfer_s(nbytes, bw, self.latency_s)

    def _outer_groups(self, ranks: list[int], level: int) -> list[int]:
        """Per level-``level + 1`` group holding some of ``ranks``: how many level-``level`` groups of ``ranks`` it joins."""
        g = self.group_size[level]
        outer = g * self.cluster.levels[level][0]
        per_outer: dict[int, set[int]] = {}
        for r in ranks:
            per_outer.setdefault(r // outer, set()).add(r // g)
        return [len(s) for s in per_outer.values()]

    def level_counts(self, ranks: list[int]) -> list[int]:
        """Per level ``l``: the most distinct level-``l`` groups of ``ranks`` inside one level-``l+1`` group."""
        return [max(self._outer_groups(ranks, lv)) for lv in range(len(self.group_size))]

    def allreduce_time(self, ranks: list[int], nbytes: float) -> float:
        """Seconds for one allreduce (one collective, e.g. one DDP bucket) of ``nbytes`` over ``ranks`` with no
        contention, latency included.

        ``ring``: :func:`pipedream.costmodel.ring_allreduce_s` over all ranks at the slowest link the ring
        crosses. ``hierarchical``: :func:`pipedream.costmodel.hierarchical_allreduce_s` with
        :meth:`level_counts` groups per level (see the module docstring). Seconds are cached per
        ``(ranks, nbytes)``: a run reduces the same buckets over the same groups again and again.
        """
        key = (tuple(ranks), float(nbytes))
        cached = self._allreduce_s.get(key)
        if cached is not None:
            return cached
        n = len(set(ranks))
        if n < 2 or nbytes <= 0:
            seconds = 0.0
        elif self.allreduce_kind == "ring":
            top = self.top_level(ranks)
            seconds = costmodel.ring_allreduce_s(nbytes, n, min(self.bandwidths[: top + 1]), self.latency_s)
        else:
            seconds = costmodel.hierarchical_allreduce_s(nbytes, self.level_counts(ranks), self.bandwidths,
                                                         self.latency_s)
        self._allreduce_s[key] = seconds
        return seconds

    def allreduce_bytes(self, ranks: list[int], nbytes: float) -> float:
        """Total bytes all participants send in one allreduce of ``nbytes``: the sum of
        :func:`pipedream.costmodel.ring_allreduce_bytes` over its rings (``2 (c - 1) S`` for a ring of ``c``);
        cached per ``(ranks, nbytes)`` like :meth:`allreduce_time`."""
        key = (tuple(ranks), float(nbytes))
        cached = self._allreduce_bytes.get(key)
        if cached is not None:
            return cached
        n = len(set(ranks))
        if n < 2:
            total = 0.0
        elif self.allreduce_kind == "ring":
            total = costmodel.ring_allreduce_bytes(nbytes, n)
        else:
            total = sum(costmodel.ring_allreduce_bytes(nbytes, c)
                        for lv in range(len(self.group_size)) for c in self._outer_groups(ranks, lv))
        self._allreduce_bytes[key] = total
        return total

    def allreduce_ports(self, ranks: list[int]) -> list[Port]:
        """Ports an allreduce over ``ranks`` occupies: both directions of every port up to its top level."""
        top = self.top_level(ranks)
        ports = {(lv, r // self.group_size[lv], d) for lv in range(top + 1) for r in ranks for d in ("out", "in")}
        return sorted(ports)

    # ------------------------------------------------------------------ reservations
    def _lines(self, ports: list[Port]) -> list[_Timeline]:
        """The timeline of each of ``ports``, created on first use."""
        return [self._ports.setdefault(p, _Timeline()) for p in ports]

    @staticmethod
    def _book(lines: list[_Timeline], ready_s: float, duration_s: float) -> float:
        """Book the ports of ``lines`` (their timelines) for ``duration_s`` at the earliest time ``>= ready_s`` when
        all are free (earliest fit, module docstring); returns the start, s."""
        start = ready_s
        moved = True
        while moved:
            moved = False
            for line in lines:
                end = line.conflict(start, start + duration_s)
                if end is not None:
                    start, moved = end, True
        for line in lines:
            line.add(start, start + duration_s)
        return start

    def send(self, a: int, b: int, nbytes: float, ready_s: float) -> tuple[float, float]:
        """Place a transfer ``a -> b`` of ``nbytes`` ready at ``ready_s``; returns ``(start, end)`` seconds."""
        cached = self._path_lines.get((a, b))
        if cached is None:
            ports, bw = self.path(a, b)
            cached = self._path_lines[(a, b)] = (self._lines(ports), bw)
        lines, bw = cached
        dur = costmodel.transfer_s(nbytes, bw, self.latency_s)
        start = self._book(lines, ready_s, dur) if dur > 0 and lines else ready_s
        return start, start + dur

    def collective(self, ranks: list[int], nbytes: float, ready_s: float) -> tuple[float, float]:
        """Place one allreduce (one collective) of ``nbytes`` over ``ranks`` ready at ``ready_s``; returns
        ``(start, end)`` seconds. Its duration is :meth:`allreduce_time` (cached), its ports cached per group."""
        key = tuple(ranks)
        dur = self.allreduce_time(ranks, nbytes)
        if dur <= 0:
            return ready_s, ready_s
        lines = self._group_lines.get(key)
        if lines is None:
            ports = self.allreduce_ports(ranks)
            if self.contention == "lanes":  # the collective lane of each port (see the module docstring)
                ports = [(lv, g, f"{d}:coll") for lv, g, d in ports]
            lines = self._group_lines[key] = self._lines(ports)
        start = self._book(lines, ready_s, dur) if lines else ready_s
        return start, start + dur
