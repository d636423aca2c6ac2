"""The host model: how fast the compute actions of ranks that share a CPU host's cores progress.

This is all the simulator knows of a host. ``n`` single-threaded ranks computing at once on a host of ``c``
cores each progress at ``min(1, c / n)`` seconds of work per second (processor sharing: a fair scheduler such
as Linux CFS gives each of ``n`` runnable single-threaded processes ``c / n`` of a core when ``n > c``), re-timed
whenever a rank starts or stops computing. A rank blocked in a receive or an allreduce computes nothing and
takes no share. On GPUs (``cores`` None) every rank computes at full speed.

The simulator (:mod:`pipedream.sim.engine`) hands every compute action (``F``, ``B``, ``STEP``) to
:class:`Cores` as an amount of work, seconds at full speed (the profile's); every start and end on a host
changes the speed of the others there, so each returns the new end times of the actions it moved.

What is not modelled: shared memory bandwidth and caches between cores, cache refills after a context switch,
where a process's tensors land in memory, the transport's own CPU. On a CPU host with more ranks than cores
these make a run differ from itself by more than the model could gain from them (the prediction check states
the run-to-run noise beside its results, docs of ``benchmarks/cores``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from pipedream import placement
from pipedream.errors import PipeDreamError


def host_cores() -> int:
    """The cores this process may run on (``os.sched_getaffinity``; ``os.cpu_count()`` where the platform has no
    affinity), at least 1. Not the machine's count: a run started under ``taskset``, a cgroup cpuset or a
    batch scheduler's allocation has only its own cores for its workers, and children inherit the set."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def slowdown(computing: int, cores: int) -> float:
    """How much slower each of ``computing`` single-threaded ranks computing at once on a host of ``cores`` cores
    runs than alone: ``max(1, computing / cores)`` (the inverse of processor sharing's ``min(1, c / n)``).

    Raises:
        PipeDreamError: ``cores`` below 1.
    """
    if cores < 1:
        raise PipeDreamError(f"host cores must be positive, got {cores}")
    return max(1.0, computing / cores)


@dataclass(frozen=True)
class Host:
    """The CPU hosts a run's ranks share: ``cores`` cores each, ``ranks_per_host`` consecutive ranks on each
    (torchrun's numbering, :func:`pipedream.placement.host_of`).

    Raises:
        PipeDreamError: ``cores`` or ``ranks_per_host`` below 1.
    """

    cores: int
    ranks_per_host: int

    def __post_init__(self) -> None:
        if self.cores < 1 or self.ranks_per_host < 1:
            raise PipeDreamError(f"host cores and ranks per host must be positive, got {self.cores} and "
                                 f"{self.ranks_per_host}")

    def host_of(self, rank: int) -> int:
        """The host of ``rank``."""
        return placement.host_of(rank, self.ranks_per_host)


@dataclass
class Job:
    """One compute action in progress: ``left_s`` seconds of work at full speed remain; started at ``start_s``
    with ``work_s`` in all."""

    rank: int
    host: int
    work_s: float
    left_s: float
    start_s: float


class Cores:
    """The compute actions in progress and their end times.

    Args:
        host: the CPU hosts the ranks share; None: no sharing (each rank computes on its own device).
    """

    def __init__(self, host: Host | None = None) -> None:
        self.cores = None if host is None else host.cores
        self.host_of: Callable[[int], int] = (lambda rank: 0) if host is None else host.host_of
        self.jobs: dict[int, Job] = {}
        self._since: dict[int, float] = {}  # host -> time its jobs' left_s were last brought up to date

    def running(self, rank: int) -> Job | None:
        """The action ``rank`` is computing, if any."""
        return self.jobs.get(rank)

    def start(self, rank: int, work_s: float, t: float) -> list[tuple[float, int]]:
        """``rank`` starts ``work_s`` seconds of work at ``t`` (the simulator's current time); returns
        ``(end time, rank)`` of every action whose end is now different, the new one included."""
        host = self.host_of(rank)
        if self.cores is None:
            self.jobs[rank] = Job(rank, host, work_s, work_s, t)
            return [(t + work_s, rank)]
        self._advance(host, t)
        self.jobs[rank] = Job(rank, host, work_s, work_s, t)
        return self._ends(host, t)

    def finish(self, rank: int, t: float) -> tuple[Job, list[tuple[float, int]]]:
        """``rank``'s action ends at ``t``; returns it and the new ends of the actions it leaves on its host."""
        job = self.jobs.pop(rank)
        if self.cores is None:
            return job, []
        self._advance(job.host, t, gone=job)
        return job, self._ends(job.host, t)

    def _on(self, host: int) -> list[Job]:
        return [j for j in self.jobs.values() if j.host == host]

    def _advance(self, host: int, t: float, gone: Job | None = None) -> None:
        """Bring the work left of ``host``'s actions (and ``gone``, just removed) up to time ``t``."""
        assert self.cores is not None
        jobs = self._on(host) + ([gone] if gone is not None else [])
        if jobs:
            rate = 1.0 / slowdown(len(jobs), self.cores)
            elapsed = t - self._since.get(host, t)
            for j in jobs:
                j.left_s = max(0.0, j.left_s - elapsed * rate)
        self._since[host] = t

    def _ends(self, host: int, t: float) -> list[tuple[float, int]]:
        assert self.cores is not None
        jobs = self._on(host)
        if not jobs:
            return []
        slow = slowdown(len(jobs), self.cores)
        return [(t + j.left_s * slow, j.rank) for j in jobs]
