"""Does the C allocator make a fresh process's training step a draw? Fresh processes, one thread, one at a time.

The profile and the probes keep freed memory (:func:`pipedream.allocator.keep_freed_memory`: glibc's mmap and
trim thresholds raised, so a step's blocks are reused rather than unmapped and faulted in again); the workers run
on jemalloc where it is installed. This starts ``--processes`` fresh processes per mode, alternating ``default``
(``PIPEDREAM_MALLOC=default``: glibc as it is), ``keep`` and, where it is installed, ``jemalloc`` (started with
:func:`pipedream.allocator.worker_env`, as the launcher starts the workers since 2026-11-30), each setting its
allocator first, as a worker does, then building the model and the profile's step
(:func:`pipedream.commands.profile.runtime_step` on the first minibatch of epoch 1) and timing ``--steps`` steps
after ``--warmup``, with the ``--optimizer``'s step between steps as a worker has (none: the profile's step
alone). For each model and mode it prints the mean over processes of each one's median step (main-thread CPU,
:func:`time.thread_time`), their spread (min-max and coefficient of variation: how much of a draw a fresh process
is) and the minor page faults a step (``getrusage(RUSAGE_THREAD)``), then each mode's mean over default's. A loop
of one step is the pattern in which glibc's kept heap does not fragment; a worker's is not
(:mod:`pipedream.allocator`): to compare allocators on the runs themselves, run ``benchmarks/repeat`` with
``PIPEDREAM_MALLOC=keep`` and without.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/malloc/main.py --models s2vt vgg16 --processes 6
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # `pipedream` from this checkout, also in a worktree

from pipedream.allocator import jemalloc_library, worker_env  # noqa: E402

MODES = ("default", "keep", "jemalloc") if jemalloc_library() else ("default", "keep")


def child(model: str, steps: int, warmup: int, optimizer: str) -> dict[str, float]:
    """One fresh process's measurement: median step (s) and median minor faults a step. The allocator is set first
    thing, before the model and data exist, as a worker's ``main`` sets it."""
    import torch

    from pipedream.allocator import keep_freed_memory
    from pipedream.commands.profile import runtime_step
    from pipedream.data.fashion_mnist import minibatch_indices
    from pipedream.runtime.config import TrainConfig
    from pipedream.runtime.optim import make_optimizer
    from pipedream.runtime.task import load_task

    keep_freed_memory()  # unless PIPEDREAM_MALLOC=default
    torch.set_num_threads(1)
    task = load_task(TrainConfig(model=model, preset="reduced", seed=0, data="real", batch_size=32))
    x, y = task.train.batch(minibatch_indices(len(task.train), 32, 0, 0)[0])
    step = runtime_step(task.model, task.criterion, x, y)  # the profile's step (worker_step without its data cache)
    masters = [torch.zeros_like(g).requires_grad_() for g in step.grads]
    opt = make_optimizer(TrainConfig(optimizer=optimizer, lr=1e-4), masters, ()) if optimizer != "none" else None
    times, faults = [], []
    for i in range(warmup + steps):
        use0, c0 = resource.getrusage(resource.RUSAGE_THREAD), time.thread_time()
        step()
        c1, use1 = time.thread_time(), resource.getrusage(resource.RUSAGE_THREAD)
        if opt is not None:
            for m, g in zip(masters, step.grads, strict=True):
                m.grad = g
            opt.step()
            for g in step.grads:
                g.zero_()
        if i >= warmup:
            times.append(c1 - c0)
            faults.append(use1.ru_minflt - use0.ru_minflt)
    return {"step_s": statistics.median(times), "faults": statistics.median(faults)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["s2vt", "vgg16", "alexnet", "resnet50"])
    p.add_argument("--processes", type=int, default=6, help="fresh processes per model and mode")
    p.add_argument("--steps", type=int, default=20, help="timed steps per process (their median is kept)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    p.add_argument("--optimizer", default="adam", help="optimizer stepped between steps, or none")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.steps, args.warmup, args.optimizer)))
        return
    env = dict(os.environ, OMP_NUM_THREADS="1")
    print(f"{args.processes} fresh processes per mode, alternating; {args.steps} steps each, optimizer {args.optimizer}")
    print("model      mode     mean ms  min-max ms      cv     faults/step")
    for model in args.models:
        got: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
        for _ in range(args.processes):
            for mode in MODES:
                run_env = dict(env, PIPEDREAM_MALLOC=mode)
                run_env.update(worker_env(run_env))  # jemalloc's variables for that mode only (the mode decides)
                out = subprocess.run([sys.executable, __file__, "--child", model, "--steps", str(args.steps),
                                      "--warmup", str(args.warmup), "--optimizer", args.optimizer],
                                     env=run_env, capture_output=True, text=True, check=True)
                got[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
        means = {}
        for mode in MODES:
            ms = [r["step_s"] * 1e3 for r in got[mode]]
            f = [r["faults"] for r in got[mode]]
            means[mode] = statistics.fmean(ms)
            cv = statistics.pstdev(ms) / means[mode]
            print(f"{model:10} {mode:8} {means[mode]:7.1f}  {min(ms):6.1f}-{max(ms):<6.1f}  {cv:6.3f}  "
                  f"{min(f):.0f}-{max(f):.0f}")
        print(f"{model:10} " + ", ".join(f"{m} / default: {means[m] / means['default']:.3f}" for m in MODES[1:]))


if __name__ == "__main__":
    main()
