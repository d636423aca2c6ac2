"""Does a backward cost more CPU when its minibatch's forward ran several actions earlier, as in 1F1B's stages
before the last? ``--copies`` processes at once (default one per core this process may use, each pinned to its
own core), each with the reduced model, alternate windows of ``--steps`` forward-backward pairs at each in-flight
depth ``k`` of ``--depths``: depth 0 runs ``F(i) B(i)`` as the profile times a step; depth ``k`` keeps ``k``
minibatches' forwards alive, ``F(i + k) B(i)``, as a 1F1B stage ``k`` stages from the last does in steady state.
Forwards run through ``torch.func.functional_call`` and backwards through ``torch.autograd.grad``, as the runtime's
stages (:mod:`pipedream.runtime.executor`). It prints, per model, the main thread's median CPU ms per pair
(``time.thread_time``) at each depth and its ratio to depth 0, median over copies.

Why: on the device machine's cores (one core per worker, session 33) every pipeline's last stage computed at
0.93-1.02x its predicted work (AlexNet's 1.13x) and every stage before the last at 1.14-1.29x, while the profile
times ``F(i) B(i)`` back to back. One process alone on the 2-core CI VM saw no depth effect (ResNet-50 0.96x at
depth 3, VGG-16 1.02x); this checks it with every core busy.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/inflight/main.py [--models resnet50 gnmt8] [--depths 0 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def copy_main(core: int | None, model_name: str, depths: list[int], steps: int, rounds: int, barrier, queue) -> None:  # type: ignore[no-untyped-def]
    """One copy: build the model and 8 minibatches, then ``rounds`` rounds of one window per depth (their order
    alternating), every window started at the barrier; puts ``{depth: [median CPU s per pair, ...]}``."""
    if core is not None:
        os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    from torch.func import functional_call

    from pipedream.allocator import keep_freed_memory
    from pipedream.capture import call_args
    from pipedream.runtime.config import TrainConfig
    from pipedream.runtime.task import load_task

    keep_freed_memory()  # as the workers do
    task = load_task(TrainConfig(model=model_name, preset="reduced", seed=0, data="real", batch_size=32))
    model, criterion = task.model, task.criterion
    params = {n: p.detach().requires_grad_(p.requires_grad) for n, p in model.named_parameters()}
    wrt = [p for p in params.values() if p.requires_grad]
    batches = [task.train.batch(list(range(32 * j, 32 * j + 32))) for j in range(8)]

    def forward(j: int):  # type: ignore[no-untyped-def]
        xs, ys = batches[j % len(batches)]
        args_, kwargs_ = call_args(xs)
        return criterion(functional_call(model, params, args_, kwargs_), ys)

    def window(depth: int) -> float:
        alive = [forward(j) for j in range(depth)]
        spent = []
        for j in range(steps):
            c0 = time.thread_time()
            alive.append(forward(depth + j))
            torch.autograd.grad(alive.pop(0), wrt, allow_unused=True)
            spent.append(time.thread_time() - c0)
        for loss in alive:
            torch.autograd.grad(loss, wrt, allow_unused=True)
        return statistics.median(spent)

    for d in depths:  # warm-up
        window(d)
    out: dict[int, list[float]] = {d: [] for d in depths}
    for r in range(rounds):
        for d in (depths if r % 2 == 0 else depths[::-1]):
            barrier.wait(timeout=600)
            out[d].append(window(d))
    queue.put(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--models", nargs="+", default=["resnet50", "gnmt8", "vgg16"], help="reduced models")
    p.add_argument("--depths", nargs="+", type=int, default=[0, 1, 3], help="in-flight depths; the first is the "
                   "reference (default 0 1 3)")
    p.add_argument("--copies", type=int, default=None, help="processes at once (default: one per allowed core)")
    p.add_argument("--steps", type=int, default=8, help="pairs a window (default 8)")
    p.add_argument("--rounds", type=int, default=6, help="windows per depth (default 6)")
    args = p.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    copies = args.copies or len(cores)
    if min(args.depths) < 0 or args.steps < 1 or args.rounds < 1 or copies < 1:
        print("error: depths must be >= 0, and steps, rounds and copies >= 1", file=sys.stderr)
        return 2
    pinned = copies <= len(cores)
    print(f"{copies} copies on cores {cores}" + (" (one each)" if pinned else " (sharing them)"), flush=True)
    ctx = mp.get_context("spawn")
    for model in args.models:
        barrier, queue = ctx.Barrier(copies), ctx.Queue()
        procs = [ctx.Process(target=copy_main, args=(cores[i] if pinned else None, model, args.depths, args.steps,
                                                    args.rounds, barrier, queue)) for i in range(copies)]
        for proc in procs:
            proc.start()
        try:
            results = [queue.get(timeout=1800) for _ in procs]
        finally:
            for proc in procs:
                proc.join(timeout=60)
                if proc.is_alive():
                    proc.kill()
        ref = args.depths[0]
        medians = {d: statistics.median(statistics.median(r[d]) for r in results) for d in args.depths}
        ratios = {d: statistics.median(statistics.median(r[d]) / statistics.median(r[ref]) for r in results)
                  for d in args.depths}
        print(f"{model}: " + ", ".join(f"depth {d} {1e3 * medians[d]:.1f} ms ({ratios[d]:.3f})" for d in args.depths),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
