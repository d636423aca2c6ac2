"""Gloo allreduce on a shared CPU host: alone, and while every process computes (DDP's overlapped buckets).

Each of ``--processes`` spawned processes (one thread each, as the workers run) joins one gloo group and, every
iteration, times three cases of an allreduce of ``--mib`` MiB:

- quiet: all processes start it together at a barrier and do nothing else (what a probe of the link sees);
- overlapped: each launches it asynchronously and keeps computing (small matrix products) for
  ``--compute-ms``, polling it between products: the time until it is seen completed (DDP's buckets reduced
  while the backward goes on; granularity one product, printed);
- after skewed compute: each computes a different amount, then a blocking allreduce: its wait (the skew
  between replicas plus the allreduce, DDP's last bucket).

The quiet case's process CPU (every thread: gloo's included) is printed too, the CPU one member spends on one
allreduce; with ``--profile`` beside what the simulator charges for it from that profile: its measured allreduce
(``host.allreduce_s``, since session 37) or, in an older profile, the estimate from its point-to-point message
cost (:func:`pipedream.sim.transport_cpu.allreduce_cpu_s`).

Why: in `make run` (4 workers on 2 cores) every data-parallel run's measured wait for its allreduce exceeded
the simulated one by 22-64 ms a step (README, session 20); gloo's ring advances only when each process's
communication thread gets a core, which on an oversubscribed host it shares with every worker's compute.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/allreduce/main.py [--processes 4] [--mib 1.5] [--iters 40] \
        [--profile results/profiles/alexnet]
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

CASES = ("quiet", "overlapped", "after skewed compute")


def _worker(rank: int, world: int, store_path: str, mib: float, iters: int, compute_s: float, out: object) -> None:
    """One process: the three cases, ``iters`` times each, interleaved; puts ``(rank, product_s, {case: [s]},
    [quiet CPU s])``."""
    torch.set_num_threads(1)
    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    buf = torch.randn(int(mib * 2**20 / 4))
    a, b = torch.randn(192, 192), torch.randn(192, 192)

    def product() -> None:
        for _ in range(4):
            torch.mm(a, b)

    t = time.perf_counter()
    for _ in range(50):
        product()
    product_s = (time.perf_counter() - t) / 50
    times: dict[str, list[float]] = {c: [] for c in CASES}
    cpu: list[float] = []  # the quiet case's process CPU, every thread
    for it in range(iters):
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        dist.all_reduce(buf)
        times["quiet"].append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        dist.barrier()
        t0 = time.perf_counter()
        work = dist.all_reduce(buf, async_op=True)
        done = None
        while time.perf_counter() < t0 + compute_s:
            product()
            if done is None and work.is_completed():
                done = time.perf_counter() - t0
        work.wait()
        times["overlapped"].append(done if done is not None else time.perf_counter() - t0)
        dist.barrier()
        for _ in range(int(compute_s / 3 / product_s) + (rank * 7 + it * 3) % 20):  # a different amount per rank
            product()
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        times["after skewed compute"].append(time.perf_counter() - t0)
    dist.barrier()
    out.put((rank, product_s, times, cpu))  # type: ignore[attr-defined]
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Prints, per rank and case, the median and 90th percentile in ms, and the "
                                       "overlapped median over the quiet one.")
    p.add_argument("--processes", type=int, default=4, help="processes in the gloo group (default 4, make run's)")
    p.add_argument("--mib", type=float, default=1.5, help="MiB allreduced (default 1.5: a reduced model's bucket)")
    p.add_argument("--iters", type=int, default=40, help="iterations of the three cases (default 40)")
    p.add_argument("--compute-ms", type=float, default=150.0,
                   help="ms each process computes in the overlapped case (default 150: about a backward)")
    p.add_argument("--profile", type=Path, default=None,
                   help="a profile folder (its meta.json): print what the simulator charges for the quiet CPU beside it")
    args = p.parse_args()
    if args.processes < 2 or args.mib <= 0 or args.iters < 1 or args.compute_ms <= 0:
        print("error: --processes must be >= 2 and --mib, --iters, --compute-ms positive", file=sys.stderr)
        return 2
    estimate = None
    if args.profile is not None:
        if not (args.profile / "meta.json").is_file():
            print(f"error: no {args.profile / 'meta.json'}: give a profile folder (`pipedream profile --out-dir`)",
                  file=sys.stderr)
            return 2
        cores = len(os.sched_getaffinity(0))
        estimate = profile_estimate_s(args.profile, args.processes, args.mib * 2**20, cores)
        if estimate is None:
            print(f"error: {args.profile / 'meta.json'} has no allreduce or message cost of a host of {cores} cores: profile on "
                  "this host with `pipedream profile --device cpu`", file=sys.stderr)
            return 2
    print(f"{args.processes} processes on {len(os.sched_getaffinity(0))} cores, {args.mib:g} MiB, "
          f"{args.iters} iterations, {args.compute_ms:g} ms of compute", flush=True)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=_worker, args=(r, args.processes, str(Path(tmp) / "store"), args.mib, args.iters,
                                                    args.compute_ms / 1e3, out), daemon=True)
                 for r in range(args.processes)]
        for q in procs:
            q.start()
        try:
            results = sorted(out.get(timeout=600) for _ in procs)
        finally:
            for q in procs:
                q.join(timeout=30)
                if q.is_alive():
                    q.kill()

    def ms(xs: list[float]) -> str:
        xs = sorted(xs)
        return f"{statistics.median(xs) * 1e3:6.1f} (p90 {xs[int(0.9 * (len(xs) - 1))] * 1e3:5.1f})"

    print(f"{'rank':>4} {'product ms':>10}  " + "  ".join(f"{c:>22}" for c in CASES)
          + "  overlapped/quiet  quiet CPU ms")
    for rank, product_s, times, cpu in results:
        ratio = statistics.median(times["overlapped"]) / statistics.median(times["quiet"])
        print(f"{rank:>4} {product_s * 1e3:10.2f}  " + "  ".join(f"{ms(times[c]):>22}" for c in CASES)
              + f"  {ratio:16.2f}  {statistics.median(cpu) * 1e3:12.2f}")
    if estimate is not None:
        print(f"what the simulator charges from {args.profile} (its measured allreduce, else its message cost): "
              f"{estimate * 1e3:.2f} ms")
    return 0


def profile_estimate_s(profile: Path, processes: int, nbytes: float, cores: int) -> float | None:
    """The CPU a prediction on a host of ``cores`` cores charges each of ``processes`` members for one allreduce
    of ``nbytes`` bytes, from what it reads in ``profile/meta.json`` (:func:`pipedream.sim.profiled.profiled_host`),
    s (:func:`pipedream.sim.transport_cpu.allreduce_cpu_of`: its measured allreduce, else the estimate from its
    message cost); None when it reads neither (another host, or a profile without the host probe).

    Raises:
        PipeDreamError: ``meta.json`` is not a JSON object.
    """
    from pipedream.graph import read_meta
    from pipedream.sim.profiled import profiled_host
    from pipedream.sim.transport_cpu import allreduce_cpu_of

    host = profiled_host(read_meta(profile / "graph.txt"), cores)
    charge = allreduce_cpu_of(host["allreduce_s"], host["message_s"], host["message_s_per_byte"])
    return None if charge is None else charge(processes, nbytes)


if __name__ == "__main__":
    sys.exit(main())
