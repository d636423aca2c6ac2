"""The DDP baseline equals single-process SGD on the same samples, under both minibatch semantics:
``per_worker`` (a step takes every worker's minibatch; lr scaled by the workers, Goyal et al. 2017) and
``global`` (each minibatch split over the workers; the pipeline's lr)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from pipedream.baselines.ddp import train
from pipedream.runtime.config import TrainConfig
from pipedream.runtime.launch import spawn_local
from pipedream.runtime.lr import lr_at
from tests.tiny import build, reference_batches, tiny_model, write_data

pytestmark = pytest.mark.slow


def _run(tmp_path: Path, **kw) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    data = write_data(tmp_path / "data")
    settings = {"lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4, "max_minibatches": 6, **kw}
    cfg = TrainConfig(model="tiny", model_factory=tiny_model, data_dir=str(data), out_dir=str(tmp_path / "out"),
                      batch_size=8, progress=False, debug_dump=True, comm_timeout_s=30, **settings)
    spawn_local(cfg, 2, fn=train)
    d0, d1 = (torch.load(tmp_path / "out" / "debug" / f"rank{r}.pt", weights_only=False) for r in range(2))
    for n, p in d0["params"].items():
        torch.testing.assert_close(d1["params"][n], p)  # replicas stay identical
    return d0


def _sgd(steps: list[tuple[torch.Tensor, torch.Tensor]], lrs: list[float], clip: float = 0.0) -> torch.nn.Module:
    model = build(tiny_model)
    opt = torch.optim.SGD(model.parameters(), lr=lrs[0], momentum=0.9, weight_decay=5e-4)
    for (x, y), lr in zip(steps, lrs, strict=True):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
    return model


@pytest.mark.parametrize("bandwidth", [None, 1e9], ids=["raw", "throttled"])
def test_per_worker_dp_is_sgd_on_both_minibatches_at_the_scaled_lr(tmp_path: Path, bandwidth: float | None) -> None:
    """Also with the link throttle's DDP comm hook, which must not change the arithmetic."""
    d0 = _run(tmp_path, emulate_bandwidth_Bps=bandwidth)
    batches = reference_batches(tmp_path / "data", 8, 0, 0)[:6]
    # worker r takes minibatches r, r + 2, ...; DDP averages the two gradients; lr x 2 workers, no warm-up
    steps = [(torch.cat([batches[k][0], batches[k + 1][0]]), torch.cat([batches[k][1], batches[k + 1][1]]))
             for k in range(0, 6, 2)]
    model = _sgd(steps, [0.2] * 3)
    for n, p in model.state_dict().items():
        torch.testing.assert_close(d0["params"][n], p, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        first_loss = float(F.cross_entropy(build(tiny_model)(batches[0][0]), batches[0][1]))
    assert d0["first_loss"] == pytest.approx(first_loss, rel=1e-6)


def test_global_dp_with_warmup_polynomial_lr_and_clipping_is_single_process_sgd(tmp_path: Path) -> None:
    kw = {"dp_batch": "global", "lr_policy": "polynomial", "lr_power": 2.0, "lr_warmup_epochs": 0.5,
          "clip_norm": 0.5}
    d0 = _run(tmp_path, **kw)
    batches = reference_batches(tmp_path / "data", 8, 0, 0)[:6]
    cfg = TrainConfig(lr=0.1, epochs=1, **kw)
    lrs = [lr_at(cfg, i / 6) for i in range(6)]  # global: no scaling, so the warm-up is flat at lr
    assert lrs[0] == pytest.approx(0.1) and lrs[3] == pytest.approx(0.1 * 0.5 ** 2)
    model = _sgd(batches, lrs, clip=0.5)  # each minibatch of 8 split 4 + 4 over the workers
    for n, p in model.state_dict().items():
        torch.testing.assert_close(d0["params"][n], p, rtol=1e-5, atol=1e-6)


def test_linear_scaling_warms_up_from_the_base_lr() -> None:
    cfg = TrainConfig(lr=0.1, epochs=4, lr_warmup_epochs=2.0)
    assert [lr_at(cfg, p, scale=4) for p in (0.0, 1.0, 2.0, 3.0)] == pytest.approx([0.1, 0.25, 0.4, 0.4])
    step = TrainConfig(lr=0.1, epochs=90, lr_policy="step", lr_step_epochs=30)
    assert [lr_at(step, p) for p in (0, 29.9, 30, 61)] == pytest.approx([0.1, 0.1, 0.01, 0.001])


def test_a_dp_worker_counts_one_copy_of_weights_gradients_and_momentum(tmp_path: Path) -> None:
    """The tiny model has 4 * (3*3*3*4 + 4 + 256*16 + 16 + 16*16 + 16 + 16*10 + 10) = 18664 bytes of weights; its
    gradients are views into DDP's buckets (one copy), SGD's momentum another; a worker's minibatch is 8 images
    of 3x32x32 fp32 and 8 int64 labels. 16 minibatches are 8 steps a worker; the meter counts twice a step (after
    the forward, after the optimizer step) over the first 4 only (``memory_minibatches(1)``), where every step
    holds what the others do."""
    d0 = _run(tmp_path, measure_memory=True, max_minibatches=16)
    assert d0["memory"]["counts"] == 2 * 4
    row = json.loads((tmp_path / "out" / "metrics.json").read_text())[-1]
    w = 4 * (3 * 3 * 3 * 4 + 4 + 256 * 16 + 16 + 16 * 16 + 16 + 16 * 10 + 10)
    got = {c: row[f"peak_{c}_bytes_stage0"] for c in ("weights", "versions", "gradients", "optimizer", "buffers")}
    assert got == {"weights": w, "versions": 0, "gradients": w, "optimizer": w, "buffers": 8 * 3 * 32 * 32 * 4 + 8 * 8}
    assert row["peak_activations_bytes_stage0"] > 0
    assert row["peak_memory_bytes_stage0"] == sum(got.values()) + row["peak_activations_bytes_stage0"]


def test_a_dp_worker_logs_its_compute_apart_from_the_wait_for_the_emulated_link(tmp_path: Path) -> None:
    """The tiny model's 18664 bytes of gradients in one bucket, ring-reduced over 2 workers at 186640 B/s, take
    2 (2 - 1) / 2 * 18664 / 186640 = 0.1 s on the emulated link: an epoch of 3 steps waits 0.3 s for it inside
    ``loss.backward()``, which the compute (a few ms of a tiny model) must not count."""
    _run(tmp_path, emulate_bandwidth_Bps=186640.0)
    for row in json.loads((tmp_path / "out" / "metrics.json").read_text()):
        assert 0.3 - 0.02 <= row["wait_s_stage0"] < 0.3 + 0.15
        assert 0.0 < row["compute_s_stage0"] < 0.1


def test_dp_trains_with_muon_as_one_process_does(tmp_path: Path) -> None:
    """``--optimizer muon`` on DDP (global minibatches of 8, 4 + 4 a worker): the replicas stay equal and end where
    one process with the optimizer the runtime builds ends (Muon on the two hidden Linear weights, Adam on the
    convolution, the biases and the output layer), within 3% of the distance each tensor moved (Muon's
    Newton-Schulz runs in bfloat16, so DDP's averaged gradients, equal to the last bits, may round apart)."""
    from pipedream.runtime.optim import hidden_matrices, make_optimizer

    d0 = _run(tmp_path, optimizer="muon", lr=1e-2, weight_decay=0.0, dp_batch="global")
    batches = reference_batches(tmp_path / "data", 8, 0, 0)[:6]
    model, initial = build(tiny_model), build(tiny_model).state_dict()
    hidden = hidden_matrices(model, batches[0][0])
    assert [p.shape for p in hidden] == [(16, 256), (16, 16)]
    opt = make_optimizer(TrainConfig(optimizer="muon", lr=1e-2, weight_decay=0.0), model.parameters(), hidden)
    for x, y in batches:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    for n, p in model.state_dict().items():
        assert float((d0["params"][n] - p).norm()) <= 0.03 * float((p - initial[n]).norm()), n
