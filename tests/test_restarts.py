"""Fault injection: a worker SIGKILLed mid-epoch makes a job with `--max-restarts 1` restart through torchrun's
elastic agent; it resumes from the newest complete checkpoint and ends with the weights of an uninterrupted run of
the same seed, bitwise, in both modes. PipeDream's job runs under `pipedream train`: its MLflow run continues, each
epoch logged once and the restart recorded (the same code logs a DP run; DP's job runs under
:func:`pipedream.train` to keep the suite short)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipedream import api
from pipedream.runtime.assemble import load_into
from pipedream.runtime.config import TrainConfig
from pipedream.runtime.launch import spawn_local
from pipedream.runtime.worker import FAULT_ENV
from tests.conftest import REPO
from tests.tiny import tiny_dropout_model, write_data

pytestmark = pytest.mark.slow

MODEL = "tests.tiny:tiny_dropout_model"  # dropout: the RNG must be restored too
# (mode, --checkpoint-every, fault "rank:minibatch of the run"), in epoch 2 (epoch 1 is logged by then): PipeDream
# checkpoints after minibatches 3 and 6 of 8 and rank 1 dies in minibatch 4; DP (2 workers, 4 steps an epoch) after
# every step and rank 1 dies after step 2; torch's runtime (interleaved 1F1B, 4 stages on 2 ranks) as PipeDream
CASES = [("pipedream", 3, "1:11"), ("dp", 1, "1:5"), ("torch", 3, "1:11")]


def _config(tmp_path: Path, out: str, every: int, mode: str) -> TrainConfig:
    torch_runtime = {"runtime": "torch", "schedule": "interleaved_1f1b", "microbatches": 2} if mode == "torch" else {}
    return TrainConfig(model=MODEL, data_dir=str(tmp_path / "data"), epochs=2, batch_size=8, max_minibatches=8,
                       checkpoint_every=every, out_dir=str(tmp_path / out), progress=False, comm_timeout_s=30,
                       **torch_runtime)  # type: ignore[arg-type]


def _reference(tmp_path: Path, mode: str, every: int) -> Path:
    """The uninterrupted run of the same settings, started in-process."""
    from pipedream.baselines import ddp
    from pipedream.runtime import torch_worker, worker

    fn = {"dp": ddp.train, "torch": torch_worker.train}.get(mode, worker.train)
    spawn_local(_config(tmp_path, "reference", every, mode), 2, fn=fn)
    return tmp_path / "reference"


@pytest.mark.parametrize("mode,every,fault", CASES)
def test_a_killed_worker_restarts_the_job_which_ends_as_an_uninterrupted_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, every: int, fault: str) -> None:
    write_data(tmp_path / "data")
    store = f"sqlite:///{tmp_path}/mlflow.db"
    if mode == "pipedream":
        env = {**os.environ, "PYTHONPATH": str(REPO), "MLFLOW_TRACKING_URI": store, FAULT_ENV: fault}
        argv = [sys.executable, "-m", "pipedream.cli", "train", "--mode", mode, "--model", MODEL, "--workers", "2",
                "--epochs", "2", "--batch-size", "8", "--max-minibatches", "8", "--train-subset", "0",
                "--val-subset", "0", "--data-dir", str(tmp_path / "data"), "--out-dir", str(tmp_path / "run"),
                "--experiment", "tiny/restarts", "--no-progress", "--comm-timeout-s", "30", "--checkpoint-every",
                str(every), "--max-restarts", "1"]
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
    else:
        monkeypatch.setenv("PYTHONPATH", str(REPO))
        monkeypatch.setenv(FAULT_ENV, fault)
        api.train(MODEL, None, None, _config(tmp_path, "run", every, mode), mode="dp" if mode == "dp" else "pipedream",
                  launcher="torchrun", workers=2, max_restarts=1, timeout_s=300)
        monkeypatch.delenv(FAULT_ENV)
    run = tmp_path / "run"
    killed = json.loads((run / "fault.json").read_text())
    (restart,) = json.loads((run / "restarts.json").read_text())
    assert restart["restart"] == 1 and restart["resumed_epoch"] == killed["epoch"] == 1
    # the newest checkpoint complete when the rank died: the one before the last snapshot at least (that snapshot
    # waited for its persist)
    assert killed["minibatch"] - 2 * every <= restart["resumed_minibatch"] < killed["minibatch"]
    assert "first_minibatch_unix_s" in restart

    reference = _reference(tmp_path, mode, every)
    ours, theirs = load_into(run, tiny_dropout_model()), load_into(reference, tiny_dropout_model())
    for (name, a), b in zip(ours.state_dict().items(), theirs.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    rows = json.loads((run / "metrics.json").read_text())
    ref_rows = json.loads((reference / "metrics.json").read_text())
    assert [r["epoch"] for r in rows] == [1, 2]
    assert [r["train_samples"] for r in rows] == [64, 64]  # every sample of each epoch once: 8 minibatches of 8
    assert [r["train_loss"] for r in rows] == [r["train_loss"] for r in ref_rows]
    if mode != "pipedream":
        return
    os.environ["MLFLOW_TRACKING_URI"], old = store, os.environ["MLFLOW_TRACKING_URI"]
    try:
        from pipedream.tracking import _mlflow, load_runs

        (logged,) = load_runs("tiny/restarts")
        status = _mlflow().MlflowClient().get_run(logged["run_id"]).info.status
    finally:
        os.environ["MLFLOW_TRACKING_URI"] = old
    assert status == "FINISHED"
    history = logged["history"]
    assert [step for step, _ in history["val_accuracy"]] == [1, 2]  # no epoch logged twice
    assert history["restarts"] == [(0, 1.0)]
    assert history["restart_resumed_minibatch"] == [(1, float(restart["resumed_minibatch"]))]
