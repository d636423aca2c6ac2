"""What one gloo allreduce costs the CPU of each member, measured on this host.

A CPU run's replicas reduce their gradients with gloo (:mod:`pipedream.runtime.buckets`, and DDP's buckets in the
data-parallel baseline); gloo's threads do the copies, the socket work and the reduction, and that CPU is taken from
the cores every rank computes on (:mod:`pipedream.sim.transport_cpu`). This probe measures it directly:
``members`` processes on this host (one thread each, as the workers run) join a gloo group and allreduce a float32
tensor ``calls`` times in a row, and each member's process CPU time (every thread) over the calls is the cost of
one allreduce to it. Two sizes give it as ``fixed_s + per_byte_s * bytes`` (``bytes``: the tensor's, not a ring
chunk's) for that member count. The profiler stores one line per member count (``meta.json``
``host.allreduce_s``: ``{"2": [fixed_s, per_byte_s], ...}``).

Why measured, not derived from a point-to-point message's cost (:mod:`pipedream.runtime.message_cost`, four
message ends of ``1/n`` of the tensor per ring step and member): on the 2-core CI VM (AMD EPYC, 2026-11-30) a
1 MiB allreduce over 4 processes cost each 1.3-2.4 ms of CPU and 4 MiB 3.8 ms, where the message cost gave
6.2-8.3 and 9.1-9.4 ms (``benchmarks/allreduce``); over 2 processes 1.8 / 3.5 / 11.1 ms for 1 / 4 / 16 MiB.
Gloo moves an allreduce's pieces itself, without what the message probe also pays for each of the runtime's
transfers (a header and a tensor, each issued from Python and waited on by the main thread).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Iterable
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _member(rank: int, world: int, store_path: str, numels: tuple[int, ...], calls: tuple[int, ...], rounds: int,
            timeout_s: float, out: object) -> None:
    """One member: after a warm-up, ``rounds`` rounds of ``calls[k]`` allreduces of ``numels[k]`` values for each
    size ``k``; puts ``(rank, [[CPU s per allreduce of size k, round by round] for each k])``."""
    torch.set_num_threads(1)
    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))
    try:
        bufs = [torch.ones(n) for n in numels]
        for buf in bufs:  # warm up the connections and the allocator
            for _ in range(3):
                dist.all_reduce(buf)
        cpu: list[list[float]] = [[] for _ in numels]
        for _ in range(rounds):
            for k, buf in enumerate(bufs):
                dist.barrier()
                c0 = time.process_time()
                for _ in range(calls[k]):
                    dist.all_reduce(buf)
                cpu[k].append((time.process_time() - c0) / calls[k])
        dist.barrier()
        out.put((rank, cpu))  # type: ignore[attr-defined]
    finally:
        dist.destroy_process_group()


def measure_allreduce_cpu_s(members: int, sizes_bytes: tuple[int, ...], calls: tuple[int, ...], rounds: int = 3,
                    timeout_s: float = 120.0) -> list[float]:
    """CPU seconds one allreduce of each of ``sizes_bytes`` (float32 tensors) costs a member of a gloo group of
    ``members`` processes on this host: per size, the median over ``rounds`` of the members' mean.

    Raises:
        ValueError: fewer than 2 members, or ``calls`` not one positive count per size.
        RuntimeError: a member failed or did not report within ``timeout_s``.
    """
    if members < 2 or len(calls) != len(sizes_bytes) or min(calls, default=0) < 1 or rounds < 1:
        raise ValueError(f"need 2 members or more and one positive call count per size, got {members} members, "
                         f"sizes {list(sizes_bytes)}, calls {list(calls)}, {rounds} rounds")
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    numels = tuple(max(1, b // 4) for b in sizes_bytes)
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_member, args=(r, members, store, numels, calls, rounds, timeout_s, out),
                             daemon=True) for r in range(members)]
        for p in procs:
            p.start()
        try:
            got = [out.get(timeout=timeout_s)[1] for _ in procs]
        except Exception as e:
            raise RuntimeError(f"the allreduce-cost probe over {members} processes did not report within "
                               f"{timeout_s:g} s: {e!r}") from e
        finally:
            for p in procs:
                p.join(timeout=5)
                if p.is_alive():
                    p.kill()
    return [statistics.median(statistics.fmean(m[k][r] for m in got) for r in range(rounds))
            for k in range(len(sizes_bytes))]


def allreduce_cost(members: int, small_bytes: int = 1 << 20, large_bytes: int = 16 << 20,
                   rounds: int = 3) -> tuple[float, float]:
    """``(fixed_s, per_byte_s)``: CPU seconds one gloo allreduce of ``bytes`` costs each of ``members`` processes
    on this host, ``fixed_s + per_byte_s * bytes``, through the probe at ``small_bytes`` and ``large_bytes``
    (:func:`measure_allreduce_cpu_s`, 24 and 6 calls a round); both at least 0.

    Raises:
        ValueError, RuntimeError: as :func:`measure_allreduce_cpu_s`.
    """
    small, large = measure_allreduce_cpu_s(members, (small_bytes, large_bytes), (24, 6), rounds)
    per_byte = max(0.0, (large - small) / (large_bytes - small_bytes))
    return max(0.0, small - per_byte * small_bytes), per_byte


def allreduce_costs(member_counts: Iterable[int], rounds: int = 3) -> dict[int, tuple[float, float]]:
    """:func:`allreduce_cost` for each member count (2 or more) of ``member_counts``."""
    return {n: allreduce_cost(n, rounds=rounds) for n in member_counts}


if __name__ == "__main__":  # a quick look: python -m pipedream.runtime.allreduce_cost
    for n, (fixed, per_byte) in allreduce_costs((2, 3, 4)).items():
        print(f"{n} members: {fixed * 1e3:.3f} ms + {per_byte * 2**20 * 1e3:.3f} ms/MiB a member")
