"""Table 1's ``measured_*`` columns: reduced models trained on this machine (``results/speedup/<model>.json``).

Measured epoch-time speedup = DP mean epoch time / PipeDream mean epoch time; time-to-accuracy (TTA)
speedup = DP wall time to reach the threshold / PipeDream's, as in the paper's Table 1 (§5.2). The wall
time of an epoch is its ``wall_time_s`` in ``metrics.json``, for BLEU thresholds too: the BLEU of every
epoch's model is scored after training (:mod:`pipedream.commands.train`), and neither writing those
models nor scoring them is in the wall time, in either mode.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipedream.errors import PipeDreamError
from pipedream.experiment import SCORED_METRICS, THRESHOLD_METRICS, model_data
from pipedream.io import atomic_write_json
from pipedream.plan import Plan
from pipedream.tracking import experiment_of_run, run_url

MODES = ("pipedream", "dp")
PERCENT_METRICS = ("top1", "token_accuracy")


def finished_runs(results: Path, models: list[str]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """``(model, mode, run.json contents)`` of every finished run (``<results>/runs/<model>/<mode>/run.json``)
    of ``models``, models in order, each in :data:`MODES` order."""
    for model in models:
        for mode in MODES:
            marker = results / "runs" / model / mode / "run.json"
            if marker.is_file():
                yield model, mode, json.loads(marker.read_text())


def read_metrics(run_dir: Path) -> list[dict[str, float]]:
    """Per-epoch metrics of one run (``<run_dir>/metrics.json``); raises PipeDreamError if missing."""
    path = run_dir / "metrics.json"
    if not path.is_file():
        raise PipeDreamError(f"{path} not found; run `pipedream train` for this model first")
    epochs = json.loads(path.read_text())
    if not epochs:
        raise PipeDreamError(f"{path} has no epochs")
    return epochs


def metric_value(epoch: dict[str, float], metric: str) -> float:
    """One epoch's validation ``metric``, in the unit its threshold uses.

    ``"accuracy"``: ``val_accuracy`` (0-1); ``"top1"`` and ``"token_accuracy"`` (validation token accuracy,
    padding excluded): 100 x ``val_accuracy`` (percent); ``"perplexity"``: exp(``val_loss``);
    ``"bleu"``, ``"bleu4"`` (:data:`SCORED_METRICS`, 0-100): the epoch's score under that key.

    Raises:
        PipeDreamError: a scored metric that the epoch lacks (the run did not score its epochs).
    """
    if metric in SCORED_METRICS:
        if metric not in epoch:
            raise PipeDreamError(f"epoch {epoch.get('epoch', '?')} of the run has no {metric!r} score; train it with "
                                 f"`pipedream train --threshold-metric {metric}` (or --score-epochs), which scores "
                                 "every epoch's model after training")
        return float(epoch[metric])
    if metric == "perplexity":
        return math.exp(min(epoch["val_loss"], 700.0))
    return (100.0 if metric in PERCENT_METRICS else 1.0) * epoch["val_accuracy"]


def _first_reached(epochs: list[dict[str, float]], threshold: float, metric: str) -> int | None:
    """Index of the first epoch whose :func:`metric_value` meets ``threshold`` (at most it for perplexity, else at
    least); None if none does."""
    values = (metric_value(e, metric) for e in epochs)
    return next((i for i, v in enumerate(values) if (v <= threshold if metric == "perplexity" else v >= threshold)),
                None)


def time_to_accuracy(epochs: list[dict[str, float]], threshold: float, metric: str = "accuracy") -> float:
    """Wall seconds until the validation ``metric`` first meets ``threshold``; ``nan`` if it never does."""
    i = _first_reached(epochs, threshold, metric)
    return math.nan if i is None else float(epochs[i]["wall_time_s"])


def epochs_to_accuracy(epochs: list[dict[str, float]], threshold: float, metric: str = "accuracy") -> float:
    """Number of epochs until the validation ``metric`` first meets ``threshold``; ``nan`` if never."""
    i = _first_reached(epochs, threshold, metric)
    return math.nan if i is None else float(i + 1)


def threshold_of(model_cfg: dict[str, Any]) -> tuple[float, str]:
    """The fixed time-to-accuracy target of one model from its config: ``(value, metric)``.

    Metrics the runs have for every epoch count: ``top1``, ``token_accuracy``, ``perplexity`` (measured
    by the workers) and ``bleu``, ``bleu4`` (scored after training on every epoch's saved model). A
    model without one (METEOR needs a Java runtime and is never scored) gets ``(nan, "none")``: no
    time-to-accuracy is reported, and no target is ever picked from the runs themselves.
    """
    t = model_cfg.get("threshold")
    if t and t["metric"] in THRESHOLD_METRICS:
        return float(t["value"]), str(t["metric"])
    return math.nan, "none"


def run_threshold(cfg: dict[str, Any], model: str) -> tuple[float, str]:
    """:func:`threshold_of` for ``model``'s runs under experiment ``cfg``: ``(nan, "none")`` for a BLEU
    threshold on synthetic data, whose epochs ``pipedream train`` does not score."""
    threshold, metric = threshold_of(cfg["models"][model])
    if metric in SCORED_METRICS and model_data(cfg, model) == "synthetic":
        return math.nan, "none"
    return threshold, metric


def measured_speedup(model: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """One model's measured numbers at reduced scale, from its PipeDream and DP runs.

    The time-to-accuracy target comes from :func:`threshold_of` (none for BLEU on synthetic data, which
    ``pipedream train`` does not score).

    Raises:
        PipeDreamError: if a run's metrics or the plan are missing.
    """
    results = Path(cfg["results_dir"])
    runs = {m: read_metrics(results / "runs" / model / m) for m in MODES}
    plan = Plan.load(results / "plans" / model / f"{cfg['cluster']}.json")
    threshold, metric = run_threshold(cfg, model)
    tta = {m: time_to_accuracy(r, threshold, metric) for m, r in runs.items()}
    eta = {m: epochs_to_accuracy(r, threshold, metric) for m, r in runs.items()}
    ept = {m: sum(e["epoch_time_s"] for e in r) / len(r) for m, r in runs.items()}  # mean epoch time, s
    return {"model": model, "measured_config": plan.config, "measured_planned_speedup": plan.predicted_speedup,
            "measured_epoch_time_dp_s": ept["dp"], "measured_epoch_time_pipedream_s": ept["pipedream"],
            "measured_speedup_epoch_time": ept["dp"] / ept["pipedream"],
            "measured_threshold": threshold, "measured_threshold_metric": metric,
            "measured_tta_dp_s": tta["dp"], "measured_tta_pipedream_s": tta["pipedream"],
            "measured_speedup_tta": tta["dp"] / tta["pipedream"],
            "measured_epochs_to_accuracy_dp": eta["dp"], "measured_epochs_to_accuracy_pipedream": eta["pipedream"],
            "measured_final_acc_dp": runs["dp"][-1]["val_accuracy"],
            "measured_final_acc_pipedream": runs["pipedream"][-1]["val_accuracy"], "measured_epochs": len(runs["pipedream"])}


def write_speedup(model: str, cfg: dict[str, Any], out: Path) -> dict[str, Any]:
    """Write :func:`measured_speedup` for ``model`` as JSON to ``out`` (a per-experiment target)."""
    row = measured_speedup(model, cfg)
    atomic_write_json(out, row)
    return row


def mlflow_runs(run_dir: Path) -> list[tuple[str, str, str | None]]:
    """The MLflow runs behind one model's measurement: ``(mode, run_id, url or None)`` per mode.

    Reads ``<run_dir>/<mode>/run.json``; a run.json written before it carried ``experiment_id`` gets it
    from the MLflow store. The url is the run's page under ``make ui`` (None if the store lacks the run). A run
    trained with ``$PIPEDREAM_TRACKING=off`` (an empty ``run_id``) is left out.
    """
    out = []
    for mode in MODES:
        path = run_dir / mode / "run.json"
        if not path.is_file():
            continue
        run = json.loads(path.read_text())
        if not run.get("run_id"):
            continue
        eid = run.get("experiment_id") or experiment_of_run(run["run_id"])
        out.append((mode, str(run["run_id"]), run_url(eid, run["run_id"]) if eid else None))
    return out
