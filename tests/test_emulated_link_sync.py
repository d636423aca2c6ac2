"""The emulated link completes an allreduce from the *last* replica's launch, read from the replicas' shared
launch board (:mod:`pipedream.runtime.launch_board`), on two gloo processes: the PipeDream runtime's reducer
and the DDP baseline's comm hook alike, over several rounds (the board keeps two)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

LATE_S = 0.4  # the late rank launches this much after the other
LINK_S = 0.2  # the emulated ring time of the bucket: 2 (n - 1) / n * bytes / bandwidth with n = 2
NUMEL = 1000  # one float32 bucket of 4000 bytes
BANDWIDTH = 4 * NUMEL / LINK_S
ROUNDS = 3  # the late rank alternates, so each round reads what the other round's posts left


def _worker(rank: int, init: str, which: str, out: str) -> None:
    from pipedream.baselines.ddp import _throttled_allreduce
    from pipedream.runtime.buckets import BucketReducer, GradBuckets
    from pipedream.runtime.launch_board import LaunchBoard

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        times = []
        if which == "reducer":
            layer = nn.Linear(NUMEL - 1, 1)  # 999 weights and 1 bias: one bucket of 1000 floats
            reducer = BucketReducer(GradBuckets(["weight", "bias"], [layer.weight, layer.bias], 25 * 2**20),
                                    dist.group.WORLD, timeout_s=30, bandwidth_Bps=BANDWIDTH)
            assert reducer.board is not None and reducer.board.shared
        else:
            class Bucket:
                def buffer(self) -> torch.Tensor:
                    return buf

                def index(self) -> int:
                    return 0

            buf = torch.ones(NUMEL)
            hook = _throttled_allreduce(BANDWIDTH, LaunchBoard(None, 1))
        dist.barrier()  # the first replica removes the board's file after building's own barrier, before this one
        leftovers = list(Path(out).glob("pipedream-launches-*"))
        for r in range(ROUNDS):
            dist.barrier()
            if rank == r % 2:
                time.sleep(LATE_S)
            launched = time.perf_counter()
            if which == "reducer":
                reducer.wait("test")
            else:
                buf.fill_(1.0 + r)
                hook(None, Bucket()).wait()
                assert torch.equal(buf, torch.full((NUMEL,), 1.0 + r))  # the mean of two equal tensors
            times.append(f"{launched} {time.perf_counter()}")
        Path(out, f"{rank}").write_text("\n".join(times) + f"\n{len(leftovers)}")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("which", ["reducer", "ddp_hook"])
def test_no_replica_completes_before_the_last_launch_has_crossed_the_link(tmp_path: Path, which: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """In each round one rank launches 0.4 s after the other and the link takes 0.2 s: both complete no earlier
    than the late launch plus 0.2 s (timed from its own launch, the early rank would have been released as soon
    as the real loopback allreduce returned, right after the late launch), and not much later. The board's file
    is gone once the replicas have mapped it."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_worker, args=(f"file://{tmp_path / 'store'}", which, str(tmp_path)), nprocs=2, join=True)
    rows = {}
    for rank in (0, 1):
        *lines, leftovers = (tmp_path / f"{rank}").read_text().splitlines()
        assert leftovers == "0"
        rows[rank] = [tuple(map(float, line.split())) for line in lines]
    for r in range(ROUNDS):
        late, early = r % 2, 1 - r % 2
        late_launch = rows[late][r][0]
        assert late_launch - rows[early][r][0] > LATE_S - 0.1
        for rank in (0, 1):
            assert late_launch + LINK_S - 0.02 <= rows[rank][r][1] < late_launch + LINK_S + 0.5
