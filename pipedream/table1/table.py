"""Table 1 assembled: the paper's numbers, the prediction at paper scale and what this machine measured.

Every row of the paper's Table 1 gets three column groups:

- ``paper_*``: the paper's configuration and speedups (experiments/paper_table1.csv);
- ``predicted_*``: V100 profiles + the row's cluster -> planner -> simulator
  (``results/table1_predicted.csv``, :mod:`pipedream.table1.predicted`);
- ``measured_*``: reduced models trained on this machine (``results/speedup/<model>.json``,
  :mod:`pipedream.table1.measured`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from pipedream.errors import PipeDreamError
from pipedream.io import atomic_write_text
from pipedream.paths import shipped
from pipedream.table1 import plots, schedules_html
from pipedream.table1.html import html_report, row_label
from pipedream.table1.measured import MODES, measured_speedup, mlflow_runs, read_metrics, run_threshold
from pipedream.table1.memory_check import write_memory_check
from pipedream.table1.prediction import write_prediction_check
from pipedream.table1.provenance import collect
from pipedream.table2bw.html import section
from pipedream.tracking import attach_artifacts

PREDICTED_COLUMNS = {"predicted_config": "predicted_config", "predicted_speedup": "predicted_speedup_epoch_time",
                     "rel_error": "predicted_rel_error", "loo_fraction": "predicted_loo_dp_fraction",
                     "loo_predicted_speedup": "predicted_loo_speedup_epoch_time",
                     "loo_rel_error": "predicted_loo_rel_error"}


def read_paper_table(path: str | Path) -> pd.DataFrame:
    """The paper's Table 1 as a data frame (a relative path not found here is looked up in the checkout).

    Raises:
        PipeDreamError: the file is missing, not UTF-8 text, or not CSV.
    """
    path = shipped(path)
    if not path.is_file():
        raise PipeDreamError(f"paper table {path} not found; pass --paper-table experiments/paper_table1.csv")
    try:
        return pd.read_csv(path, encoding="utf-8")
    except (UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise PipeDreamError(f"paper table {path} is not a CSV file ({type(e).__name__}); "
                             "pass --paper-table experiments/paper_table1.csv") from None


def build_table(cfg: dict[str, Any]) -> pd.DataFrame:
    """All rows of the paper's Table 1 with predicted and measured columns beside them.

    Predicted columns come from ``<results>/table1_predicted.csv`` when it exists; measured columns
    from ``<results>/speedup/<model>.json`` for the models in ``cfg["models"]`` (empty otherwise).
    """
    results = Path(cfg["results_dir"])
    paper = read_paper_table(cfg["paper_table"])
    df = pd.DataFrame({
        "task": paper["task"], "model": paper["model"],
        "hardware": paper["cluster"] + " " + paper["servers"].astype(str) + "x" + paper["gpus_per_server"].astype(str),
        "paper_config": paper["pipedream_config"],
        "paper_speedup_epoch_time": paper["speedup_epoch_time"],
        "paper_speedup_tta": paper["speedup_tta"],
    })
    pred_path = results / "table1_predicted.csv"
    if pred_path.is_file():
        pred = pd.read_csv(pred_path)
        pred = pred[["model", "hardware", *(c for c in PREDICTED_COLUMNS if c in pred.columns)]]  # older: no loo_*
        pred = pred.rename(columns=PREDICTED_COLUMNS)
        df = df.merge(pred, on=["model", "hardware"], how="left")
    measured = []
    for model in cfg["models"]:
        path = results / "speedup" / f"{model}.json"
        row = json.loads(path.read_text()) if path.is_file() else measured_speedup(model, cfg)
        measured.append({k: row[k] for k in ("model", "measured_config", "measured_speedup_epoch_time",
                                              "measured_speedup_tta", "measured_threshold", "measured_threshold_metric",
                                              "measured_final_acc_dp", "measured_final_acc_pipedream")})
    if measured:
        df = _mark_shared_runs(df.merge(pd.DataFrame(measured), on="model", how="left"), cfg)
    unknown = sorted(set(cfg["models"]) - set(df["model"]))
    if unknown:
        raise PipeDreamError(f"model(s) {', '.join(unknown)} have no row in {cfg['paper_table']}; "
                             f"Table 1 models are {', '.join(sorted(set(paper['model'])))}")
    return df


def _mark_shared_runs(df: pd.DataFrame, cfg: dict[str, Any]) -> pd.DataFrame:
    """Name the run behind each measured row and mark the rows that repeat another row's run.

    One reduced run per model stands for every paper row of that model (e.g. VGG-16 on A 4x4 and B 2x8):
    ``measured_run`` is its MLflow experiment (``<model>/<cluster>``) on every such row, and
    ``measured_note`` says ``"same run as <first row>"`` on all but the first.
    """
    df = df.assign(measured_run=pd.Series(math.nan, index=df.index, dtype=object),
                   measured_note=pd.Series(math.nan, index=df.index, dtype=object))
    for model in cfg["models"]:
        rows = df.index[df["model"] == model]
        df.loc[rows, "measured_run"] = f"{model}/{cfg['cluster']}"
        df.loc[rows[1:], "measured_note"] = f"same run as {row_label(df.loc[rows[0]])}"
    return df


def read_explanations(results: Path) -> dict[str, list[str]]:
    """Row name -> why its prediction is more than 15% off the paper, from ``table1_predicted.csv``'s
    ``explanation`` column (written by :func:`pipedream.table1.predicted_files.write_predicted`); rows within
    15%, and tables written before that column existed, have none."""
    path = results / "table1_predicted.csv"
    if not path.is_file():
        return {}
    pred = pd.read_csv(path)
    if "explanation" not in pred.columns or "row" not in pred.columns:
        return {}
    return {str(r): json.loads(e) for r, e in zip(pred["row"], pred["explanation"], strict=True)
            if isinstance(e, str) and json.loads(e)}


def read_calibration(results: Path) -> pd.DataFrame | None:
    """The per-cluster fit of DP's link speed, ``<results>/table1_calibration.csv``
    (:func:`pipedream.table1.calibration.group_summary`), or None where the predicted step wrote none."""
    path = results / "table1_calibration.csv"
    return pd.read_csv(path) if path.is_file() else None


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "—" if math.isnan(v) else f"{v:.3g}"
    return str(v)


def to_markdown(df: pd.DataFrame, title: str, notes: list[str]) -> str:
    """A GitHub-flavoured markdown table with a title and notes."""
    cols = list(df.columns)
    lines = [f"# {title}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines + [""] + [f"- {n}" for n in notes]) + "\n"


def notes(cfg: dict[str, Any]) -> list[str]:
    """The table's footnotes: where each column group comes from."""
    return [
        "paper_*: PipeDream (SOSP 2019) Table 1; speedups are DP time / PipeDream time.",
        "predicted_*: the release's V100 profiles planned for the row's cluster and simulated "
        "(results/table1_predicted.md explains each gap above 15%); predicted_loo_*: the same with DP's allreduce "
        "between servers at the fraction of line rate fitted on the other rows of the row's cluster "
        "(leave-one-out; results/table1_calibration.csv).",
        f"measured_*: reduced models on real stand-in data on this machine's CPU ({cfg['workers']} gloo "
        f"processes, cluster {cfg['cluster']}). One reduced run per model stands for every paper row of that "
        "model: measured_run names it (its MLflow experiment), and measured_note says 'same run as <row>' on the "
        "rows that repeat it; those rows are not separate measurements of clusters A/B.",
        "measured_threshold (measured_threshold_metric): the time-to-accuracy target, fixed in the config before "
        "the runs (top1: validation top-1 percent; token_accuracy: validation token accuracy in percent, padding "
        "excluded; perplexity: validation perplexity, lower is better; bleu, bleu4: the model's BLEU of greedy "
        "decoding, 0-100, scored after training on the model saved at the end of every epoch, the saving and "
        "scoring kept out of the wall time in both modes); 'none': a metric no run measures (METEOR needs Java; "
        "BLEU on synthetic data), so no time-to-accuracy is reported. A missing time-to-accuracy (—) with a "
        "threshold means a run never reached it: not reached, not a number.",
        f"DP baseline: dp_batch {'/'.join(sorted({m['train'].get('dp_batch', 'per_worker') for m in cfg['models'].values()}))} "
        f"(per_worker: each of the {cfg['workers']} "
        "workers takes a whole minibatch of train.batch_size; with SGD the learning rate is scaled by the workers "
        "with linear warm-up, Goyal et al. 2017; global: a minibatch is split over the workers).",
    ]


