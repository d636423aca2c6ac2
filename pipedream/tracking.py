"""MLflow tracking: every training run is logged with its parameters, per-epoch metrics and plan.

The store is ``$MLFLOW_TRACKING_URI`` when it is set, else one sqlite file in the checkout,
``<repo>/results/mlflow.db`` (what ``make ui`` shows), whatever the working directory; artifacts go
to ``mlartifacts`` beside a sqlite store (:func:`artifact_root`).
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pipedream.paths import REPO, RESULTS

DEFAULT_TRACKING_URI = f"sqlite:///{RESULTS / 'mlflow.db'}"
DEFAULT_ARTIFACT_ROOT = RESULTS / "mlartifacts"
STORE_HELP = "$MLFLOW_TRACKING_URI if set, else sqlite:///<repo>/results/mlflow.db"


def tracking_uri() -> str:
    """The tracking URI in force: ``$MLFLOW_TRACKING_URI`` or the checkout's sqlite file."""
    return os.environ.get("MLFLOW_TRACKING_URI", DEFAULT_TRACKING_URI)


def artifact_root() -> Path:
    """Where run artifacts go: ``mlartifacts`` beside a sqlite store, else ``<repo>/results/mlartifacts``."""
    uri = tracking_uri()
    if uri.startswith("sqlite:///"):
        return Path(uri.removeprefix("sqlite:///")).resolve().parent / "mlartifacts"
    return DEFAULT_ARTIFACT_ROOT


def _mlflow():  # type: ignore[no-untyped-def]
    """Import mlflow quietly (its alembic migrations log at INFO on first use)."""
    logging.getLogger("alembic").setLevel(logging.WARNING)
    import mlflow

    uri = tracking_uri()
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(uri)
    return mlflow


def _experiment_id(name: str) -> str:
    mlflow = _mlflow()
    exp = mlflow.get_experiment_by_name(name)
    if exp is not None:
        return str(exp.experiment_id)
    root = artifact_root()
    root.mkdir(parents=True, exist_ok=True)
    return str(mlflow.create_experiment(name, artifact_location=root.as_uri() + "/" + name))


def git_commit() -> str:
    """The checkout's HEAD commit (whatever the working directory), or ``"unknown"`` outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True,
                             cwd=REPO)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def log_training_run(
    experiment: str,
    run_name: str,
    params: dict[str, Any],
    epochs: list[dict[str, float]],
    final_metrics: dict[str, float] | None = None,
    tags: dict[str, str] | None = None,
    artifacts: Iterable[Path] = (),
) -> str:
    """Log one finished training run and return its MLflow run id.

    If a run with the same ``run_key`` tag (experiment, run name and params) already exists, it is
    deleted first, so a rerun of the same target never leaves a duplicate.

    Args:
        experiment: MLflow experiment name (one per Table 1 row, e.g. ``"vgg16/cpu4"``).
        run_name: e.g. ``"pipedream"`` or ``"dp"``.
        params: run parameters (model, mode, config, workers, batch size, lr, seed, ...).
        epochs: one dict per epoch, metric name -> value (e.g. ``epoch_time_s``, ``train_loss``,
            ``val_accuracy``, ``samples_per_s``); logged with ``step`` = epoch index (1-based).
        final_metrics: metrics logged once (e.g. ``time_to_accuracy_s``).
        tags: extra tags (model, cluster, mode, config, reduced/full); ``git_commit`` is added.
        artifacts: files to attach (plan JSON, profile, plots).
    """
    mlflow = _mlflow()
    from mlflow.entities import Metric, Param, RunTag

    exp_id = _experiment_id(experiment)
    run_key = f"{experiment}|{run_name}"
    client = mlflow.MlflowClient()
    for old in client.search_runs([exp_id], filter_string=f"tags.run_key = '{run_key}'"):
        client.delete_run(old.info.run_id)
    all_tags = {"run_key": run_key, "git_commit": git_commit(), **(tags or {})}
    run = client.create_run(exp_id, run_name=run_name, tags=all_tags)
    rid = run.info.run_id
    metrics = [
        Metric(key, float(value), 0, step)
        for step, row in enumerate(epochs, start=1)
        for key, value in row.items()
    ]
    metrics += [Metric(k, float(v), 0, 0) for k, v in (final_metrics or {}).items()]
    client.log_batch(
        rid,
        metrics=metrics,
        params=[Param(k, str(v)) for k, v in params.items()],
        tags=[RunTag(k, str(v)) for k, v in all_tags.items()],
    )
    for path in artifacts:
        if Path(path).is_file():
            client.log_artifact(rid, str(path))
    client.set_terminated(rid)
    return rid


def load_runs(experiment: str) -> list[dict[str, Any]]:
    """All active runs of ``experiment`` as dicts: ``run_id``, ``run_name``, ``params``, ``tags``, ``history``.

    ``history`` maps metric name -> list of (step, value) in step order.
    """
    mlflow = _mlflow()
    exp = mlflow.get_experiment_by_name(experiment)
    if exp is None:
        return []
    client = mlflow.MlflowClient()
    out = []
    for r in client.search_runs([exp.experiment_id]):
        history = {
            key: sorted((m.step, m.value) for m in client.get_metric_history(r.info.run_id, key))
            for key in r.data.metrics
        }
        out.append({
            "run_id": r.info.run_id,
            "run_name": r.info.run_name,
            "params": dict(r.data.params),
            "tags": dict(r.data.tags),
            "history": history,
        })
    return out


def attach_artifacts(run_id: str, paths: Iterable[Path]) -> None:
    """Attach files (e.g. the report's plots) to an existing run; missing files are skipped."""
    client = _mlflow().MlflowClient()
    for path in paths:
        if Path(path).is_file():
            client.log_artifact(run_id, str(path))
