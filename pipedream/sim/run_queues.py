"""Per-core run queues: how a host's kernel places single-threaded workers on its cores, for the simulator.

:class:`pipedream.sim.cores.Cores` shares a host as one fluid: ``n`` actions computing at once each get
``cores / n`` of a core, so a core never idles while more actions than cores want one. Linux keeps a run queue per
core instead. A thread that wakes after a wait goes to its previous core if that core is idle, else to an idle
core, else back to its previous core (``select_idle_sibling``); a thread that goes on computing stays where it is;
a core left idle while another queues two or more threads takes one at the next scheduler tick (every ``1 /
CONFIG_HZ`` s; 4 ms on the 2-core CI VM, ``CONFIG_HZ=250``), when the busy core's tick kicks the idle balancer.
(The kernel may also pull a thread the moment a core goes idle, the newly-idle balance, but skips it when the
core's average idle time is shorter than a balance costs or the queued thread ran within the last 0.5 ms,
``sched_migration_cost``; the model leaves it out.)

Measured on the CI VM (2026-11-30): 4 workers of the reduced AlexNet's straight pipeline on 2 cores left 8.6% of
the core time idle over 4 s of training (``/proc/stat``), while their threads wanted 3.5 cores on average
(main threads runnable 2.8, gloo's 0.7, sampled every 2.4 ms); in 7% of 2,527 samples one core had no runnable
thread while the other queued two or more. Session 37's fourth ``make run`` trained the same pipeline with its
cores 90.0% busy; resimulated with each stage's compute as that run measured it, the fluid model kept them 99.6%
busy, these run queues 91.9%. Over six ``make run``s (sessions 37 and 38,
``benchmarks/sharing``) the pipelines' measured epochs came out a mean 1.052-1.071x their resimulation with the
queues, 1.073-1.109x with the fluid model, every straight, 1-1-2 and 3-1 pipeline closer to 1; runs made of
replicated stages only (DP) are unchanged: two replicas a core share it evenly either way.

:class:`QueuedCores` is :class:`~pipedream.sim.cores.Cores` with the queues: each action is on one core and
shares it equally with the others there, at ``1 / (k * c(n))`` of full speed with ``k`` actions on its core and
``c(n) = slowdown(n) / max(1, n / cores)`` the host's contention with ``n`` computing in all (the fluid
slowdown's factor beyond sharing, :func:`pipedream.sim.cores.host_scale`). It models single-threaded workers (a
worker with several threads keeps the fluid model). With at most ``cores`` actions computing, each has a core of
its own by the next tick at the latest (at once in the fluid model).
"""

from __future__ import annotations

import gzip
import math
import os
from collections.abc import Callable
from dataclasses import dataclass

from pipedream.errors import PipeDreamError
from pipedream.sim.cores import Cores, Job

# the scheduler tick where the kernel's configuration cannot be read: CONFIG_HZ=250, the kernel's own default
# (kernel/Kconfig.hz) and the CI VM's; distributions build 100-1000
DEFAULT_TICK_S = 0.004


def scheduler_tick_s(paths: tuple[str, ...] | None = None) -> float:
    """Seconds between two scheduler ticks of this host's kernel, ``1 / CONFIG_HZ``, read from the kernel's
    configuration (``/proc/config.gz``, else ``/boot/config-<release>``; ``paths`` to read instead, gzip or plain
    text by their name); :data:`DEFAULT_TICK_S` where none says."""
    if paths is None:
        paths = ("/proc/config.gz", f"/boot/config-{os.uname().release}")
    for path in paths:
        try:
            opener = gzip.open if path.endswith(".gz") else open
            with opener(path, "rt") as f:
                for line in f:
                    hz = line.strip().removeprefix("CONFIG_HZ=")
                    if line.startswith("CONFIG_HZ=") and hz.isdigit() and int(hz) > 0:
                        return 1.0 / int(hz)
        except OSError:
            continue
    return DEFAULT_TICK_S


@dataclass(frozen=True)
class RunQueues:
    """The run queues of every host: ``cores`` per host, balanced every ``tick_s`` seconds.

    Raises:
        PipeDreamError: non-positive cores or tick.
    """

    cores: int
    tick_s: float = DEFAULT_TICK_S

    def __post_init__(self) -> None:
        if self.cores < 1 or not self.tick_s > 0:
            raise PipeDreamError(f"run queues need positive cores and tick, got {self.cores} and {self.tick_s}")