def _attach_to_runs(model_runs: Path, files: list[Path]) -> None:
    """Attach ``files`` to the MLflow runs recorded in ``<model_runs>/<mode>/run.json`` (if any)."""
    for mode in MODES:
        marker = model_runs / mode / "run.json"
        if marker.is_file():
            attach_artifacts(json.loads(marker.read_text())["run_id"], files)


def write_report(cfg: dict[str, Any], config_path: str | None = None) -> pd.DataFrame:
    """Write ``table1.csv``, ``table1.md``, ``prediction_check.csv``, ``memory_check.csv``, ``report.html`` and the plots; returns
    the table.

    Args:
        cfg: the experiment config (validated).
        config_path: the config's file, shown in the report's provenance.
    """
    results = Path(cfg["results_dir"])
    df = build_table(cfg)
    for model in cfg["models"]:
        runs = {m: read_metrics(results / "runs" / model / m) for m in MODES}
        png = results / "plots" / f"{model}_accuracy_vs_time.png"
        threshold, metric = run_threshold(cfg, model)
        plots.accuracy_vs_time(model, runs, cfg["workers"], png, metric, threshold)
        _attach_to_runs(results / "runs" / model, [png])
    plots.speedup_bars(df, results / "plots" / "table1_speedups.png")
    check = write_prediction_check(results, list(cfg["models"]))
    write_memory_check(results, list(cfg["models"]))
    atomic_write_text(results / "table1.csv", df.to_csv(index=False))
    atomic_write_text(results / "table1.md", to_markdown(df, "Table 1: PipeDream vs data parallelism", notes(cfg)))
    page = html_report(df, notes(cfg), results, provenance=collect(cfg, config_path),
                       explanations=read_explanations(results), calibration=read_calibration(results),
                       runs={m: mlflow_runs(results / "runs" / m) for m in cfg["models"]}, prediction_check=check,
                       sections=(schedules_html.section(results), section(results)))
    atomic_write_text(results / "report.html", page)
    return df
