"""What DDP adds to a data-parallel replica's compute: the same forward and backward, plain and under DDP.

``--processes`` spawned processes (one thread each, as the workers run) join one gloo group, build the same
reduced model (``--model``, the preset ``reduced`` on its real data) and each take its own minibatch of
``--batch-size`` samples. Then, all processes at once and separated by barriers, each times ``--steps`` forward
and backward passes (``loss.backward()``, gradients kept and zeroed, as the DDP baseline's workers do;
:mod:`pipedream.baselines.ddp`) in three modes, in turn, ``--passes`` times over:

- plain: the module itself, no DDP;
- ddp-local: DDP with a communication hook that returns its bucket untouched (DDP's own work: the autograd
  hooks and the buckets; no allreduce);
- ddp-gloo: DDP with gloo's allreduce of every bucket, launched while the backward goes on.

DDP runs as the DP baseline runs it, with ``gradient_as_bucket_view=True`` (the gradients are views into the
buckets); ``--copy-buckets`` takes DDP's default instead (each gradient copied into its bucket and back). It
prints each rank's median wall and main-thread CPU milliseconds (:func:`time.thread_time`) per pass, and the
CPU of each DDP mode over plain's (medians over ranks and passes). In ddp-gloo the wall time also holds the wait
for the last bucket's allreduce at the end of the backward; the main thread's CPU does not.

Why: with a core per worker (issue #18, the device machine) the DP runs' compute took 1.2-1.3x the prediction's
on the convolutional models, beyond the pipelines' stages; what DDP itself costs was not known.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ddp/main.py --model alexnet [--processes 4]
"""

from __future__ import annotations

import argparse
import datetime
import os
import queue
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `pipedream` from this checkout, also in a worktree

MODES = ("plain", "ddp-local", "ddp-gloo")


def _local(state, bucket):  # type: ignore[no-untyped-def]
    """A DDP communication hook that communicates nothing: the bucket as it is, already completed (no annotations:
    DDP checks them at run time, and ``from __future__ import annotations`` turns them into strings)."""
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def _worker(rank: int, world: int, store_path: str, args: argparse.Namespace, out: Any) -> None:
    """One process: every mode ``args.passes`` times; puts ``(rank, {mode: [(wall_s, cpu_s), ...]})``."""
    torch.set_num_threads(1)
    from torch.nn.parallel import DistributedDataParallel

    from pipedream.capture import call_model
    from pipedream.data.fashion_mnist import minibatch_indices
    from pipedream.runtime.config import TrainConfig
    from pipedream.runtime.task import load_task

    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=args.timeout_s))
    task = load_task(TrainConfig(model=args.model, preset="reduced", seed=0, data="real", batch_size=args.batch_size))
    x, y = task.train.batch(minibatch_indices(len(task.train), args.batch_size, 0, 0)[rank])
    model = task.model
    view = not args.copy_buckets  # the DDP baseline's gradient_as_bucket_view=True (pipedream.baselines.ddp)
    local = DistributedDataParallel(model, gradient_as_bucket_view=view)
    local.register_comm_hook(None, _local)
    modules = {"plain": model, "ddp-local": local,
               "ddp-gloo": DistributedDataParallel(model, gradient_as_bucket_view=view)}

    def one(module: torch.nn.Module) -> None:
        model.zero_grad(set_to_none=False)
        task.criterion(call_model(module, x), y).backward()

    res: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
    for _ in range(args.passes):
        for mode in MODES:
            for _ in range(2):  # warm-up
                one(modules[mode])
            dist.barrier()
            walls, cpus = [], []
            for _ in range(args.steps):
                w, c = time.perf_counter(), time.thread_time()
                one(modules[mode])
                walls.append(time.perf_counter() - w)
                cpus.append(time.thread_time() - c)
            res[mode].append((statistics.median(walls), statistics.median(cpus)))
            dist.barrier()
    out.put((rank, res))
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--model", default="alexnet", help="a registered model, reduced preset (default alexnet)")
    p.add_argument("--processes", type=int, default=4, help="processes in the gloo group (default 4, make run's)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per process and pass (default 32)")
    p.add_argument("--steps", type=int, default=15, help="timed passes per mode, the median kept (default 15)")
    p.add_argument("--passes", type=int, default=2, help="times over the three modes (default 2)")
    p.add_argument("--copy-buckets", action="store_true",
                   help="DDP's default gradient_as_bucket_view=False: gradients copied into buckets and back (the "
                        "baseline's gradients are views into the buckets)")
    p.add_argument("--timeout-s", type=float, default=300.0, help="gloo's timeout (default 300)")
    args = p.parse_args()
    if args.processes < 2 or min(args.batch_size, args.steps, args.passes) < 1:
        print("error: --processes must be >= 2 and --batch-size, --steps, --passes positive", file=sys.stderr)
        return 2
    print(f"{args.model}: {args.processes} processes on {len(os.sched_getaffinity(0))} cores, {args.steps} passes "
          f"of {args.batch_size} samples per mode, {args.passes} times; median wall / main-thread CPU ms",
          flush=True)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=_worker, args=(r, args.processes, str(Path(tmp) / "store"), args, out),
                             daemon=True) for r in range(args.processes)]
        for q in procs:
            q.start()
        results: list[Any] = []
        deadline = time.monotonic() + args.timeout_s * 2
        try:
            while len(results) < len(procs):
                try:
                    results.append(out.get(timeout=1.0))
                except queue.Empty:
                    dead = [r for r, q in enumerate(procs) if q.exitcode not in (None, 0)]
                    if dead or time.monotonic() > deadline:
                        what = f"rank {dead[0]} exited with {procs[dead[0]].exitcode}" if dead else "timed out"
                        print(f"error: {what} (its traceback is above)", file=sys.stderr)
                        return 1
            results.sort()
        finally:
            for q in procs:
                q.join(timeout=30)
                if q.is_alive():
                    q.kill()
    for rank, res in results:
        print(f"  rank {rank}: " + "   ".join(f"{m} " + " ".join(f"{w * 1e3:.1f}/{c * 1e3:.1f}" for w, c in res[m])
                                            for m in MODES))
    cpu = {m: statistics.median(c for _, res in results for _, c in res[m]) for m in MODES}
    print("  CPU over plain's: " + ", ".join(f"{m} {cpu[m] / cpu['plain']:.2f}" for m in MODES[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
