"""Table 1: the paper's numbers beside what this machine measured, and the plots.

Measured epoch-time speedup = DP mean epoch time / PipeDream mean epoch time; time-to-accuracy
(TTA) speedup = DP wall time to reach the threshold / PipeDream's, as in the paper's Table 1
(§5.2). Inputs are the ``metrics.json`` files the training runs wrote and the plans.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from pipedream.errors import PipeDreamError
from pipedream.io import atomic_write_text
from pipedream.plan import Plan

MODES = ("pipedream", "dp")


def read_metrics(run_dir: Path) -> list[dict[str, float]]:
    """Per-epoch metrics of one run (``<run_dir>/metrics.json``); raises PipeDreamError if missing."""
    path = run_dir / "metrics.json"
    if not path.is_file():
        raise PipeDreamError(f"{path} not found; run `pipedream train` for this model first")
    epochs = json.loads(path.read_text())
    if not epochs:
        raise PipeDreamError(f"{path} has no epochs")
    return epochs


def time_to_accuracy(epochs: list[dict[str, float]], threshold: float) -> float:
    """Wall seconds until ``val_accuracy`` first reaches ``threshold``; ``nan`` if it never does."""
    for e in epochs:
        if e["val_accuracy"] >= threshold:
            return float(e["wall_time_s"])
    return math.nan


def mean_epoch_time(epochs: list[dict[str, float]]) -> float:
    """Mean ``epoch_time_s`` over epochs, seconds."""
    return sum(e["epoch_time_s"] for e in epochs) / len(epochs)


def measured_row(model: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """One model's measured numbers at reduced scale (both modes)."""
    results = Path(cfg["results_dir"])
    runs = {m: read_metrics(results / "runs" / model / m) for m in MODES}
    plan = Plan.load(results / "plans" / model / f"{cfg['cluster']}.json")
    threshold = cfg["models"][model]["train"].get("threshold")
    if threshold is None:  # default: the accuracy both runs reach (so both TTAs exist)
        threshold = min(max(e["val_accuracy"] for e in r) for r in runs.values())
    tta = {m: time_to_accuracy(r, threshold) for m, r in runs.items()}
    ept = {m: mean_epoch_time(r) for m, r in runs.items()}
    return {
        "measured_config": plan.config,
        "measured_workers": plan.workers,
        "measured_epoch_time_dp_s": ept["dp"],
        "measured_epoch_time_pipedream_s": ept["pipedream"],
        "measured_speedup_epoch_time": ept["dp"] / ept["pipedream"],
        "measured_threshold": threshold,
        "measured_speedup_tta": tta["dp"] / tta["pipedream"],
        "measured_final_acc_dp": runs["dp"][-1]["val_accuracy"],
        "measured_final_acc_pipedream": runs["pipedream"][-1]["val_accuracy"],
        "measured_epochs": len(runs["pipedream"]),
    }


def build_table(cfg: dict[str, Any]) -> pd.DataFrame:
    """Rows of the paper's Table 1 for the configured models, with measured columns beside them."""
    paper = pd.read_csv(cfg["paper_table"])
    rows = []
    for model, mcfg in cfg["models"].items():
        measured = measured_row(model, cfg)
        wanted = mcfg.get("paper_rows") or [{}]
        for want in wanted:
            sel = paper[paper["model"] == model]
            for key, value in want.items():
                sel = sel[sel[key] == value]
            if sel.empty:
                raise PipeDreamError(f"no row for {model} {want} in {cfg['paper_table']}; fix paper_rows")
            for _, p in sel.iterrows():
                rows.append({
                    "model": model,
                    "paper_hardware": f"{p['cluster']} {p['servers']}x{p['gpus_per_server']}",
                    "paper_config": p["pipedream_config"],
                    "paper_speedup_epoch_time": p["speedup_epoch_time"],
                    "paper_speedup_tta": p["speedup_tta"],
                    "measured_hardware": f"{cfg['cluster']} (CPU, {cfg['workers']} gloo processes)",
                    **measured,
                })
    return pd.DataFrame(rows)


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


def plot_accuracy_vs_time(model: str, cfg: dict[str, Any], out: Path) -> None:
    """Validation accuracy against wall time for PipeDream and DP (the paper's Figure style)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    results = Path(cfg["results_dir"])
    frames = []
    for mode in MODES:
        for e in read_metrics(results / "runs" / model / mode):
            frames.append({"mode": "PipeDream" if mode == "pipedream" else "DP",
                           "wall time (s)": e["wall_time_s"], "validation accuracy": e["val_accuracy"]})
    df = pd.DataFrame(frames)
    sns.set_theme(style="whitegrid")
    fig, ax = plt.subplots(figsize=(6, 4))
    sns.lineplot(data=df, x="wall time (s)", y="validation accuracy", hue="mode", style="mode",
                 markers=True, dashes=False, ax=ax)
    ax.set_title(f"{model} (reduced, {cfg['workers']} CPU workers): accuracy vs time")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(out)


def write_report(cfg: dict[str, Any]) -> pd.DataFrame:
    """Write ``table1.csv``, ``table1.md`` and one accuracy-vs-time plot per model; returns the table."""
    results = Path(cfg["results_dir"])
    df = build_table(cfg)
    for model in cfg["models"]:
        plot_accuracy_vs_time(model, cfg, results / "plots" / f"{model}_accuracy_vs_time.png")
    atomic_write_text(results / "table1.csv", df.to_csv(index=False))
    notes = [
        "paper_*: PipeDream (SOSP 2019) Table 1; speedups are DP time / PipeDream time.",
        "measured_*: reduced models on real stand-in data on this machine's CPU "
        f"({cfg['workers']} gloo processes); raw loopback communication unless a bandwidth was emulated.",
        "measured_threshold: the validation accuracy used for time-to-accuracy.",
    ]
    atomic_write_text(results / "table1.md", to_markdown(df, "Table 1: PipeDream vs data parallelism", notes))
    return df
