"""A user's own model and data (``--model package.module:function``) through profile, plan and train."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
'''


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), str(REPO)]), "OMP_NUM_THREADS": "1",
           "MLFLOW_TRACKING_URI": f"sqlite:///{cwd}/mlflow.db", "PIPEDREAM_FORCE_GLOO": "1"}
    return subprocess.run([sys.executable, "-m", "pipedream.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture
def user_dir(tmp_path: Path) -> Path:
    """A working directory holding the user's module ``blobs_model.py``."""
    (tmp_path / "blobs_model.py").write_text(USER_MODULE)
    return tmp_path


def test_user_model_profile_plan_train_pipedream_and_dp(user_dir: Path) -> None:
    model = "blobs_model:make"
    proc = _cli("profile", "--model", model, "--profiled-batch", "16", "--iters", "1", "--warmup", "0",
                "--out-dir", "profiles/blobs", cwd=user_dir)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((user_dir / "profiles/blobs/meta.json").read_text())["minibatch_size"] == 16
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
                                   "nn.Sequential or a pipedream.models.ModelSpec")
