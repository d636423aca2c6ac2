"""How a CPU host changes a training step's time: where its tensors land in memory, and copies sharing the cores
(the profile's ``meta.json`` ``host``: ``contention``, ``oversubscribed``, ``layouts``).

Memory layout. On the 2-core CI machine (2 MiB of L2 per core) the same step of the reduced S2VT took 48-76 ms
in eight fresh copies of the model and its minibatch made in one process (GNMT-8 80-105 ms, VGG-16 32 ms in
every copy), and 49-65 ms in six fresh processes (GNMT-8 82-106 ms in five); within one copy it moves by 2-3%.
A copy's step time is a draw, set by where its weights and activations land in memory (cache-set conflicts in
a physically indexed cache, as far as we can tell), and every worker of a run is a draw of its own. (Session 30 on
the same VM found one long-lived process's windows spreading as much as fresh processes, ``benchmarks/layout``:
much of that spread is the host's speed at the moment each copy is timed; :mod:`pipedream.sim.layout`.) Part of the
draw was the C allocator's: by default glibc faulted a step's large blocks in again every step in some processes
and not in others (S2VT: 0 or 15,456 faults a step); every process that computes a step now keeps freed memory
(:mod:`pipedream.allocator`), the copies included. The layer
profile is one draw; :func:`host_contention` records each fresh process's step over the profiled process's
(``layouts``) so that a prediction can draw each rank's (:mod:`pipedream.sim.layout`) instead of taking the
profiling process's as everyone's.

Sharing. The workers of a CPU run share the host's memory bandwidth and last-level cache even where each has a
core of its own, and copies taking turns on a core evict each other's caches at every switch; processor sharing
(:func:`pipedream.sim.cores.host_scale`) does not see that. :func:`host_contention` times copies stepping at
once against each copy's own time alone, so that the layout's draw cancels in the ratio (timed against the
profiling process alone, as before, the reduced S2VT's two-copy figure came out 0.89-1.31 across profiles).

Optimizer steps. A copy's step may carry optimizer steps over its own model (``step.updates``); each copy times
them alone once a round (``updates``), so that the profile's optimizer-step rate is a mean over the copies' layouts
and the probe's time rather than the profiling process's one draw (:mod:`pipedream.step_rates`).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipedream.errors import PipeDreamError
from pipedream.runtime.supervise import pdeathsig_kill

Step = Callable[[], Any]
# rounds of :func:`host_contention`, each with a new model in every copy: the median of 5 rather than 3. On the 2-core CI
# machine one profile of AWD-LM measured 1.25 with two copies per core where four repeats of the same 4 s
# measurement right after gave 1.06-1.09 (and the run agreed with them); two disturbed rounds of three set the
# median, two of five do not.
ROUNDS = 5


def host_cores() -> int:
    """The cores this process may run on (``os.sched_getaffinity``; ``os.cpu_count()`` where the platform has no
    affinity), at least 1. Not the machine's count: a run started under ``taskset``, a cgroup cpuset or a
    batch scheduler's allocation has only its own cores for its workers, and children inherit the set."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def last_level_cache_bytes(cpu_dir: str = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """Bytes of the largest cache of this host's first CPU (Linux sysfs ``index*/size``, e.g. ``32768K``: the
    last level, which the cores share), or None where sysfs does not say (another platform, a container without
    it, an unreadable size)."""
    sizes = []
    try:
        entries = [e for e in os.listdir(cpu_dir) if e.startswith("index")]
    except OSError:
        return None
    for e in entries:
        try:
            with open(os.path.join(cpu_dir, e, "size")) as f:
                text = f.read().strip()
        except OSError:
            continue
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
        digits = text[:-1] if unit > 1 else text
        if digits.isdigit():
            sizes.append(int(digits) * unit)
    return max(sizes) if sizes else None


@dataclass(frozen=True)
class Sharing:
    """One :func:`host_contention` measurement.

    Attributes:
        slowdown: each copy's mean step together over its own step alone, their harmonic mean (the copies'
            total throughput: one that got less of a shared core in a short window leaves more to the others),
            divided by the share of a core each gets together (``max(1, processes / cores)``: what processor
            sharing explains is not counted twice); the median over the rounds; >= 1 up to noise.
        layouts: every copy's step alone over the profiling process's step in the same round (dimensionless):
            how much slower (> 1) or faster a fresh memory layout of the model runs than the profiled one.
        rounds: each round's slowdown, in order (the median is ``slowdown``): how far one round strays.
        updates: per optimizer a copy's step carries (``step.updates``, :func:`_update_s`), the seconds of one
            optimizer step of every copy of every round, alone (empty where the steps carry none).
        alone: every copy's step alone in every round, s, in the order of ``layouts`` (round by round).
    """

    slowdown: float
    layouts: tuple[float, ...]
    rounds: tuple[float, ...] = ()
    updates: dict[str, tuple[float, ...]] = field(default_factory=dict)
    alone: tuple[float, ...] = ()

    @property
    def alone_s(self) -> float:
        """The copies' mean step alone, s (0 where nothing was measured)."""
        return statistics.fmean(self.alone) if self.alone else 0.0


