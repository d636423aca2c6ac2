"""The emulated link completes an allreduce from the *last* replica's launch (pipedream/runtime/buckets.py), on
two gloo processes: the PipeDream runtime's reducer and the DDP baseline's comm hook alike."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

LATE_S = 0.6  # rank 1 launches this much after rank 0
LINK_S = 0.3  # the emulated ring time of the bucket: 2 (n - 1) / n * bytes / bandwidth with n = 2
NUMEL = 1000  # one float32 bucket of 4000 bytes
BANDWIDTH = 4 * NUMEL / LINK_S


def _worker(rank: int, init: str, which: str, out: str) -> None:
    from pipedream.baselines.ddp import _throttled_allreduce
    from pipedream.runtime.buckets import BucketReducer, GradBuckets

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        if rank == 1:
            time.sleep(LATE_S)
        if which == "reducer":
            layer = nn.Linear(NUMEL - 1, 1)  # 999 weights and 1 bias: one bucket of 1000 floats
            reducer = BucketReducer(GradBuckets(["weight", "bias"], [layer.weight, layer.bias], 25 * 2**20),
                                    dist.group.WORLD, timeout_s=30, bandwidth_Bps=BANDWIDTH)
            launched = time.time()
            reducer.wait("test")
        else:
            class Bucket:
                def buffer(self) -> torch.Tensor:
                    return buf

            buf = torch.ones(NUMEL)
            hook = _throttled_allreduce(BANDWIDTH, 2)
            launched = time.time()
            hook(None, Bucket()).wait()
            assert torch.equal(buf, torch.ones(NUMEL))  # the mean of two ones
        Path(out, f"{rank}").write_text(f"{launched} {time.time()}")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("which", ["reducer", "ddp_hook"])
def test_no_replica_completes_before_the_last_launch_has_crossed_the_link(tmp_path: Path, which: str) -> None:
    """Rank 1 launches 0.6 s after rank 0 and the link takes 0.3 s: both complete no earlier than rank 1's launch
    plus 0.3 s (timed from its own launch, rank 0 would have been released as soon as the real loopback
    allreduce returned, right after rank 1's launch)."""
    init = f"file://{tmp_path / 'store'}"
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_worker, args=(init, which, str(tmp_path)), nprocs=2, join=True)
    (l0, e0), (l1, e1) = (map(float, (tmp_path / f"{r}").read_text().split()) for r in (0, 1))
    assert l1 - l0 > LATE_S - 0.1
    for end in (e0, e1):
        assert l1 + LINK_S - 0.02 <= end < l1 + LINK_S + 1.0