class QueuedCores(Cores):
    """:class:`~pipedream.sim.cores.Cores` whose hosts keep a run queue per core (module docstring).

    Args:
        slowdown: the fluid ``slowdown(n)`` of the host (:func:`pipedream.sim.cores.host_scale` with one thread
            per worker); only its contention factor beyond sharing is taken.
        queues: cores per host and the scheduler tick.
        host_of, collective_cpu: as :class:`~pipedream.sim.cores.Cores`.
    """

    def __init__(self, slowdown: Callable[[int], float], queues: RunQueues,
                 host_of: Callable[[int], int] | None = None,
                 collective_cpu: Callable[[int, float], float] | None = None) -> None:
        super().__init__(slowdown, host_of, collective_cpu)
        self.queues = queues
        self.core_of: dict[int, int] = {}  # job key -> its core now
        self.last_core: dict[int, int] = {}  # rank -> the core of its latest action
        self.ended: dict[int, float] = {}  # rank -> when its latest action ended
        self.started: dict[int, int] = {}  # job key -> order of its start (the latest moves first)
        self._count = 0

    def start(self, rank: int, work_s: float, t: float, host: int | None = None) -> list[tuple[float, int]]:
        """As :meth:`Cores.start`; the action goes on the core the kernel would put it on (module docstring)."""
        host = self.host_of(rank) if host is None else host
        self._advance(host, t)
        load = self._load(host)
        prev = self.last_core.get(rank)
        idle = [k for k in range(self.queues.cores) if load[k] == 0]
        if prev is not None and abs(self.ended.get(rank, -math.inf) - t) <= 1e-12:
            core = prev  # it goes on computing without a wait: no wake-up, no move
        elif prev is not None and (prev in idle or not idle):
            core = prev
        else:
            core = idle[0] if idle else min(range(self.queues.cores), key=lambda k: load[k])
        self.jobs[rank] = Job(rank, host, work_s, work_s, t)
        self.core_of[rank] = self.last_core[rank] = core
        self._count += 1
        self.started[rank] = self._count
        return self._ends(host, t)

    def finish(self, rank: int, t: float) -> tuple[Job, list[tuple[float, int]]]:
        """As :meth:`Cores.finish`."""
        job = self.jobs[rank]
        self._advance(job.host, t)
        del self.jobs[rank], self.core_of[rank], self.started[rank]
        self.ended[rank] = t
        return job, self._ends(job.host, t)

    def _load(self, host: int) -> list[int]:
        load = [0] * self.queues.cores
        for j in self._on(host):
            load[self.core_of[j.rank]] += 1
        return load

    def _rates(self, host: int) -> dict[int, float]:
        """Work per second of each action on ``host``: ``1 / (k * c(n))``."""
        jobs = self._on(host)
        if not jobs:
            return {}
        assert self.slowdown is not None
        n = len(jobs)
        contention = self.slowdown(n) / max(1.0, n / self.queues.cores)
        load = self._load(host)
        return {j.rank: 1.0 / (load[self.core_of[j.rank]] * contention) for j in jobs}

    def _unbalanced(self, host: int) -> bool:
        load = self._load(host)
        return min(load) == 0 and max(load) >= 2

    def _balance(self, host: int) -> None:
        """One tick's balance: each idle core takes the latest-started action of the most loaded core."""
        while self._unbalanced(host):
            load = self._load(host)
            src = max(range(self.queues.cores), key=lambda k: load[k])
            dst = load.index(0)
            mover = max((j.rank for j in self._on(host) if self.core_of[j.rank] == src), key=self.started.__getitem__)
            self.core_of[mover] = self.last_core[mover] = dst

    def _next_tick(self, t: float) -> float:
        return (math.floor(t / self.queues.tick_s + 1e-9) + 1) * self.queues.tick_s

    def _advance(self, host: int, t: float, gone: Job | None = None) -> None:
        """Bring ``host``'s actions' work left up to ``t``, balancing at every tick on the way."""
        now = self._since.get(host, t)
        while True:
            stop = min(t, self._next_tick(now)) if self._unbalanced(host) else t
            rates = self._rates(host)
            for j in self._on(host):
                j.left_s = max(0.0, j.left_s - (stop - now) * rates[j.rank])
            now = stop
            if stop >= t:
                break
            self._balance(host)
        self._since[host] = t

    def _ends(self, host: int, t: float) -> list[tuple[float, int]]:
        """Each action's end if nothing else starts or ends first: exact for the first to end (every balance
        before it applied); the others are computed again when it ends."""
        jobs = self._on(host)
        if not jobs:
            return []
        saved = {j.rank: (j.left_s, self.core_of[j.rank], self.last_core[j.rank]) for j in jobs}
        now = t
        while True:  # at most one balance: after it no core is idle or none queues two
            rates = self._rates(host)
            ends = {j.rank: now + j.left_s / rates[j.rank] for j in jobs}
            tick = self._next_tick(now) if self._unbalanced(host) else math.inf
            if min(ends.values()) <= tick:
                break
            self._advance(host, tick)
            self._balance(host)
            now = tick
        self._since[host] = t
        for j in jobs:
            j.left_s, self.core_of[j.rank], self.last_core[j.rank] = saved[j.rank]
        return [(end, rank) for rank, end in ends.items()]


def make_cores(slowdown: Callable[[int], float] | None, queues: RunQueues | None = None,
               host_of: Callable[[int], int] | None = None,
               collective_cpu: Callable[[int, float], float] | None = None) -> Cores:
    """The simulator's cores: :class:`QueuedCores` with ``queues`` and a ``slowdown``, else the fluid
    :class:`~pipedream.sim.cores.Cores` (``slowdown`` None: no sharing)."""
    if slowdown is not None and queues is not None:
        return QueuedCores(slowdown, queues, host_of, collective_cpu)
    return Cores(slowdown, host_of, collective_cpu)