def host_contention(step: Step, fresh: Callable[[], Step], processes: int, seconds: float = 2.0, rounds: int = ROUNDS,
                    min_steps: int = 4) -> Sharing:
    """Time ``processes`` fresh copies of a training step running at once, then each alone (module docstring):
    :func:`host_sharing` for one count of copies."""
    return host_sharing(step, fresh, (processes,), seconds, rounds, min_steps)[0]


def host_sharing(step: Step, fresh: Callable[[], Step], counts: tuple[int, ...], seconds: float = 2.0,
                 rounds: int = ROUNDS, min_steps: int = 4) -> tuple[Sharing, ...]:
    """For each of ``counts``, time that many fresh copies of a training step running at once against each alone
    (module docstring); one :class:`Sharing` per count, in order.

    ``max(counts)`` fresh Python processes are started once (spawned, as the workers are) and serve every count
    and round: their imports and data loading, most of a profile's time, are paid once (the reduced GNMT-8 on the
    2-core CI machine, one process alone: torch 1.9 s, fairseq and pipedream 2.9 s, its data 3.9 s). Every round,
    each copy calls ``fresh()`` for a step on a model and minibatch it builds itself, as a worker does (the
    profile's ``fresh`` loads the data sets once per process, :func:`pipedream.commands.profile.worker_step`): a
    memory layout of its own, built while its last round's copy still holds its memory, so the new one cannot
    take its place. (Copies made with ``copy.deepcopy`` in forked children ran the reduced GNMT-8 at 0.86-1.06x
    the profiling process's step, where a 1-rank run's forwards and backwards took 1.15-1.25x it.) A round: every
    copy builds its step and warms up twice; ``step`` is timed in this process alone while the copies wait
    blocked; then for each count ``n`` in ascending order the first ``n`` copies step together (they start at a
    barrier; each keeps stepping until all ``n`` have timed theirs) while the rest wait blocked; then each copy
    steps alone, one at a time, and times the optimizer steps its step carries, if any (:func:`_update_s`). Every
    count's ratio takes the same round's alone time of the same copy, so one
    model per copy and round serves all counts (measured count by count, with a model and an alone time per
    count, the reduced GNMT-8's probe took 65 s of its 80 s profile). A timing is a mean over
    ``seconds / rounds / (n + 2)`` for ``n`` copies together and ``seconds / rounds / (min(counts) + 2)`` alone,
    and at least ``min_steps`` steps (time slices of a shared core even out over several steps: with a median of
    two or three steps of AWD-LM's 0.2 s step its two-per-core figure moved from 1.14 to 1.44 between profiles).
    The caller should run single-threaded (``torch.set_num_threads(1)``), as the workers do.

    Args:
        step: one forward, loss and backward of the profiled minibatch on the profiled model.
        fresh: returns such a step on a model and minibatch of its own (called in each child; picklable: a
            module-level function or a ``functools.partial`` of one); a step with an ``updates`` attribute (name
            -> one optimizer step, :func:`pipedream.commands.profile.worker_step`) has those timed too
            (:attr:`Sharing.updates`).
        counts: copies at once, one measurement each (the host's cores, and twice as many); below 2 nothing
            is measured (slowdown 1.0, no layouts).
        seconds: about how long each count's timings take in all, s.
        rounds: repetitions; each slowdown is the median of its rounds'.
        min_steps: fewest steps of each timing.
    Raises:
        PipeDreamError: a child failed or did not report within its time.
    """
    measured = tuple(sorted(n for n in set(counts) if n >= 2))
    if not measured:
        return tuple(Sharing(1.0, ()) for _ in counts)
    step()  # warm up this process
    mine: list[float] = []  # this process's step, timed in each round while the copies wait

    def before_round() -> None:
        mine.append(_mean_step_s(step, _window_s(seconds, rounds, measured[0]), min_steps))

    timed = _together_then_alone(fresh, measured, rounds, seconds, min_steps, before_round)
    out: dict[int, Sharing] = {}
    for n in measured:
        share = max(1.0, n / host_cores())
        slowdowns, layouts, alone_s = [], [], []
        updates: dict[str, list[float]] = {}
        for own, (together, alone, optimizer_steps) in zip(mine, timed, strict=True):
            slowdowns.append(statistics.harmonic_mean([t / a for t, a in zip(together[n], alone[:n], strict=True)]) / share)
            layouts += [a / own for a in alone[:n]]
            alone_s += alone[:n]
            for steps in optimizer_steps[:n]:
                for name, seconds_ in steps.items():
                    updates.setdefault(name, []).append(seconds_)
        out[n] = Sharing(statistics.median(slowdowns), tuple(layouts), tuple(slowdowns),
                         {name: tuple(s) for name, s in updates.items()}, tuple(alone_s))
    return tuple(out.get(n, Sharing(1.0, ())) for n in counts)


# a round: per count n, the first n copies' step together; each one's alone; each one's optimizer steps (_update_s)
Timed = tuple[dict[int, list[float]], list[float], list[dict[str, float]]]


