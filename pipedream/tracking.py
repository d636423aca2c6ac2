"""MLflow tracking: every training run is logged with its parameters, per-epoch metrics and plan.

The store is ``$MLFLOW_TRACKING_URI`` when it is set, else one sqlite file in the checkout,
``<repo>/results/mlflow.db`` (what ``make ui`` shows), whatever the working directory; artifacts go
to ``mlartifacts`` beside a sqlite store (:func:`artifact_root`).

``PIPEDREAM_TRACKING=off`` trains without MLflow (:func:`tracking_enabled`): for a machine that has no MLflow
installed, such as a GPU node of a cluster or the lent device machine (``benchmarks/cores``); the run's own files
(``run.json``, ``metrics.json``, ``prediction.json``) are written as always, and its ``run_id`` is empty.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pipedream.errors import PipeDreamError
from pipedream.paths import REPO, RESULTS

DEFAULT_TRACKING_URI = f"sqlite:///{RESULTS / 'mlflow.db'}"
DEFAULT_ARTIFACT_ROOT = RESULTS / "mlartifacts"
STORE_HELP = "$MLFLOW_TRACKING_URI if set, else sqlite:///<repo>/results/mlflow.db"
UI_URL = "http://127.0.0.1:5000"  # where `make ui` serves the store
TRACKING_ENV = "PIPEDREAM_TRACKING"


def tracking_enabled() -> bool:
    """Whether training runs are logged to MLflow: yes unless ``$PIPEDREAM_TRACKING`` is ``off`` (or ``0``,
    ``false``, ``no``; any case). Raises PipeDreamError for any other value than those and ``on``/``1``/``true``/
    ``yes``, so a typo does not silently drop the tracking."""
    value = os.environ.get(TRACKING_ENV, "on").strip().lower()
    if value in ("on", "1", "true", "yes", ""):
        return True
    if value in ("off", "0", "false", "no"):
        return False
    raise PipeDreamError(f"${TRACKING_ENV}={os.environ[TRACKING_ENV]!r} is not on or off; unset it to log runs to "
                         "MLflow, or set it to off to train without MLflow")


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
    """Import mlflow quietly (its alembic migrations log at INFO on first use) and offline: its usage telemetry
    would call an outside server (config.mlflow-telemetry.io) from every run; the user may still opt in by
    setting ``MLFLOW_DISABLE_TELEMETRY=false``."""
    logging.getLogger("alembic").setLevel(logging.WARNING)
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    try:
        import mlflow
    except ImportError as e:
        raise PipeDreamError(f"MLflow does not import here ({e}): install it (`make setup`, or pip install -r "
                             f"requirements.txt), or set {TRACKING_ENV}=off to train without logging to MLflow") from e

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


def experiment_of_run(run_id: str) -> str | None:
    """The MLflow experiment id of a run, or None if the store does not hold it (or cannot be read)."""
    try:
        return str(_mlflow().MlflowClient().get_run(run_id).info.experiment_id)
    except Exception:  # noqa: BLE001 - any store error means "unknown"; the caller shows the bare run id
        return None


def run_url(experiment_id: str, run_id: str) -> str:
    """The run's page in a local ``mlflow ui`` (``make ui``)."""
    return f"{UI_URL}/#/experiments/{experiment_id}/runs/{run_id}"


