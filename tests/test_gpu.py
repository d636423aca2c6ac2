"""The CUDA paths: profiling on a GPU, the PipeDream runtime and DDP on NCCL (skipped without CUDA).

CI has no GPU; run these on a GPU machine with ``.venv/bin/python -m pytest tests/test_gpu.py``. One GPU
checks profiling, a one-stage pipeline and DDP on NCCL against the CPU reference, with CUDA already
initialised in the test process (the workers start from a fork server, never a fork of it); the
two-stage NCCL pipelines need two GPUs (NCCL takes one GPU per worker).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipedream.profiler import ProfileSettings, profile_module
from pipedream.runtime.stage import straight_plan
from tests.test_runtime_order import assert_sends_match_receives, run_in_order
from tests.test_runtime_pipeline import _stash_reference, reference, run
from tests.tiny import reference_batches, stash_model, tiny_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
NCCL = {"PIPEDREAM_FORCE_GLOO": "0"}


def _sgd(tmp_path: Path, steps: int) -> dict[str, torch.Tensor]:
    model, _ = reference(reference_batches(tmp_path / "data", 8, 0, 0), steps)
    return {n: p.detach() for n, p in model.named_parameters()}


def test_profile_on_cuda_times_every_layer() -> None:
    graph = profile_module(tiny_model(), torch.randn(16, 3, 32, 32), ProfileSettings(device="cuda"), granularity="layer")
    layers = [n for n in graph.nodes.values() if not n.desc.startswith("Input")]
    assert len(layers) == 8
    assert all(n.fwd_s > 0 for n in layers)
    assert sum(n.bwd_s for n in layers) > 0


def test_one_stage_pipeline_on_nccl_equals_cpu_sgd(tmp_path: Path) -> None:
    torch.zeros(1, device="cuda")  # CUDA is initialised in this process: a forked worker could not use it
    dumps = run(tmp_path, 1, env=NCCL, schedule="gpipe", microbatches=2, max_minibatches=3)
    ref = _sgd(tmp_path, 3)
    for n, p in dumps[0]["params"].items():  # TF32 convolutions on the GPU: close, not bitwise
        torch.testing.assert_close(p, ref[n], rtol=1e-3, atol=1e-3)


def test_ddp_on_nccl_equals_cpu_sgd(tmp_path: Path) -> None:
    from pipedream.baselines.ddp import train

    dumps = run(tmp_path, 1, fn=train, env=NCCL, max_minibatches=3)
    ref = _sgd(tmp_path, 3)
    for n, p in dumps[0]["params"].items():
        torch.testing.assert_close(p, ref[n], rtol=1e-3, atol=1e-3)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs one GPU per stage")
def test_two_stage_gpipe_on_nccl_equals_cpu_sgd(tmp_path: Path) -> None:
    dumps = run(tmp_path, 2, plan=straight_plan("t", 8, [4, 4]), env=NCCL, schedule="gpipe", microbatches=2,
                max_minibatches=3)
    ref = _sgd(tmp_path, 3)
    for d in dumps:
        for n, p in d["params"].items():
            torch.testing.assert_close(p, ref[n], rtol=1e-3, atol=1e-3)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs one GPU per stage")
def test_two_stage_1f1b_on_nccl_stashes_weights_and_batches_its_transfers(tmp_path: Path) -> None:
    """1F1B with weight stashing on NCCL (sends and receives of a step in one batch_isend_irecv) ends
    where the hand-computed updates do, and what the ranks issued passes the in-order replay."""
    dumps = run(tmp_path, 2, factory=stash_model, plan=straight_plan("t", 6, [5, 1]), env=NCCL, max_minibatches=6,
                lr=0.1)
    history = _stash_reference(reference_batches(tmp_path / "data", 8, 0, 0)[:6], 0.1)
    for d in dumps:
        assert d["batched"]
        for n, p in d["params"].items():
            torch.testing.assert_close(p, history[-1][n], rtol=1e-3, atol=1e-3)
    logs = {r: d["comm_log"] for r, d in enumerate(dumps)}
    assert_sends_match_receives(logs)
    run_in_order(logs)
