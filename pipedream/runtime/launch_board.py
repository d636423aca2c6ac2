"""When the last replica launched each gradient bucket: the emulated link's start, shared on one host.

A real link cannot finish a ring allreduce before every replica has put its gradients on it, so the
emulated link (``--emulate-bandwidth-Bps``; :mod:`pipedream.runtime.buckets`, the DDP baseline's comm hook)
completes bucket ``k`` at the *last* replica's launch of it plus the link's time, as the simulator does
(:mod:`pipedream.sim.engine`: a bucket starts once every replica's gradients are ready).

The launch times ride on no collective of their own. Each replica writes its launch time into a small
table in shared memory (a memory-mapped file that every replica on the host maps) *before* it launches the
bucket's real allreduce, and reads the table only *after* that allreduce has returned, which cannot happen
before every replica has entered it, so every replica's entry is written by then. The table keeps two rounds
(a round is one ``ALLREDUCE`` of a stage, one DDP step): a replica cannot post round ``r + 2`` before every replica
has read round ``r``, because it would first have to complete round ``r + 1``, whose allreduces every replica
joins only after it has finished waiting for round ``r``.

Clock: :func:`time.perf_counter`, which is ``CLOCK_MONOTONIC`` on Linux and so one clock for every process
on a host. Replicas on several hosts share no memory and no clock: there each replica keeps its own launch
time (:attr:`LaunchBoard.shared` is False).
"""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist

from pipedream.costmodel import ring_allreduce_s

ROUNDS = 2  # rounds the table keeps (module docstring)


def link_finish_s(launch_s: Sequence[float], nbytes: Sequence[float], replicas: int, bandwidth_Bps: float,
                  free_s: float = float("-inf")) -> float:
    """Emulated completion of the last of consecutive allreduces on one link (seconds, the launches' clock).

    ``E_k = max(L_k, E_{k-1}) + ring_allreduce_s(S_k, n, bandwidth_Bps)`` with ``E_{-1} = free_s`` (when the
    link's previous allreduce completed), :func:`pipedream.costmodel.ring_allreduce_s` at latency 0, i.e.
    ``2 (n - 1) / n * S_k / bandwidth_Bps`` (the emulation adds bandwidth; the loopback collective's own
    latency is paid for real).

    Args:
        launch_s: ``L_0 .. L_k``, when the last replica launched each allreduce, s.
        nbytes: ``S_0 .. S_k``, each allreduce's bytes.
        replicas: ``n``, the replicas reducing.
        bandwidth_Bps: the link's bandwidth, bytes/s.
        free_s: ``E_{-1}``, s.
    Returns:
        ``E_k``, s (``free_s`` for no allreduce).
    """
    end = free_s
    for launch, size in zip(launch_s, nbytes, strict=True):
        end = max(launch, end) + ring_allreduce_s(size, replicas, bandwidth_Bps)
    return end


class LaunchBoard:
    """The launch times of one process group's bucket allreduces, ``(round % 2, bucket, replica)``.

    Built collectively by every member of ``group`` (an object all-gather and a barrier, under the group's
    timeout): the group's first replica creates the table's file in the temporary directory and names it
    to the others with every replica's host; when all are on one host, each maps the file and, once all have
    (the barrier), the first replica removes its name, so a run that gets past building its reducers leaves
    no file behind however it ends.

    Args:
        group: the replicas' process group (None: the world).
        buckets: how many buckets a round launches at most.
    """

    def __init__(self, group: dist.ProcessGroup | None, buckets: int) -> None:
        self.replicas = dist.get_world_size(group)
        self.index = dist.get_rank(group)
        mine = ""
        if self.index == 0:
            fd, mine = tempfile.mkstemp(prefix="pipedream-launches-")
            os.close(fd)
        seen: list[tuple[str, str]] = [("", "")] * self.replicas  # (host, the table's file) per replica
        dist.all_gather_object(seen, (socket.gethostname(), mine), group=group)
        path = seen[0][1]
        self.shared = len({host for host, _ in seen}) == 1
        size = ROUNDS * max(buckets, 1) * self.replicas
        if self.shared:
            flat = torch.from_file(path, shared=True, size=size, dtype=torch.float64)
            dist.barrier(group=group)  # every replica has mapped it
        else:
            flat = torch.zeros(size, dtype=torch.float64)
        if mine:
            Path(mine).unlink(missing_ok=True)
        self.table = flat.view(ROUNDS, max(buckets, 1), self.replicas)

    def post(self, round_: int, bucket: int, t: float) -> None:
        """Record this replica's launch of ``bucket`` in ``round_`` at ``t`` (s); call before launching it."""
        self.table[round_ % ROUNDS, bucket, self.index] = t

    def latest(self, round_: int, bucket: int) -> float:
        """When the last replica launched ``bucket`` in ``round_`` (s; this replica's own time when the
        replicas share no host). Call only once that bucket's allreduce has returned."""
        row = self.table[round_ % ROUNDS, bucket]
        return float(row.max()) if self.shared else float(row[self.index])
