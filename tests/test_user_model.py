"""A user's own model and data (``--model package.module:function``) through profile, plan and train."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import REPO

# what a user writes: a function returning a ModelSpec with the model and its data
USER_MODULE = '''
import torch
from torch import nn

from pipedream.data.base import SampleSet
from pipedream.models import ModelSpec


def blobs(preset, train_subset, val_subset, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(160, 8, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long()
    return SampleSet.from_tensors(x[:128], y[:128]), SampleSet.from_tensors(x[128:], y[128:])


def make():
    return ModelSpec(
        name="blobnet", task="classification", dataset="two blobs",
        build=lambda preset: nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 2)),
        input_shape=lambda preset: (8,),
        make_datasets=blobs,
    )


def not_a_model():
    return 42


def too_narrow():
    """A bare Sequential over Fashion-MNIST's (3, 32, 32) images whose first Linear expects 8 features."""
    return nn.Sequential(nn.Flatten(), nn.Linear(8, 10))


class Clock(nn.Module):
    """Passes its input through and counts its training forwards in a buffer (saved with the weights)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("forwards", torch.zeros(()))

    def forward(self, x):
        if self.training:
            self.forwards.add_(1)
        return x


def forwards(model, val, batch_size):
    """A 'BLEU' that reads how many training minibatches the model has seen: epoch k's model says 8 k."""
    return float(next(m for m in model.modules() if isinstance(m, Clock)).forwards)


def clock():
    return ModelSpec(
        name="clock", task="classification", dataset="two blobs", metric="bleu",
        build=lambda preset: nn.Sequential(nn.Linear(8, 16), Clock(), nn.Tanh(), nn.Linear(16, 2)),
        input_shape=lambda preset: (8,),
        make_datasets=blobs, evaluate=forwards,
    )