def _together_then_alone(fresh: Callable[[], Step], counts: tuple[int, ...], rounds: int, seconds: float,
                         min_steps: int, before_round: Callable[[], None]) -> list[Timed]:
    """Per round, every copy's mean step (s) together with the first ``n`` of ``counts`` (ascending) and alone, and
    its optimizer steps alone (:func:`_update_s`), on a model it built for the round; ``max(counts)`` children are
    started once; ``before_round()`` runs while they wait blocked, after they built the round's model."""
    ctx = mp.get_context("spawn")
    copies = max(counts)
    results = ctx.Queue()
    timeout = 600 + 2 * seconds * len(counts)
    # every phase of a round begins with every copy and this process at a barrier: a copy sitting a count out
    # waits there blocked, so nothing but the timed copies computes
    phase = ctx.Barrier(copies + 1)
    timed = [ctx.Value("i", 0) for _ in counts]
    turn = ctx.Lock()
    children = [ctx.Process(target=_child, args=(i, fresh, counts, rounds, seconds, min_steps, phase, timed, turn,
                                                   results, timeout), daemon=True) for i in range(copies)]
    for c in children:
        c.start()
    try:
        out: list[Timed] = []
        for _ in range(rounds):
            phase.wait(timeout=timeout)  # every copy built this round's model and warmed up
            before_round()
            for _ in counts:
                phase.wait(timeout=timeout)  # the count's copies go
            phase.wait(timeout=timeout)  # the last count's copies are done; the alone timings go
            got = sorted((results.get(timeout=timeout) for _ in range(copies)), key=lambda r: r[0])
            assert [r[0] for r in got] == list(range(copies)), got
            out.append(({n: [r[1][n] for r in got[:n]] for n in counts}, [r[2] for r in got], [r[3] for r in got]))
            phase.wait(timeout=timeout)  # every copy timed alone; they go on together
        return out
    except Exception as e:
        raise PipeDreamError(f"timing {' and '.join(map(str, counts))} copies of a step failed ({type(e).__name__}): "
                             "run `pipedream profile` again, with --host-seconds 0 to skip the host's measurement") from e
    finally:
        for c in children:
            c.join(timeout=5)
            if c.is_alive():
                c.kill()


def _child(index: int, fresh: Callable[[], Step], counts: tuple[int, ...], rounds: int, seconds: float,
           min_steps: int, phase: Any, timed: list[Any], turn: Any, results: Any,
           timeout: float) -> None:
    """Copy ``index``, every round: build a new step and warm up; for each count ``n`` it is among the first of,
    time its steps with the others and keep stepping until every one of them has its time (one finishing early
    would leave the rest a less busy host); then time its steps alone, one copy at a time, and go on to the next
    round when all have. It dies with the profiling process (a profile killed mid-round leaves no copy waiting at
    a barrier)."""
    pdeathsig_kill()
    for r in range(rounds):
        step = fresh()  # the last round's step is released only once this one holds its own memory
        step()
        step()
        phase.wait(timeout=timeout)  # built; this process times its own step
        together: dict[int, float] = {}
        for n, count in zip(counts, timed, strict=True):
            phase.wait(timeout=timeout)  # the first n copies go together
            if index >= n:
                continue
            together[n] = _mean_step_s(step, _window_s(seconds, rounds, n), min_steps)
            with count.get_lock():
                count.value += 1
            while count.value < (r + 1) * n:
                step()
        phase.wait(timeout=timeout)
        with turn:
            alone = _mean_step_s(step, _window_s(seconds, rounds, counts[0]), min_steps)
            updates = _update_s(step)
        results.put((index, together, alone, updates))
        # go on together: one building its next model (or tearing down) slowed the next ones alone (GNMT-8: 99,
        # 116, 138, 194 ms)
        phase.wait(timeout=timeout)


def _update_s(step: Step) -> dict[str, float]:
    """Seconds of one step of each optimizer ``step`` carries (``step.updates``: name -> a function doing one
    optimizer step over the copy's parameters, :func:`pipedream.step_rates.update_step`; none: ``{}``), timed once
    each as a worker meets it, right after a training step (whose activations have left the weights, gradients
    and optimizer state out of the caches): an untimed first step (it creates the optimizer's state), a training
    step, then the timed one. One timing a round per copy: a draw of the copy's memory layout and of the host's
    speed, as its step alone is; the profile takes their mean over the copies and rounds."""
    out: dict[str, float] = {}
    for name, update in getattr(step, "updates", {}).items():
        update()
        step()
        t0 = time.perf_counter()
        update()
        out[name] = time.perf_counter() - t0
    return out


def _window_s(seconds: float, rounds: int, copies: int) -> float:
    """Seconds of one timing of ``copies`` stepping together (for the smallest count, also of this process's step
    and of each copy alone): ``seconds`` over the rounds and ``copies + 2`` timings, the windows each count had
    when it ran rounds of its own."""
    return seconds / rounds / (copies + 2)


def _mean_step_s(step: Step, seconds: float, min_steps: int) -> float:
    """Mean seconds of ``step()`` over at least ``seconds`` and ``min_steps`` calls."""
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() < t0 + seconds or n < min_steps:
        step()
        n += 1
    return (time.perf_counter() - t0) / n
