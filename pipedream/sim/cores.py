"""Processor sharing: how fast the compute actions of ranks that share a host's cores progress.

The simulator (:mod:`pipedream.sim.engine`) hands every compute action (``F``, ``B``, ``STEP``) to
:class:`Cores` as an amount of work, seconds at full speed (the profile's). Without sharing (one GPU per rank)
an action of ``w`` seconds started at ``t`` ends at ``t + w``. With sharing, the ``n`` actions computing at
once on one host each progress at ``1 / slowdown(n)`` seconds of work per second: the fluid model of a fair
scheduler (Linux CFS gives each of ``n`` runnable single-threaded processes ``cores / n`` of a core when
``n > cores``), with ``slowdown`` from :func:`host_scale`. A rank blocked in a receive or
an allreduce computes nothing and takes no share. Every start and end on a host changes the speed of the
others there, so each returns the new end times of the actions it moved. (A run's prediction shares the cores
of a host of single-threaded workers as per-core run queues, :mod:`pipedream.sim.run_queues`, which keep this
class's interface.)

Background work. A collective's own CPU (gloo's socket copies and reductions,
:func:`pipedream.sim.transport_cpu.allreduce_cpu_s`, ``collective_cpu``) runs on a thread of its own while the
rank waits for the link, and takes a share of the host like any action: the simulator starts it as a job under
a key of its own (a negative number, :meth:`Cores.start` with ``host``), so a rank's backward or another
rank's forward computing beside it slows down. (A bucket reduced while the backward goes on has its CPU in the
backward's work instead, ``StageCost.buckets_cpu_in_bwd``: :func:`pipedream.sim.transport_cpu.with_transport_cpu`.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pipedream.errors import PipeDreamError


def host_scale(busy_ranks: float, threads: int, cores: int, contention: float = 1.0,
               oversubscribed: float | None = None) -> float:
    """Slowdown of compute on a shared host: processor sharing times contention,
    ``max(1, n / cores) * c(n)`` with ``n = busy_ranks * threads`` threads computing at once and
    ``c(n) = 1 + (contention - 1) * clip((n - 1) / (cores - 1), 0, 1)`` up to ``cores`` threads,
    ``contention + (oversubscribed - contention) * clip((n - cores) / cores, 0, 1)`` above.

    The first factor: ``n`` threads share ``cores`` cores, each gets ``cores / n`` of a core when that is
    below 1 (a fair-share scheduler such as Linux CFS). The second: threads on different cores still share
    memory bandwidth and caches; ``contention`` is the measured slowdown of one step with a copy on every core
    (the profile's ``host.contention``, :func:`pipedream.host_timing.host_contention`), taken linearly from 1
    with one thread computing to its full value with every core busy. Threads that take turns on a core also
    evict each other's caches at every switch: ``oversubscribed`` is the measured slowdown with two copies per
    core over their fair share (``host.oversubscribed``: the step's time with ``2 * cores`` copies over twice
    its time alone), taken linearly from ``contention`` at ``cores`` threads to its full value at twice as
    many; None: ``contention`` (no measurement). Raises PipeDreamError for non-positive ``threads`` or ``cores``.
    """
    if threads < 1 or cores < 1:
        raise PipeDreamError(f"threads per worker and host cores must be positive, got {threads} and {cores}")
    n = busy_ranks * threads
    if n > cores and oversubscribed is not None:
        over = min(1.0, (n - cores) / cores)
        return n / cores * (contention + (oversubscribed - contention) * over)
    shared = min(1.0, max(0.0, (n - 1) / (cores - 1))) if cores > 1 else 0.0
    return max(1.0, n / cores) * (1 + (contention - 1) * shared)


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
        slowdown: ``slowdown(n)`` >= 1, how much slower each of ``n`` actions computing at once on one host
            runs than alone; None: no sharing (each rank has its own device).
        host_of: the host of a rank (default: all on host 0).
        collective_cpu: ``collective_cpu(replicas, nbytes)``, CPU seconds each member of an allreduce of
            ``nbytes`` over ``replicas`` ranks spends on it (module docstring); None: none (GPUs, or not
            measured). Only used with ``slowdown``.
    """

    def __init__(self, slowdown: Callable[[int], float] | None = None,
                 host_of: Callable[[int], int] | None = None,
                 collective_cpu: Callable[[int, float], float] | None = None) -> None:
        self.slowdown, self.host_of = slowdown, host_of or (lambda rank: 0)
        self.collective_cpu = collective_cpu if slowdown is not None else None
        self.jobs: dict[int, Job] = {}
        self._since: dict[int, float] = {}  # host -> time its jobs' left_s were last brought up to date

    def running(self, rank: int) -> Job | None:
        """The action ``rank`` is computing, if any."""
        return self.jobs.get(rank)

    def start(self, rank: int, work_s: float, t: float, host: int | None = None) -> list[tuple[float, int]]:
        """``rank`` starts ``work_s`` seconds of work at ``t`` (the simulator's current time); returns
        ``(end time, rank)`` of every action whose end is now different, the new one included. ``host``:
        where a background job (a negative ``rank``, module docstring) runs; default ``host_of(rank)``."""
        host = self.host_of(rank) if host is None else host
        if self.slowdown is None:
            self.jobs[rank] = Job(rank, host, work_s, work_s, t)
            return [(t + work_s, rank)]
        self._advance(host, t)
        self.jobs[rank] = Job(rank, host, work_s, work_s, t)
        return self._ends(host, t)

    def finish(self, rank: int, t: float) -> tuple[Job, list[tuple[float, int]]]:
        """``rank``'s action ends at ``t``; returns it and the new ends of the actions it leaves on its host."""
        job = self.jobs.pop(rank)
        if self.slowdown is None:
            return job, []
        self._advance(job.host, t, gone=job)
        return job, self._ends(job.host, t)

    def _on(self, host: int) -> list[Job]:
        return [j for j in self.jobs.values() if j.host == host]

    def _advance(self, host: int, t: float, gone: Job | None = None) -> None:
        """Bring the work left of ``host``'s actions (and ``gone``, just removed) up to time ``t``."""
        jobs = self._on(host) + ([gone] if gone is not None else [])
        if jobs:
            assert self.slowdown is not None
            rate = 1.0 / self.slowdown(len(jobs))
            elapsed = t - self._since.get(host, t)
            for j in jobs:
                j.left_s = max(0.0, j.left_s - elapsed * rate)
        self._since[host] = t

    def _ends(self, host: int, t: float) -> list[tuple[float, int]]:
        jobs = self._on(host)
        if not jobs:
            return []
        assert self.slowdown is not None
        slow = self.slowdown(len(jobs))
        return [(t + j.left_s * slow, j.rank) for j in jobs]
