"""The DDP baseline equals single-process SGD on the union of the workers' minibatches."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from pipedream.baselines.ddp import train
from pipedream.runtime.config import TrainConfig
from pipedream.runtime.launch import spawn_local
from tests.tiny import build, reference_batches, tiny_model, write_data

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("bandwidth", [None, 1e9], ids=["raw", "throttled"])
def test_dp_matches_single_process_sgd(tmp_path: Path, bandwidth: float | None) -> None:
    """Also with the link throttle's DDP comm hook, which must not change the arithmetic."""
    data = write_data(tmp_path / "data")
    cfg = TrainConfig(model="tiny", model_factory=tiny_model, data_dir=str(data), out_dir=str(tmp_path / "out"),
                      batch_size=8, lr=0.1, momentum=0.9, weight_decay=5e-4, max_minibatches=6, progress=False,
                      debug_dump=True, comm_timeout_s=30, emulate_bandwidth_Bps=bandwidth)
    spawn_local(cfg, 2, fn=train)
    batches = reference_batches(data, 8, 0, 0)[:6]
    model = build(tiny_model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    first_loss = None
    for k in range(0, 6, 2):  # worker r takes minibatches r, r + 2, ...; DDP averages the two gradients
        x = torch.cat([batches[k][0], batches[k + 1][0]])
        y = torch.cat([batches[k][1], batches[k + 1][1]])
        if first_loss is None:
            with torch.no_grad():
                first_loss = float(F.cross_entropy(model(batches[0][0]), batches[0][1]))
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    for rank in range(2):
        d = torch.load(tmp_path / "out" / "debug" / f"rank{rank}.pt", weights_only=False)
        for n, p in model.state_dict().items():
            torch.testing.assert_close(d["params"][n], p, rtol=1e-5, atol=1e-6)
    d0 = torch.load(tmp_path / "out" / "debug" / "rank0.pt", weights_only=False)
    assert d0["first_loss"] == pytest.approx(first_loss, rel=1e-6)