'''


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), str(REPO)]), "OMP_NUM_THREADS": "1",
           "MLFLOW_TRACKING_URI": f"sqlite:///{cwd}/mlflow.db", "PIPEDREAM_FORCE_GLOO": "1"}
    return subprocess.run([sys.executable, "-m", "pipedream.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture
def user_dir(tmp_path: Path, new_store: Callable[[Path], str]) -> Path:
    """A working directory holding the user's module ``blobs_model.py`` and an empty MLflow store."""
    (tmp_path / "blobs_model.py").write_text(USER_MODULE)
    new_store(tmp_path)
    return tmp_path


def test_user_model_profile_plan_train_pipedream_and_dp(user_dir: Path) -> None:
    model = "blobs_model:make"
    before = time.time()
    proc = _cli("profile", "--model", model, "--profiled-batch", "16", "--iters", "1", "--warmup", "0",
                "--out-dir", "profiles/blobs", cwd=user_dir)
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((user_dir / "profiles/blobs/meta.json").read_text())
    assert meta["minibatch_size"] == 16 and before < meta["profiled_at_unix_s"] < time.time()  # when it ended
    proc = _cli("plan", "--profile", "profiles/blobs/graph.txt", "--cluster", "2:1e9", "--straight", "--out", "plan.json",
                cwd=user_dir)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads((user_dir / "plan.json").read_text())
    assert plan["workers"] == 2 and len(plan["stages"]) == 2
    common = ("--model", model, "--workers", "2", "--epochs", "2", "--batch-size", "16", "--no-progress",
              "--timeout-s", "240")
    proc = _cli("train", "--mode", "pipedream", "--plan", "plan.json", *common, cwd=user_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = user_dir / "results/runs/blobs_model.make/pipedream"  # the default --out-dir
    rows = json.loads((out / "metrics.json").read_text())
    assert [r["epoch"] for r in rows] == [1, 2] and rows[0]["train_samples"] == 128
    assert json.loads((out / "run.json").read_text())["config"] == plan["config"]
    proc = _cli("train", "--mode", "dp", *common, cwd=user_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    dp_rows = json.loads((user_dir / "results/runs/blobs_model.make/dp/metrics.json").read_text())
    assert len(dp_rows) == 2 and all(0.0 <= r["val_accuracy"] <= 1.0 for r in dp_rows)


def test_user_function_that_returns_no_model_is_one_line(user_dir: Path) -> None:
    proc = _cli("profile", "--model", "blobs_model:not_a_model", "--out-dir", "p", cwd=user_dir)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == ("error: model function 'blobs_model:not_a_model' returned a int; return an "
                                   "nn.Module or a pipedream.models.ModelSpec")


@pytest.mark.parametrize("mode", ["pipedream", "dp"])
def test_bleu_threshold_scores_every_epoch_and_times_the_first_crossing(user_dir: Path, mode: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A threshold on the model's own metric: every epoch's model is scored after training, logged at its
    epoch's step and wall time, and time-to-accuracy is the first epoch that crosses it (here epoch 2 of 3:
    the metric counts training minibatches, 8 an epoch in both modes, --dp-batch global); a threshold above
    the last score gives 'not reached' (checked in one mode)."""
    from pipedream.tracking import _mlflow

    out = user_dir / mode
    common = ("--model", "blobs_model:clock", "--mode", mode, "--workers", "2", "--epochs", "3", "--batch-size", "16",
              "--optimizer", "adam", "--lr", "0.01", "--dp-batch", "global", "--threshold-metric", "bleu",
              "--no-progress", "--timeout-s", "240", "--experiment", f"clock-{mode}")
    proc = _cli("train", *common, "--threshold", "12", "--out-dir", str(out), "--keep-epoch-models", cwd=user_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((out / "metrics.json").read_text())
    assert [r["bleu"] for r in rows] == [8.0, 16.0, 24.0]  # epoch k's own model, not the final one k times
    run = json.loads((out / "run.json").read_text())
    assert run["time_to_accuracy_s"] == rows[1]["wall_time_s"] < rows[2]["wall_time_s"]
    assert run["epochs_to_accuracy"] == 2 and run["final_bleu"] == 24.0
    assert sorted(p.name for p in (out / "epochs").iterdir()) == ["1", "2", "3"]  # kept when asked
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{user_dir}/mlflow.db")  # the store _cli's runs log to
    client = _mlflow().MlflowClient()
    start_ms = client.get_run(run["run_id"]).info.start_time
    history = sorted((m.step, m.value, m.timestamp) for m in client.get_metric_history(run["run_id"], "bleu"))
    assert history == [(k, 8.0 * k, start_ms + int(1000 * rows[k - 1]["wall_time_s"])) for k in (1, 2, 3)]

    if mode == "pipedream":  # a threshold never crossed is the launcher's, the same in both modes: checked once
        return
    proc = _cli("train", *common, "--threshold", "30", "--out-dir", str(out), cwd=user_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads((out / "run.json").read_text())
    assert run["time_to_accuracy"] == "not reached"
    assert "time_to_accuracy_s" not in run and "epochs_to_accuracy" not in run
    assert [r["bleu"] for r in json.loads((out / "metrics.json").read_text())] == [8.0, 16.0, 24.0]
    assert not (out / "epochs").exists()  # scored, then deleted


def test_bleu_threshold_needs_the_models_metric(user_dir: Path) -> None:
    proc = _cli("train", "--mode", "dp", "--model", "blobs_model:make", "--workers", "2", "--threshold", "1",
                "--threshold-metric", "bleu", cwd=user_dir)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "is scored with 'top1', not 'bleu'" in proc.stderr


@pytest.mark.slow
def test_check_model_runs_one_sample_and_lists_the_layers(user_dir: Path) -> None:
    proc = _cli("check", "--model", "tests.hf_gpt2:make", cwd=user_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "layers captured by torch.export; 28 parameters" in out and "one sample's forward and backward in" in out
    assert "     4,096             1,024  Embedding transformer.wte" in out  # 64 x 16 fp32; 16 positions x 16
    assert "shared: lm_head.weight is read by layers node2, node36" in out
    proc = _cli("check", "--model", "blobs_model:too_narrow", cwd=user_dir)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: layer node2 (Linear(in_features=8, out_features=10, bias=True)) failed on (1, 3072) float32: "
        "mat1 and mat2 shapes cannot be multiplied (1x3072 and 8x10)")
