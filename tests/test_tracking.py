"""MLflow: a run is written and read back; rerunning the same target replaces it (no duplicate)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipedream.tracking import _mlflow, artifact_root, experiment_of_run, load_runs, run_url, tracking_uri
from tests.conftest import REPO, log_training_run


def test_run_written_and_read_back(mlflow_store: Path) -> None:
    artifact = mlflow_store / "plan.json"
    artifact.write_text("{}")
    epochs = [{"epoch_time_s": 2.0, "val_accuracy": 0.5}, {"epoch_time_s": 1.5, "val_accuracy": 0.75}]
    rid = log_training_run("vgg16/cpu4", "dp", {"model": "vgg16", "lr": 0.01}, epochs,
                           {"time_to_accuracy_s": 3.5}, {"mode": "dp"}, [artifact])
    runs = load_runs("vgg16/cpu4")
    assert len(runs) == 1
    run = runs[0]
    assert run["run_id"] == rid and run["run_name"] == "dp"
    assert run["params"] == {"model": "vgg16", "lr": "0.01"}
    assert run["tags"]["mode"] == "dp" and "git_commit" in run["tags"]
    assert run["history"]["val_accuracy"] == [(1, 0.5), (2, 0.75)]
    assert run["history"]["time_to_accuracy_s"] == [(0, 3.5)]
    assert list((mlflow_store / "mlartifacts").rglob("plan.json"))  # beside the sqlite store


def test_rerun_does_not_duplicate(mlflow_store: Path) -> None:
    for acc in (0.1, 0.2):
        log_training_run("exp", "pipedream", {"seed": 0}, [{"val_accuracy": acc}])
    log_training_run("exp", "dp", {"seed": 0}, [{"val_accuracy": 0.3}])
    runs = load_runs("exp")
    assert sorted(r["run_name"] for r in runs) == ["dp", "pipedream"]
    pd_run = next(r for r in runs if r["run_name"] == "pipedream")
    assert pd_run["history"]["val_accuracy"] == [(1, 0.2)]


def test_experiment_of_run_and_ui_link(mlflow_store: Path) -> None:
    rid = log_training_run("vgg16/cpu4", "dp", {}, [{"val_accuracy": 0.5}])
    eid = _mlflow().get_experiment_by_name("vgg16/cpu4").experiment_id
    assert experiment_of_run(rid) == eid
    assert experiment_of_run("0" * 32) is None  # a run the store does not hold
    assert run_url(eid, rid) == f"http://127.0.0.1:5000/#/experiments/{eid}/runs/{rid}"


def test_default_store_is_the_checkouts_whatever_the_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking_uri() == f"sqlite:///{REPO / 'results' / 'mlflow.db'}"
    assert artifact_root() == REPO / "results" / "mlartifacts"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/runs.db")
    assert tracking_uri() == f"sqlite:///{tmp_path}/runs.db" and artifact_root() == tmp_path / "mlartifacts"


def test_a_failed_rerun_keeps_the_finished_run(mlflow_store: Path) -> None:
    from pipedream.tracking import LiveRun

    done = log_training_run("exp", "pipedream", {"seed": 0}, [{"val_accuracy": 0.5}])
    for status in ("FAILED", "KILLED"):
        LiveRun("exp", "pipedream", {"seed": 1}).finish(status=status)
    client = _mlflow().MlflowClient()
    statuses = sorted(client.get_run(r["run_id"]).info.status for r in load_runs("exp"))
    assert statuses == ["FINISHED", "KILLED"]  # the older failure retired by the newer one, the success kept
    assert done in {r["run_id"] for r in load_runs("exp")}
    again = log_training_run("exp", "pipedream", {"seed": 2}, [{"val_accuracy": 0.6}])
    assert [r["run_id"] for r in load_runs("exp")] == [again]  # retired only now that a new run FINISHED


def test_mlflow_is_imported_without_telemetry(mlflow_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Machines here reach no server but package registries: MLflow's usage telemetry is off unless a user
    opts in, and an explicit choice is kept."""
    from mlflow.telemetry.utils import is_telemetry_disabled

    monkeypatch.delenv("MLFLOW_DISABLE_TELEMETRY", raising=False)
    _mlflow()
    assert is_telemetry_disabled()
    assert os.environ["MLFLOW_DISABLE_TELEMETRY"] == "true"
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "false")
    _mlflow()
    assert os.environ["MLFLOW_DISABLE_TELEMETRY"] == "false"


def test_tracking_off_trains_without_mlflow(mlflow_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``PIPEDREAM_TRACKING=off``: a run is neither logged nor needs MLflow to import (a machine without it);
    otherwise a missing MLflow is one clear error that names the switch."""
    import sys

    from pipedream.errors import PipeDreamError
    from pipedream.tracking import LiveRun

    monkeypatch.setitem(sys.modules, "mlflow", None)  # `import mlflow` raises ImportError, as where it is missing
    monkeypatch.setenv("PIPEDREAM_TRACKING", "off")
    run = LiveRun("exp", "dp", {"seed": 0})
    run.log_epochs([{"epoch_time_s": 1.0}, {"epoch_time_s": 2.0}])
    run.log_scores("bleu", [{"bleu": 1.0}])
    run.finish({"time_to_accuracy_s": 3.0}, artifacts=[mlflow_store / "missing.json"])
    assert (run.run_id, run.experiment_id, run.logged, run.ended) == ("", "", 2, True)
    monkeypatch.setenv("PIPEDREAM_TRACKING", "on")
    with pytest.raises(PipeDreamError, match="PIPEDREAM_TRACKING=off"):
        LiveRun("exp", "dp", {"seed": 0})
    monkeypatch.delitem(sys.modules, "mlflow")
    assert load_runs("exp") == []  # nothing reached the store


@pytest.mark.parametrize(("value", "enabled"), [("off", False), ("OFF", False), ("0", False), ("no", False),
                                                ("on", True), ("1", True), ("", True), (None, True)])
def test_tracking_switch_values(value: str | None, enabled: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipedream.tracking import tracking_enabled

    if value is None:
        monkeypatch.delenv("PIPEDREAM_TRACKING", raising=False)
    else:
        monkeypatch.setenv("PIPEDREAM_TRACKING", value)
    assert tracking_enabled() is enabled


def test_tracking_switch_typo_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipedream.errors import PipeDreamError
    from pipedream.tracking import tracking_enabled

    monkeypatch.setenv("PIPEDREAM_TRACKING", "of")
    with pytest.raises(PipeDreamError, match="not on or off"):
        tracking_enabled()


def test_an_untracked_run_is_left_out_of_the_reports_links(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run trained with ``PIPEDREAM_TRACKING=off`` (``run_id`` empty in run.json): the report links no MLflow run
    for it and attaches nothing, without importing MLflow; a tracked run beside it keeps its link."""
    import json
    import sys

    from pipedream.table1.measured import mlflow_runs
    from pipedream.tracking import attach_artifacts

    for mode, rid, eid in (("pipedream", "", ""), ("dp", "abc", "7")):
        (tmp_path / mode).mkdir()
        (tmp_path / mode / "run.json").write_text(json.dumps({"run_id": rid, "experiment_id": eid}))
    monkeypatch.setitem(sys.modules, "mlflow", None)  # any import of MLflow would raise
    assert mlflow_runs(tmp_path) == [("dp", "abc", run_url("7", "abc"))]
    attach_artifacts("", [tmp_path / "pipedream" / "run.json"])
