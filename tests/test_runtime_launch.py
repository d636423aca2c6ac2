"""`pipedream train` end to end through torchrun, a killed rank, and checkpoint/resume."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pytest
import torch

from pipedream.commands import train as train_cmd
from pipedream.errors import PipeDreamError
from pipedream.runtime.assemble import load_into
from pipedream.runtime.checkpoint import complete_positions
from pipedream.runtime.config import TrainConfig
from pipedream.runtime.launch import spawn_local
from pipedream.runtime.worker import FAULT_ENV
from tests.tiny import build, tiny_dropout_model, tiny_model, write_data

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _importable_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    """The workers import the tiny model as ``tests.tiny`` whatever the working directory."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))


def _args(tmp_path: Path, **kw) -> argparse.Namespace:  # type: ignore[no-untyped-def]
    parser = argparse.ArgumentParser()
    train_cmd.add_arguments(parser)
    argv = ["--mode", "pipedream", "--model", "tests.tiny:tiny_model", "--workers", "2", "--epochs", "1",
            "--batch-size", "8", "--train-subset", "0", "--val-subset", "0", "--data-dir", str(tmp_path / "data"),
            "--out-dir", str(tmp_path / "run"), "--experiment", "tiny/test", "--no-progress", "--timeout-s", "120"]
    for k, v in kw.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    return parser.parse_args(argv)


def test_train_command_writes_metrics_run_json_and_mlflow(tmp_path: Path, mlflow_store: Path) -> None:
    write_data(tmp_path / "data")
    assert train_cmd.run(_args(tmp_path)) == 0
    rows = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert [r["epoch"] for r in rows] == [1]
    assert {"epoch_time_s", "train_loss", "val_accuracy", "samples_per_s", "wall_time_s"} <= rows[0].keys()
    assert rows[0]["train_samples"] == 128
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    from pipedream.tracking import experiment_of_run, load_runs

    (logged,) = load_runs("tiny/test")
    assert logged["run_id"] == run["run_id"]
    assert run["experiment_id"] == experiment_of_run(run["run_id"]) is not None
    assert logged["params"]["mode"] == "pipedream" and logged["params"]["config"] == "straight"
    assert logged["params"]["schedule"] == "1f1b" and logged["tags"]["cluster"] == "cpu2"
    from pipedream.tracking import _mlflow

    client = _mlflow().MlflowClient()
    (point,) = client.get_metric_history(run["run_id"], "val_accuracy")
    info = client.get_run(run["run_id"]).info
    assert point.step == 1 and info.status == "FINISHED"
    # logged with real time: the epoch's wall time after the run's start, not 1970
    assert point.timestamp == info.start_time + int(1000 * rows[0]["wall_time_s"])
    assert info.start_time > 1.7e12
    trained = load_into(tmp_path / "run", tiny_model())  # the stages reassemble into the whole model
    assert not torch.equal(trained[0].weight, build(tiny_model)[0].weight)


def _same_weights_and_metrics(run: Path, reference: Path) -> tuple[list[dict], list[dict]]:
    """Assert both 2-rank runs ended with bitwise equal weights; return their metrics rows."""
    for rank in range(2):
        a = torch.load(reference / "debug" / f"rank{rank}.pt", weights_only=False)["params"]
        b = torch.load(run / "debug" / f"rank{rank}.pt", weights_only=False)["params"]
        for n in a:
            assert torch.equal(a[n], b[n]), n
    return json.loads((run / "metrics.json").read_text()), json.loads((reference / "metrics.json").read_text())


@pytest.mark.parametrize("optimizer", ["sgd", "muon"])
def test_resume_from_checkpoint_is_bitwise_identical(tmp_path: Path, optimizer: str) -> None:
    """Also with Muon and Adam as one optimizer (its momentum buffers and Adam's moments and steps restored)."""
    data = write_data(tmp_path / "data")

    def cfg(out: str, epochs: int, resume: bool = False) -> TrainConfig:
        return TrainConfig(model="tiny", model_factory=tiny_dropout_model, data_dir=str(data), epochs=epochs,
                           out_dir=str(tmp_path / out), batch_size=8, lr=0.05, momentum=0.9, max_minibatches=6,
                           optimizer=optimizer, checkpoint=True, resume=resume, progress=False, debug_dump=True,
                           comm_timeout_s=30)

    spawn_local(cfg("straight", 3), 2)
    spawn_local(cfg("resumed", 1), 2)  # "interrupted" after epoch 1
    spawn_local(cfg("resumed", 3, resume=True), 2)
    rows, straight = _same_weights_and_metrics(tmp_path / "resumed", tmp_path / "straight")
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    assert [r["train_loss"] for r in rows] == [r["train_loss"] for r in straight]


def test_killed_mid_epoch_then_resumed_equals_an_uninterrupted_run(tmp_path: Path) -> None:
    """Checkpoints every 3 minibatches; rank 1 dies in minibatch 11 of epoch 1, after the snapshot at 9 (which waited
    for the persist at 6); its part of the newest complete checkpoint is then truncated; the resumed run falls back to
    the one before on every rank and ends bitwise equal."""
    data = write_data(tmp_path / "data")

    def cfg(out: str, resume: bool = False) -> TrainConfig:
        return TrainConfig(model="tiny", model_factory=tiny_dropout_model, data_dir=str(data), epochs=2,
                           out_dir=str(tmp_path / out), batch_size=8, lr=0.05, momentum=0.9, max_minibatches=12,
                           checkpoint=True, checkpoint_every=3, resume=resume, progress=False, debug_dump=True,
                           comm_timeout_s=30)

    spawn_local(cfg("straight"), 2)
    t0 = time.monotonic()
    with pytest.raises(PipeDreamError, match="(rank|process) 1"):
        spawn_local(cfg("resumed"), 2, env={FAULT_ENV: "1:10"})
    assert time.monotonic() - t0 < 60
    complete = complete_positions(tmp_path / "resumed")
    # the newest two are kept; the kill may end rank 0 after the newest's COMPLETE and before it removes the oldest
    assert complete[:2] in ([(0, 6), (0, 3)], [(0, 9), (0, 6)]) and set(complete) <= {(0, 3), (0, 6), (0, 9)}
    newest = tmp_path / "resumed" / "checkpoints" / f"e0-m{complete[0][1]}" / "rank1.pt"
    newest.write_bytes(newest.read_bytes()[:100])  # truncated: resume falls back to the one before on every rank
    spawn_local(cfg("resumed", resume=True), 2)
    rows, straight = _same_weights_and_metrics(tmp_path / "resumed", tmp_path / "straight")
    assert [r["train_loss"] for r in rows] == [r["train_loss"] for r in straight]
    assert [r["train_samples"] for r in rows] == [96, 96]
