"""PipeDream-2BW's part of the reports: a section of ``results/report.html`` (when ``make run-2bw`` has written
``results/table_2bw.csv`` before the report is built) and ``results/report_2bw.html``, a page of its own that
``pipedream table2bw`` writes, so the section exists whichever of ``make run`` and ``make run-2bw`` ran last.

The section: the measured rows (throughput, the largest stage's peak bytes, weight copies, final validation loss
against DP's with the same optimizer), the loss sentences of :func:`pipedream.table2bw.table.loss_lines`, the
validation-loss plot, and the predicted rows at paper scale beside the paper's speedups.
"""

from __future__ import annotations

import math
from html import escape
from pathlib import Path
from typing import Any

import pandas as pd

from pipedream import memory
from pipedream.html_page import CSS, figure
from pipedream.table2bw.table import PLOT, loss_lines

MEASURED = ["schedule", "optimizer", "config", "samples_per_s", "predicted_samples_per_s", "twobw_speedup",
            "peak_memory_bytes_max_stage", "predicted_memory_bytes_max_stage", "weight_copies", "final_val_loss",
            "val_loss_vs_dp"]
PREDICTED = ["model", "batch_size", "schedule", "config", "samples_per_s", "twobw_speedup", "paper_twobw_speedup",
             "peak_memory_bytes_max_stage", "weight_copies", "paper_depth"]


def _cell(column: str, v: Any) -> str:
    """One table cell: bytes as KiB/MiB/GiB, the loss gap as a signed percentage, other numbers to 3 digits."""
    if isinstance(v, float) and math.isnan(v):
        return "<td></td>"
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        text = (memory.format_bytes(v) if "memory_bytes" in column else f"{v:+.1%}" if column == "val_loss_vs_dp"
                else f"{v:.3g}")
        return f"<td class='n'>{text}</td>"
    return f"<td>{escape(str(v), quote=False)}</td>"


def _table(df: pd.DataFrame, columns: list[str]) -> str:
    cols = [c for c in columns if c in df.columns]
    head = "".join(f"<th>{escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(_cell(c, r[c]) for c in cols) + "</tr>" for _, r in df.iterrows())
    return f"<div class='scroll'><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"


def section(results: Path) -> str:
    """The PipeDream-2BW section as HTML, or '' when ``results/table_2bw.csv`` does not exist."""
    path = results / "table_2bw.csv"
    if not path.is_file():
        return ""
    df = pd.read_csv(path)
    measured, predicted = df[df["scope"] == "measured"], df[df["scope"] == "predicted"]
    rows = [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
            for r in measured.to_dict("records")]
    parts = ["<h2 id='twobw'>PipeDream-2BW: 2BW against GPipe, PipeDream-Flush, 1F1B and DP</h2>",
             "<p>From <code>make run-2bw</code> (<code>experiments/2bw.yaml</code>, <code>results/table_2bw.md</code>)."
             " Measured: the reduced GPT on 4 CPU processes, the same 32 samples per update for every schedule; "
             "predicted_* is each run's own prediction. val_loss_vs_dp = final validation loss / DP's with the "
             "same optimizer − 1.</p>"]
    if len(measured):
        parts += [_table(measured, MEASURED), "<ul class='notes'>" + "".join(
            f"<li>{escape(line, quote=False)}</li>" for line in loss_lines(rows)) + "</ul>"]
    png = results / "plots" / PLOT
    if png.is_file():
        parts.append(figure(png, "Validation loss per epoch, reduced GPT: 2BW and DP solid (config optimizer) and "
                                 "dotted (loss check's optimizer), other schedules dashed."))
    if len(predicted):
        parts += ["<h3>Predicted at paper scale (FLOP-costed GPT models on the paper's 8 x 8 V100 cluster)</h3>",
                  _table(predicted, PREDICTED)]
    return "".join(parts)


def page(results: Path) -> str:
    """``report_2bw.html``: :func:`section` as a self-contained page (images inlined)."""
    return ("<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>pipedream-repro: PipeDream-2BW</title><style>{CSS}</style></head><body>"
            f"<h1>PipeDream reproduction: PipeDream-2BW</h1>{section(results)}</body></html>")
