"""Plots of the report (seaborn) and the HTML page that shows them with Table 1."""

from __future__ import annotations

import html
from pathlib import Path

import pandas as pd


def _pyplot():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid")
    return plt, sns


def _save(fig, out: Path) -> None:  # type: ignore[no-untyped-def]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.stem}.tmp.png")
    fig.savefig(tmp, dpi=120)
    tmp.replace(out)


def accuracy_vs_time(model: str, runs: dict[str, list[dict[str, float]]], workers: int, out: Path) -> None:
    """Validation accuracy against wall time, one line per mode, a marker per epoch (paper Figure 10 style).

    Args:
        runs: mode (``"pipedream"``/``"dp"``) -> per-epoch metrics with ``wall_time_s`` and ``val_accuracy``.
    """
    plt, sns = _pyplot()
    rows = [{"mode": "PipeDream" if mode == "pipedream" else "DP", "wall time (s)": e["wall_time_s"],
             "validation accuracy": e["val_accuracy"]} for mode, epochs in runs.items() for e in epochs]
    fig, ax = plt.subplots(figsize=(6, 4))
    sns.lineplot(data=pd.DataFrame(rows), x="wall time (s)", y="validation accuracy", hue="mode", style="mode",
                 markers=True, dashes=False, ax=ax)
    ax.set_title(f"{model} (reduced, {workers} CPU workers): accuracy vs time")
    fig.tight_layout()
    _save(fig, out)
    plt.close(fig)


def speedup_bars(table: pd.DataFrame, out: Path) -> None:
    """Epoch-time speedup over DP per Table 1 row: paper, predicted and measured bars side by side."""
    plt, sns = _pyplot()
    sources = {"paper": "paper_speedup_epoch_time", "predicted": "predicted_speedup_epoch_time",
               "measured (reduced, CPU)": "measured_speedup_epoch_time"}
    rows = []
    for _, r in table.iterrows():
        for name, col in sources.items():
            if col in table.columns and pd.notna(r[col]):
                rows.append({"row": f"{r['model']} {r['hardware']}", "source": name, "speedup over DP": r[col]})
    fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(table)), 4.5))
    if rows:
        sns.barplot(data=pd.DataFrame(rows), x="row", y="speedup over DP", hue="source", ax=ax)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.tick_params(axis="x", rotation=60)
    for label in ax.get_xticklabels():
        label.set_horizontalalignment("right")
    ax.set_xlabel("")
    ax.set_title("Table 1: epoch-time speedup of PipeDream over data parallelism")
    fig.tight_layout()
    _save(fig, out)
    plt.close(fig)


def html_report(table: pd.DataFrame, notes: list[str], results: Path) -> str:
    """A self-contained page: Table 1, its notes, and every PNG under ``results/plots`` (relative links)."""
    images = sorted((results / "plots").glob("*.png"))
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>pipedream-repro: Table 1</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:13px}"
        "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}img{max-width:900px;display:block;margin:1em 0}"
        "</style></head><body><h1>Table 1: PipeDream vs data parallelism</h1>",
        table.to_html(index=False, na_rep="—", float_format=lambda v: f"{v:.3g}"),
        "<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>",
    ]
    for img in images:
        rel = img.relative_to(results).as_posix()
        parts.append(f"<h3>{html.escape(img.stem)}</h3><img src='{html.escape(rel)}' alt='{html.escape(img.stem)}'>")
    parts.append("</body></html>")
    return "\n".join(parts)