def git_commit() -> str:
    """The checkout's HEAD commit (whatever the working directory), or ``"unknown"`` outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True,
                             cwd=REPO)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class LiveRun:
    """One training run logged to MLflow while it trains: parameters and tags at the start, each epoch's
    metrics as it ends (``step`` = epoch, timestamp = the run's start + the epoch's ``wall_time_s``, so
    the UI's wall-time axis is real time), metrics scored per epoch after training at the same steps and
    times (:meth:`log_scores`), final metrics, artifacts and the status at the end.

    A rerun of the same target (same experiment and run name: the ``run_key`` tag) retires the earlier
    runs only when it ends: a FINISHED run deletes every earlier run of its key, so no duplicate is left; a
    FAILED or KILLED one deletes only earlier runs that did not finish, so a crashed rerun never replaces
    the FINISHED run a report links to.

    Args:
        experiment: MLflow experiment name (one per Table 1 row, e.g. ``"vgg16/cpu4"``).
        run_name: e.g. ``"pipedream"`` or ``"dp"``.
        params: run parameters (model, mode, config, workers, batch size, lr, seed, ...).
        tags: extra tags (model, cluster, mode, config, reduced/full); ``git_commit`` is added.
        start_time_s: the run's start (Unix seconds; default now).
    """

    def __init__(self, experiment: str, run_name: str, params: dict[str, Any], tags: dict[str, str] | None = None,
                 start_time_s: float | None = None) -> None:
        self.logged = 0  # epochs logged so far
        self.ended = False  # whether finish() has ended the run
        self.enabled = tracking_enabled()
        if not self.enabled:  # $PIPEDREAM_TRACKING=off: every method below is a no-op
            self.experiment_id = self.run_id = ""
            return
        mlflow = _mlflow()
        from mlflow.entities import Param

        self.experiment_id = _experiment_id(experiment)
        run_key = f"{experiment}|{run_name}"
        self.client = mlflow.MlflowClient()
        self.run_key = run_key
        self.tags = {"run_key": run_key, "git_commit": git_commit(), **(tags or {})}
        self.start_ms = int(1000 * (time.time() if start_time_s is None else start_time_s))
        run = self.client.create_run(self.experiment_id, start_time=self.start_ms, run_name=run_name, tags=self.tags)
        self.run_id: str = run.info.run_id
        self.client.log_batch(self.run_id, params=[Param(k, str(v)) for k, v in params.items()])

    def log_epochs(self, epochs: list[dict[str, float]]) -> None:
        """Log the epochs of ``epochs`` (all of the run so far, in order) that are not logged yet."""
        new = epochs[self.logged:]
        if new and self.enabled:
            from mlflow.entities import Metric

            metrics = []
            for step, row in enumerate(new, start=self.logged + 1):
                ts = self.start_ms + int(1000 * float(row.get("wall_time_s", 0.0)))
                metrics += [Metric(k, float(v), ts, step) for k, v in row.items() if k != "epoch"]
            self.client.log_batch(self.run_id, metrics=metrics)
        self.logged += len(new)

    def log_restarts(self, restarts: list[dict[str, float]]) -> None:
        """Log each restart of the job (rows of ``restarts.json``, :func:`pipedream.runtime.checkpoint.note_restart`)
        at step = its number and at the time it resumed: ``restart_resumed_epoch``, ``restart_resumed_minibatch``
        (the checkpoint's position) and, where its first minibatch ended, ``restart_first_minibatch_s`` (seconds
        from the resume to then); and their count as ``restarts``."""
        if not self.enabled:
            return
        from mlflow.entities import Metric

        metrics = [Metric("restarts", float(len(restarts)), int(1000 * time.time()), 0)]
        for r in restarts:
            ts, step = int(1000 * r["resumed_at_unix_s"]), int(r["restart"])
            metrics += [Metric("restart_resumed_epoch", float(r["resumed_epoch"]), ts, step),
                        Metric("restart_resumed_minibatch", float(r["resumed_minibatch"]), ts, step)]
            if "first_minibatch_unix_s" in r:
                metrics.append(Metric("restart_first_minibatch_s", r["first_minibatch_unix_s"] - r["resumed_at_unix_s"],
                                      ts, step))
        self.client.log_batch(self.run_id, metrics=metrics)

    def log_scores(self, name: str, epochs: list[dict[str, float]]) -> None:
        """Log metric ``name`` of every epoch of ``epochs`` that has it, at the epoch's step and real time
        (as :meth:`log_epochs` would have): a metric scored after training, such as BLEU of each epoch's
        saved model, lands where the epoch ended on the wall-time axis, not when it was scored."""
        if not self.enabled:
            return
        from mlflow.entities import Metric

        metrics = [Metric(name, float(row[name]), self.start_ms + int(1000 * float(row.get("wall_time_s", 0.0))), step)
                   for step, row in enumerate(epochs, start=1) if name in row]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def finish(self, final_metrics: dict[str, float] | None = None, tags: dict[str, str] | None = None,
               artifacts: Iterable[Path] = (), status: str = "FINISHED") -> None:
        """Log final metrics (step 0, now), extra tags and artifacts (missing files skipped), then end
        the run with ``status`` (``FINISHED``, ``FAILED`` or ``KILLED``), then retire the earlier runs of the
        same target (see the class docstring)."""
        if not self.enabled:
            self.ended = True
            return
        from mlflow.entities import Metric, RunTag

        now = int(1000 * time.time())
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, 0) for k, v in (final_metrics or {}).items()],
                              tags=[RunTag(k, str(v)) for k, v in (tags or {}).items()])
        for path in artifacts:
            if Path(path).is_file():
                self.client.log_artifact(self.run_id, str(path))
        self.client.set_terminated(self.run_id, status=status)
        self.ended = True
        for old in self.client.search_runs([self.experiment_id], filter_string=f"tags.run_key = '{self.run_key}'"):
            if old.info.run_id != self.run_id and (status == "FINISHED" or old.info.status != "FINISHED"):
                self.client.delete_run(old.info.run_id)


def load_runs(experiment: str) -> list[dict[str, Any]]:
    """All active runs of ``experiment`` as dicts: ``run_id``, ``run_name``, ``params``, ``tags``, ``history``.

    ``history`` maps metric name -> list of (step, value) in step order.
    """
    mlflow = _mlflow()
    exp = mlflow.get_experiment_by_name(experiment)
    if exp is None:
        return []
    client = mlflow.MlflowClient()
    return [{"run_id": r.info.run_id, "run_name": r.info.run_name, "params": dict(r.data.params),
             "tags": dict(r.data.tags),
             "history": {key: sorted((m.step, m.value) for m in client.get_metric_history(r.info.run_id, key))
                         for key in r.data.metrics}}
            for r in client.search_runs([exp.experiment_id])]


def attach_artifacts(run_id: str, paths: Iterable[Path]) -> None:
    """Attach files (e.g. the report's plots) to an existing run; missing files are skipped. A run trained with
    ``$PIPEDREAM_TRACKING=off`` (an empty ``run_id``) has no MLflow run: nothing is attached."""
    if not run_id:
        return
    client = _mlflow().MlflowClient()
    for path in paths:
        if Path(path).is_file():
            client.log_artifact(run_id, str(path))
