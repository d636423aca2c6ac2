"""The host's speed when a run starts, against its speed when the run's profile was taken (CPU hosts).

A prediction stands on the profile's step time (``meta.json`` ``whole_step_s`` and ``host.layouts``,
:mod:`pipedream.host_timing`), taken minutes to hours before the run. A shared virtual machine does not keep its
speed that long: on the 2-core CI machine the same reduced AlexNet step, timed back to back in one process,
took 14.7-24.0 ms over six repeats within minutes (``benchmarks/host``), and the profiles of one ``make run``
put whole models' compute at 0.8-1.4x of what their runs' CPU clocks measured. So before a run's workers start,
:func:`speed_now` times the profiled training step again, on this host, now: ``copies`` fresh copies of the
model (each one a draw of where its tensors land in memory, as the workers' are) stepping in turns on the
profiled minibatch, and compares their mean step with the profile's expected fresh copy, ``whole_step_s`` times
the mean of ``host.layouts``. The ratio (``Speed.factor``) scales the prediction's compute
(:func:`pipedream.sim.predict.predict_run`'s ``speed``).

This is a measurement of the host before the run, as the profile is; nothing of the run itself enters it (the
workers have not started). It needs the profile's own minibatch and model, rebuilt from ``meta.json``
(model, preset, data, seed, minibatch size), and a profile taken on a host of this many cores with its host
probe (``host.layouts``); without one there is nothing to compare with and no factor (None).
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Step = Callable[[], Any]


@dataclass(frozen=True)
class Speed:
    """One :func:`speed_now` measurement.

    Attributes:
        factor: the copies' mean step now over the profile's expected fresh copy (dimensionless; > 1: the host
            is slower now than when profiled).
        now_s: the copies' mean step now, s (each copy's median step, then their mean).
        profiled_s: the profile's expected fresh copy, ``whole_step_s * mean(host.layouts)``, s.
        copies_s: each copy's median step now, s.
    """

    factor: float
    now_s: float
    profiled_s: float
    copies_s: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (``prediction.json``'s ``host_speed``)."""
        return {"factor": self.factor, "now_s": self.now_s, "profiled_s": self.profiled_s,
                "copies_s": list(self.copies_s)}


def runtime_step(model: Any, criterion: Callable[[Any, Any], Any], xs: Any, ys: Any) -> Step:
    """One whole training step as a worker runs its stage: the forward on leaf aliases of the weights (a weight
    version, :mod:`pipedream.runtime.versions`) through ``torch.func.functional_call``, the loss, and the
    gradients with ``torch.autograd.grad``."""
    import torch

    from pipedream.capture import call_args

    aliases = {n: p.detach().requires_grad_(p.requires_grad) for n, p in model.named_parameters()}
    args_, kwargs_ = call_args(xs)
    needed = [t for t in aliases.values() if t.requires_grad]

    def run() -> None:
        loss = criterion(torch.func.functional_call(model, aliases, args_, kwargs_), ys)
        torch.autograd.grad(loss, needed, allow_unused=True)

    return run


def worker_step(cfg: Any, rows: Any, threads: int) -> Step:
    """:func:`runtime_step` on the model and minibatch (``rows`` of the training set) that this process builds from
    ``cfg`` (a :class:`~pipedream.runtime.config.TrainConfig`) as a worker does: for
    :func:`pipedream.host_timing.host_contention`'s fresh processes."""
    import torch

    from pipedream.runtime.task import load_task

    torch.set_num_threads(threads)
    task = load_task(cfg)
    x, y = task.train.batch(rows)
    return runtime_step(task.model, task.criterion, x, y)


def profiled_steps(meta: dict[str, Any], minibatch: int, copies: int) -> list[Step]:
    """``copies`` training steps of the profile's model on the profile's minibatch (``meta``: its ``meta.json``;
    ``minibatch``: its samples), the first on the model as built, the others on deep copies of it (fresh
    storages: a memory layout each).

    Raises:
        PipeDreamError: an unknown model or a missing data set (:func:`pipedream.runtime.task.load_task`).
    """
    from pipedream.data.fashion_mnist import minibatch_indices
    from pipedream.runtime.config import TrainConfig
    from pipedream.runtime.task import load_task

    seed = int(meta.get("seed", 0))
    cfg = TrainConfig(model=str(meta["model"]), preset=str(meta.get("preset", "reduced")), seed=seed,
                      data=str(meta.get("data", "real")), batch_size=minibatch)
    task = load_task(cfg)
    rows = minibatch_indices(len(task.train), minibatch, seed, 0)[0]
    x, y = task.train.batch(rows)
    models = [task.model] + [copy.deepcopy(task.model) for _ in range(copies - 1)]
    return [runtime_step(m, task.criterion, x, y) for m in models]


def step_times(steps: list[Step], seconds: float, min_steps: int = 3) -> tuple[float, ...]:
    """Each step's median seconds, the steps called in turns (so a change of the host's speed during the
    measurement reaches all alike) for about ``seconds`` and at least ``min_steps`` turns, after two untimed
    calls of each."""
    for s in steps:
        s()
        s()
    times: list[list[float]] = [[] for _ in steps]
    start = time.perf_counter()
    while len(times[0]) < min_steps or time.perf_counter() < start + seconds:
        for s, kept in zip(steps, times, strict=True):
            t0 = time.perf_counter()
            s()
            kept.append(time.perf_counter() - t0)
    return tuple(statistics.median(kept) for kept in times)


def expected_copy_s(meta: dict[str, Any], cores: int) -> float | None:
    """The profile's expected step of a fresh copy on this host, s: ``whole_step_s`` times the mean of
    ``host.layouts`` (each fresh copy's step over the profiling process's, :mod:`pipedream.sim.layout`); None
    when the profile has no whole step, no layouts, or was taken on a host of another core count."""
    from pipedream.sim import layout

    host, step_s = meta.get("host"), meta.get("whole_step_s")
    if not isinstance(host, dict) or host.get("cores") != cores or not isinstance(step_s, int | float) or step_s <= 0:
        return None
    draws = host.get("layouts")
    if not isinstance(draws, list) or not draws:
        return None
    mean, _ = layout.spread([float(p) for p in draws if isinstance(p, int | float)])
    return float(step_s) * mean


def speed_now(meta: dict[str, Any], minibatch: int, cores: int, threads: int, seconds: float = 2.0,
              copies: int = 4) -> Speed | None:
    """Time the profile's training step on this host now (module docstring) and compare it with the profile's.

    Args:
        meta: the profile's ``meta.json``; minibatch: its profiled minibatch, samples.
        cores: this host's cores (the profile must have been taken on as many); threads: threads per worker
            (the profile's ``threads`` must match, else None).
        seconds: about how long the steps are timed, s; copies: fresh copies of the model timed in turns.
    Returns:
        The measurement, or None when the profile has nothing to compare with (:func:`expected_copy_s`), was
        taken with another thread count, or ``seconds`` is not positive.
    Raises:
        PipeDreamError: the profile's model or data cannot be built here.
    """
    import torch

    reference = expected_copy_s(meta, cores)
    if reference is None or seconds <= 0 or int(meta.get("threads", 1)) != threads or copies < 1:
        return None
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        times = step_times(profiled_steps(meta, minibatch, copies), seconds)
    finally:
        torch.set_num_threads(before)
    now = statistics.fmean(times)
    return Speed(now / reference, now, reference, times)
