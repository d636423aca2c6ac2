"""A training step's CPU seconds after an idle gap: back to back against after a sleep, alone and in lockstep.

A run's ranks compute in bursts between waits (DP's replicas for the link, a pipeline's stages for their
receives), where the profile's layers and its host probe (:func:`pipedream.host_timing.host_contention`) step
back to back. Each copy here is a fresh process stepping ``--steps`` times the reduced model's forward, loss
and backward (:func:`pipedream.commands.profile.worker_step`, the host probe's step), every step starting at a
barrier of the copies and followed by a sleep of ``gap`` seconds; it reports its main thread's CPU seconds a
step (:func:`time.thread_time`, median over the steps after two). CPU seconds, not wall: the share of a core
each copy gets is processor sharing's and does not enter. The table prints each case's mean over the copies
and the repeats, and its ratio to one copy back to back.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/host/main.py [--model alexnet] [--batch 32] \
        [--copies 1 4] [--gaps 0 0.05] [--spin-gaps] [--steps 25] [--repeats 4]
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing as mp
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pipedream.commands.profile import worker_step  # noqa: E402
from pipedream.data.fashion_mnist import minibatch_indices  # noqa: E402
from pipedream.runtime.config import TrainConfig  # noqa: E402
from pipedream.runtime.task import load_task  # noqa: E402


def _copy(fresh: Callable[[], Callable[[], None]], steps: int, gap_s: float, spin: bool, barrier: Any,
          out: Any) -> None:
    """One copy: warm up twice, then ``steps`` steps, each after the barrier and followed by ``gap_s`` of sleep
    (``spin``: of busy waiting)."""
    step = fresh()
    step()
    step()
    cpu = []
    for _ in range(steps):
        barrier.wait(timeout=300)
        c0 = time.thread_time()
        step()
        cpu.append(time.thread_time() - c0)
        if gap_s and spin:
            end = time.perf_counter() + gap_s
            while time.perf_counter() < end:
                pass
        elif gap_s:
            time.sleep(gap_s)
    out.put(statistics.median(cpu[2:]))


def cpu_per_step_s(fresh: Callable[[], Callable[[], None]], copies: int, gap_s: float, steps: int,
                   spin: bool = False) -> float:
    """Mean over ``copies`` fresh processes of their median CPU seconds a step (module docstring); ``spin``: the
    gap is a busy wait, not a sleep."""
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(copies), ctx.Queue()
    procs = [ctx.Process(target=_copy, args=(fresh, steps, gap_s, spin, barrier, out), daemon=True) for _ in range(copies)]
    for p in procs:
        p.start()
    try:
        return statistics.fmean(out.get(timeout=600) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="alexnet", help="a registered model, reduced preset")
    ap.add_argument("--batch", type=int, default=32, help="samples a step")
    ap.add_argument("--copies", type=int, nargs="+", default=[1, 4], help="processes stepping in lockstep")
    ap.add_argument("--gaps", type=float, nargs="+", default=[0.0, 0.05], help="sleep after each step, s")
    ap.add_argument("--spin-gaps", type=float, nargs="*", default=[],
                    help="busy waits after each step, s (cases beside --gaps' sleeps)")
    ap.add_argument("--steps", type=int, default=25, help="timed steps per copy (the first two are not counted)")
    ap.add_argument("--repeats", type=int, default=4, help="times each case runs, interleaved with the others")
    args = ap.parse_args(argv)
    cfg = TrainConfig(model=args.model, preset="reduced", seed=0, data="real", batch_size=args.batch)
    rows = minibatch_indices(len(load_task(cfg).train), args.batch, 0, 0)[0]
    fresh = functools.partial(worker_step, cfg, rows, 1)
    cases = [(n, g, spin) for n in args.copies
             for g, spin in [(g, False) for g in args.gaps] + [(g, True) for g in args.spin_gaps]]
    got: dict[tuple[int, float, bool], list[float]] = {c: [] for c in cases}
    for _ in range(args.repeats):
        for n, g, spin in cases:
            got[(n, g, spin)].append(cpu_per_step_s(fresh, n, g, args.steps, spin))
    base = statistics.fmean(got[cases[0]])
    print(f"{args.model} (reduced), batch {args.batch}: CPU seconds a step, over {cases[0][0]} copy with a "
          f"{cases[0][1]:g} s gap ({base * 1e3:.1f} ms)")
    print(f"{'copies':>6} {'gap s':>6} {'gap':>5} {'ms/step':>8} {'ratio':>6}   repeats (ms)")
    for n, g, spin in cases:
        mean = statistics.fmean(got[(n, g, spin)])
        print(f"{n:>6} {g:>6g} {'spin' if spin else 'sleep':>5} {mean * 1e3:>8.1f} {mean / base:>6.2f}   "
              + " ".join(f"{v * 1e3:.1f}" for v in got[(n, g, spin)]))


if __name__ == "__main__":
    main()
