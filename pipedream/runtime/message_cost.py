"""What one point-to-point message costs the CPU of the ranks at its two ends, measured on this host.

A CPU run's workers share the host's cores (:mod:`pipedream.sim.cores`), so the CPU the runtime spends to
send and receive an activation or a gradient is taken from the compute of every rank on the host. This
probe measures it through the runtime's own transport (:class:`pipedream.runtime.comm.P2P`: a header and
the tensor, gloo ``isend``/``irecv``, the wait): two processes on this host bounce a message back and forth
``messages`` times, and each rank's process CPU time (every thread: gloo's copies and socket work included)
over the messages it sent and received is the cost of one message end. Two sizes give the cost as
``fixed_s + per_byte_s * bytes``. The profiler stores it in ``meta.json`` (``host.message_s``,
``host.message_s_per_byte``) and :func:`pipedream.sim.predict.predict_epoch` charges it, at each end of every
transfer, to the forward or backward that sends or receives it.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pipedream.runtime.comm import P2P, Outgoing


def _bounce(rank: int, store_path: str, messages: int, numel: int, timeout_s: float, out: object) -> None:
    """One end of the ping-pong: rank 0 sends message ``i`` and waits for its echo, rank 1 echoes it."""
    torch.set_num_threads(1)
    store = dist.FileStore(store_path, 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=timeout_s))
    try:
        p2p = P2P(timeout_s, torch.device("cpu"))
        peer = 1 - rank
        payload = torch.ones(numel)
        spec = [((numel,), torch.float32)]

        def one(i: int) -> None:
            if rank == 0:
                p2p.exchange([Outgoing([payload], peer, (0, False, i, 0), 0)], [])
                p2p.exchange([], [(peer, spec, (0, True, i, 0))])[0].wait()
            else:
                got = p2p.exchange([], [(peer, spec, (0, False, i, 0))])[0].wait()
                p2p.exchange([Outgoing(got.tensors, peer, (0, True, i, 0), 0)], [])

        for i in range(min(20, messages)):  # warm up the connection and the allocator
            one(i)
        p2p.drain()
        dist.barrier()
        cpu0 = time.process_time()
        for i in range(messages):
            one(i)
        p2p.drain()
        cpu = time.process_time() - cpu0
        out.put((rank, cpu / (2 * messages)))  # type: ignore[attr-defined]  # each rank sent and received each
    finally:
        dist.destroy_process_group()


def message_end_cpu_s(numel: int, messages: int = 300, timeout_s: float = 60.0) -> float:
    """CPU seconds one end of one message of ``numel`` float32 values costs its rank (mean of the two ranks).

    Raises:
        RuntimeError: a probe process failed or did not report within ``timeout_s``.
    """
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_bounce, args=(r, store, messages, numel, timeout_s, out), daemon=True)
                 for r in range(2)]
        for p in procs:
            p.start()
        try:
            costs = [out.get(timeout=timeout_s)[1] for _ in procs]
        except Exception as e:
            raise RuntimeError(f"the message-cost probe did not report within {timeout_s:g} s: {e!r}") from e
        finally:
            for p in procs:
                p.join(timeout=5)
                if p.is_alive():
                    p.kill()
    return sum(costs) / len(costs)


def message_cost(small_bytes: int = 4096, large_bytes: int = 1 << 20, messages: int = 200,
                 rounds: int = 3) -> tuple[float, float]:
    """``(fixed_s, per_byte_s)``: CPU seconds one message end costs its rank, ``fixed_s + per_byte_s * bytes``,
    from the probe at ``small_bytes`` and ``large_bytes`` (float32 payloads), each the median of ``rounds``
    probes taken in turn (a single probe on the 2-core CI machine ranged 155-490 us for a small message); both
    at least 0."""
    small, large = [], []
    for _ in range(rounds):
        small.append(message_end_cpu_s(small_bytes // 4, messages))
        large.append(message_end_cpu_s(large_bytes // 4, messages))
    s, b = statistics.median(small), statistics.median(large)
    per_byte = max(0.0, (b - s) / (large_bytes - small_bytes))
    return max(0.0, s - per_byte * small_bytes), per_byte


if __name__ == "__main__":  # a quick look: python -m pipedream.runtime.message_cost
    fixed, per_byte = message_cost()
    print(f"one message end: {fixed * 1e6:.1f} us + {per_byte * 1e9:.3f} ns/byte ({per_byte * 2**20 * 1e3:.3f} ms/MiB)")
