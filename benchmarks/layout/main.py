"""Is a process's step time a draw of its own, or the host's speed at the moment it is timed?

The profile's host probe times fresh copies of the step (``meta.json`` ``host.layouts``: each copy's step over the
profiling process's, :mod:`pipedream.host_timing`) and the prediction draws every rank's speed from them
(:mod:`pipedream.sim.layout`), on the reading that where a process's tensors land in memory fixes its speed for
its life. A host whose speed drifts over seconds (``benchmarks/drift``) spreads fresh copies timed at different
moments just as much, without any draw of a process's own. This benchmark tells the two apart: one long-lived
process (built once, as a worker is) and fresh spawned processes (each building its model and minibatch again,
:func:`pipedream.commands.profile.worker_step`) take turns, ``--rounds`` times: a window of ``--steps`` steps in
the long-lived process, then one in a new fresh process, each window's median step in main-thread CPU seconds
(``time.thread_time``) after 2 untimed steps.

Printed per model: every round's two medians, then the coefficient of variation of the long-lived process's
windows (the host's drift alone: it is always the same process) and of the fresh processes' (drift and draw), and
of their paired ratio. If a process's layout set its speed, the fresh processes would spread more than the
long-lived one's windows; if the host's drift did, both spread alike. One copy at a time, on an otherwise idle
host.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/layout/main.py [--models gnmt8 s2vt vgg16] [--rounds 10]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import queue
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.drift.main import cv  # noqa: E402  (the drift benchmark's coefficient of variation)
from pipedream.commands.profile import worker_step  # noqa: E402
from pipedream.runtime.config import TrainConfig  # noqa: E402

WARMUP = 2  # untimed steps before a window (the first steps allocate what later ones reuse)


def build(model: str, batch: int) -> Callable[[], None]:
    """``model``'s (reduced preset) training step on its first ``batch`` training samples, built as a worker
    builds its model (:func:`pipedream.commands.profile.worker_step`, one thread)."""
    cfg = TrainConfig(model=model, preset="reduced", seed=0, data="real", batch_size=batch)
    return worker_step(cfg, list(range(batch)), 1)


def window_s(step: Callable[[], None], steps: int) -> float:
    """Median main-thread CPU seconds of ``steps`` calls of ``step``, after :data:`WARMUP` untimed ones."""
    for _ in range(WARMUP):
        step()
    times = []
    for _ in range(steps):
        t0 = time.thread_time()
        step()
        times.append(time.thread_time() - t0)
    return statistics.median(times)


def _fresh(model: str, batch: int, steps: int, out: Any) -> None:
    """A fresh process: build the step, time one window, report it."""
    out.put(window_s(build(model, batch), steps))


def summary(long_lived: list[float], fresh: list[float]) -> tuple[float, float, float]:
    """``(cv of the long-lived windows, cv of the fresh processes' windows, cv of fresh / long-lived paired by
    round)``: the drift benchmark's ``cv`` of each. Raises ValueError when the two lists differ in length."""
    if len(long_lived) != len(fresh):
        raise ValueError(f"{len(long_lived)} long-lived windows but {len(fresh)} fresh ones")
    return cv(long_lived), cv(fresh), cv([f / o for f, o in zip(fresh, long_lived, strict=True)])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["gnmt8", "s2vt", "vgg16"], help="registered models (reduced)")
    ap.add_argument("--rounds", type=int, default=10, help="windows of each kind per model (default 10)")
    ap.add_argument("--steps", type=int, default=15, help="timed steps a window (default 15)")
    ap.add_argument("--batch", type=int, default=32, help="samples a step (default 32)")
    args = ap.parse_args(argv)
    if args.rounds < 2 or args.steps < 1:
        ap.error("--rounds must be at least 2 and --steps at least 1")
    ctx = mp.get_context("spawn")  # as the workers start
    for model in args.models:
        step = build(model, args.batch)
        long_lived, fresh = [], []
        for r in range(args.rounds):
            long_lived.append(window_s(step, args.steps))
            out = ctx.Queue()
            child = ctx.Process(target=_fresh, args=(model, args.batch, args.steps, out))
            child.start()
            try:
                fresh.append(out.get(timeout=600))
            except queue.Empty:
                child.kill()
                sys.exit(f"error: the fresh {model} process timed no window in 600 s (exit code {child.exitcode}); "
                         "run it alone to see why")
            child.join(timeout=60)
            if child.is_alive():  # reported, but did not exit: leave no process behind
                child.kill()
            print(f"{model} round {r}: long-lived {long_lived[-1] * 1e3:.1f} ms, fresh {fresh[-1] * 1e3:.1f} ms",
                  flush=True)
        own, new, paired = summary(long_lived, fresh)
        print(f"{model}: cv long-lived {own:.3f} (range {min(long_lived) * 1e3:.1f}-{max(long_lived) * 1e3:.1f} ms), "
              f"fresh {new:.3f} ({min(fresh) * 1e3:.1f}-{max(fresh) * 1e3:.1f} ms), fresh / long-lived {paired:.3f}",
              flush=True)


if __name__ == "__main__":
    main()
