"""``results/report.html``: one self-contained page (images inlined, no external CSS or JS).

Order: provenance, the headline table (one row per paper row: paper, predicted at line rate and calibrated
leave-one-out, and measured speedups) and the speedup plot; DP's link speed fitted per cluster; then why each
prediction differs from the paper, every column of Table 1, the other plots, and how to open the MLflow runs
the measured rows link to.
"""

from __future__ import annotations

import math
from html import escape
from pathlib import Path
from typing import Any

import pandas as pd

from pipedream.html_page import CSS, figure
from pipedream.table1.calibration import pct, spread, within_counts
from pipedream.table1.explain import THRESHOLD
from pipedream.table1.prediction import BAND, MEDIAN_GOAL, NOISE_FLOOR, PLOT_NAME, PROFILE_FLOOR, summary
from pipedream.table2bw.table import PLOT as TWOBW_PLOT

HEADLINE_PLOT = "table1_speedups.png"
# plots of the predicted step (pipedream.table1.predicted_files.write) -> caption; any other PNG gets its file name
PREDICTED_PLOTS = {
    "table1_predicted_speedup.png": "Predicted at paper scale: the paper's speedup beside the simulated one for our "
                                    "planner's config and for the paper's config.",
    "dp_comm_stall.png": "Simulated share of DP worker time stalled in gradient allreduce, per model and cluster.",
    "timeline_gnmt8_A_1x4.png": "Simulated timelines of the first minibatches: PipeDream 1F1B, GPipe, 2BW and DP.",
}
UI_COMMAND = "make ui"  # = mlflow ui --backend-store-uri sqlite:///results/mlflow.db --host 127.0.0.1 --port 5000


def row_label(r: pd.Series) -> str:
    """A Table 1 row's name, e.g. ``"vgg16 A 4x4"`` (as in ``table1_predicted.csv``'s ``row``)."""
    return f"{r['model']} {r['hardware']}"


def _text(v: Any) -> str:
    """Escaped text of a cell; NaN and missing values as an em dash."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return escape(str(v), quote=False)


def _x(v: Any) -> str:
    """A speedup, ``"5.28×"``; NaN as an em dash."""
    return "—" if v is None or math.isnan(float(v)) else f"{float(v):.2f}×"


def _num(v: Any, column: str) -> str:
    """A number in the detail table: speedups and errors to 2 decimals, others to 3 significant digits."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return _text(v)
    if math.isnan(v):
        return "—"
    return f"{v:.2f}" if "speedup" in column or "error" in column else f"{v:.3g}"


def _plots(plots: list[Path], models: list[str]) -> str:
    """The plots below the tables: measured accuracy curves two abreast, then the predicted step's plots."""
    by_name = {p.name: p for p in plots}
    curves = [by_name.pop(f"{m}_accuracy_vs_time.png") for m in models if f"{m}_accuracy_vs_time.png" in by_name]
    by_name.pop(HEADLINE_PLOT, None)
    by_name.pop(PLOT_NAME, None)  # in its own section (_prediction_check)
    by_name.pop(TWOBW_PLOT, None)  # in the 2BW section (pipedream.table2bw.html)
    out = []
    if curves:
        out.append("<h3>Measured: validation accuracy against wall time (reduced models, CPU)</h3><div class='grid'>")
        out += [figure(p, p.stem.replace("_", " ")) for p in curves]
        out.append("</div>")
    if by_name:
        out.append("<h3>Predicted at paper scale</h3>")
        out += [figure(p, PREDICTED_PLOTS.get(name, p.stem.replace("_", " "))) for name, p in sorted(by_name.items())]
    return "".join(out)


def _provenance(prov: dict[str, str]) -> str:
    items = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v, quote=False)}</dd>" for k, v in prov.items())
    return f"<dl class='prov' id='provenance'>{items}</dl>"


def _run_links(runs: list[tuple[str, str, str | None]]) -> str:
    """The MLflow runs of a measured row: a link per mode where the experiment is known, else the bare id."""
    return " · ".join(f"<a href='{escape(url)}' title='MLflow run {escape(run_id)}'>{escape(mode)}</a>" if url else
                      f"{escape(mode)} <code title='not in the MLflow store'>{escape(run_id[:8])}</code>"
                      for mode, run_id, url in runs) or "—"


def _vs_paper(speedup: Any, rel: Any) -> str:
    """A predicted speedup with its relative error to the paper, ``"5.28× (−3%)"``; NaN as an em dash."""
    out = _x(speedup)
    if isinstance(rel, float) and not math.isnan(rel):
        out += f" <span class='muted'>({rel:+.0%})</span>"
    return out


def _headline(df: pd.DataFrame, explanations: dict[str, list[str]],
              runs: dict[str, list[tuple[str, str, str | None]]]) -> str:
    """One row per paper row: paper, predicted at line rate and calibrated (leave-one-out), and measured (reduced,
    CPU) speedups side by side."""
    first_row = {}  # measured run -> number of the first row it stands for
    body = []
    for i, (_, r) in enumerate(df.iterrows(), start=1):
        label = row_label(r)
        pred = _vs_paper(r.get("predicted_speedup_epoch_time", math.nan), r.get("predicted_rel_error", math.nan))
        loo = _vs_paper(r.get("predicted_loo_speedup_epoch_time", math.nan), r.get("predicted_loo_rel_error", math.nan))
        frac = r.get("predicted_loo_dp_fraction", math.nan)
        if isinstance(frac, float) and not math.isnan(frac):
            loo = f"<span title='DP between servers at {frac:.0%} of line rate'>{loo}</span>"
        if label in explanations:
            pred += f" <a href='#why-{i}' title='why it differs from the paper'>why?</a>"
        cells = [f"<td class='n'>{i}</td>", f"<td>{_text(r['model'])}</td>", f"<td>{_text(r['hardware'])}</td>",
                 f"<td class='g'>{_text(r['paper_config'])}</td>", f"<td class='n'>{_x(r['paper_speedup_epoch_time'])}</td>",
                 f"<td class='n'>{_x(r['paper_speedup_tta'])}</td>",
                 f"<td class='g'>{_text(r.get('predicted_config'))}</td>", f"<td class='n'>{pred}</td>",
                 f"<td class='n'>{loo}</td>"]
        run = r.get("measured_run")
        if isinstance(run, str) and run in first_row:
            j = first_row[run]
            cells.append(f"<td class='g same' colspan='4'>same run as <a href='#row-{j}'>#{j}</a> "
                         f"({_text(r['measured_note'].removeprefix('same run as '))})</td>")
        else:
            if isinstance(run, str):
                first_row[run] = i
            cells += [f"<td class='g'>{_text(r.get('measured_config'))}</td>",
                      f"<td class='n'>{_x(r.get('measured_speedup_epoch_time', math.nan))}</td>",
                      f"<td class='n'>{_x(r.get('measured_speedup_tta', math.nan))}</td>",
                      f"<td>{_run_links(runs.get(str(r['model']), [])) if isinstance(run, str) else '—'}</td>"]
        body.append(f"<tr id='row-{i}'>{''.join(cells)}</tr>")
    head = ("<thead><tr class='groups'><th colspan='3'></th><th class='g' colspan='3'>paper</th>"
            "<th class='g' colspan='3'>predicted at paper scale</th><th class='g' colspan='4'>measured (reduced, CPU)</th></tr>"
            "<tr><th class='n'>#</th><th>model</th><th>cluster</th>"
            "<th class='g'>config</th><th class='n'>epoch</th><th class='n'>TTA</th>"
            "<th class='g'>config</th><th class='n'>line rate (vs paper)</th><th class='n'>calibrated, LOO</th>"
            "<th class='g'>config</th><th class='n'>epoch</th><th class='n'>TTA</th><th>MLflow runs</th></tr></thead>")
    return f"<div class='scroll'><table id='headline'>{head}<tbody>{''.join(body)}</tbody></table></div>"


def _calibration(table: pd.DataFrame, calibration: pd.DataFrame | None) -> str:
    """DP's effective link speed per cluster (``table1_calibration.csv``) and the rows within 15% of the paper."""
    if calibration is None:
        return "<p class='muted'>No calibration (table1_calibration.csv) in the results.</p>"
    rows = "".join(f"<tr><td>{_text(r.cluster)}</td><td class='n'>{r.rows_fitted}</td><td>{_text(r.rows)}</td>"
                   f"<td class='n'>{pct(r.full_fraction)}</td><td class='n'>"
                   f"{spread(r.loo_fraction_min, r.loo_fraction_max)}</td></tr>"
                   for r in calibration.itertuples(index=False))
    c = within_counts(table, THRESHOLD, "predicted_speedup_epoch_time", "predicted_rel_error", "predicted_loo_rel_error")
    return ("<p>One fraction f of line rate per paper cluster slows DP's allreduce between servers (NCCL over TCP "
            "did not reach line rate); PipeDream stays at line rate. f minimises Σ (ln predicted(f) − ln paper)² "
            "over the cluster's multi-server rows whose plan is not DP; each row's calibrated number uses the f "
            "fitted on the <em>other</em> rows of its cluster (leave-one-out), never its own paper number.</p>"
            "<div class='scroll'><table id='calibration-table'><thead><tr><th>cluster</th><th class='n'>rows</th>"
            "<th>fitted on</th><th class='n'>f, all rows</th><th class='n'>f over the folds</th></tr></thead>"
            f"<tbody>{rows}</tbody></table></div>"
            f"<p>Rows within {THRESHOLD:.0%} of the paper: {c['within_line_rate']} of {c['numbered']} with a "
            f"number ({c['rows']} rows) at line rate; {c['within_loo']} calibrated leave-one-out.</p>")


def _explanations(df: pd.DataFrame, explanations: dict[str, list[str]]) -> str:
    """A ``<details>`` per row whose prediction is more than 15% off the paper, with the reasons."""
    blocks = []
    for i, (_, r) in enumerate(df.iterrows(), start=1):
        why = explanations.get(row_label(r))
        if not why:
            continue
        rel = r.get("predicted_rel_error", math.nan)
        gap = "" if not isinstance(rel, float) or math.isnan(rel) else f", {rel:+.0%}"
        loo = r.get("predicted_loo_rel_error", math.nan)
        if isinstance(loo, float) and not math.isnan(loo):
            gap += f"; calibrated {_x(r['predicted_loo_speedup_epoch_time'])}, {loo:+.0%}"
        summary = (f"#{i} {_text(row_label(r))}: predicted {_x(r.get('predicted_speedup_epoch_time', math.nan))} "
                   f"vs paper {_x(r['paper_speedup_epoch_time'])}{gap}")
        items = "".join(f"<li>{escape(line, quote=False)}</li>" for line in why)
        blocks.append(f"<details id='why-{i}'><summary>{summary}</summary><ul>{items}</ul></details>")
    return "".join(blocks) or "<p class='muted'>No predicted row is more than 15% off the paper.</p>"


def _full_table(df: pd.DataFrame) -> str:
    """Every column of Table 1 (as in ``table1.csv``), numbers right-aligned."""
    numeric = [pd.api.types.is_numeric_dtype(df[c]) for c in df.columns]
    head = "".join(f"<th class='{'n' if n else ''}'>{escape(c)}</th>" for c, n in zip(df.columns, numeric, strict=True))
    rows = ["<tr>" + "".join(f"<td class='n'>{_num(v, c)}</td>" if n else f"<td>{_text(v)}</td>"
                             for v, c, n in zip(r, df.columns, numeric, strict=True)) + "</tr>"
            for r in df.itertuples(index=False)]
    return (f"<div class='scroll'><table id='table1'><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table></div>")


def _prediction_check(check: pd.DataFrame, plots: list[Path]) -> str:
    """Every run's measured against predicted epoch time: the plot, a table of the ratios and a summary."""
    if check.empty:
        return "<p class='muted'>No finished runs to check.</p>"
    s = summary(check)
    rows = []
    for r in check.itertuples(index=False):
        err = abs(r.ratio - 1) if not math.isnan(r.ratio) else math.nan
        mark = "" if math.isnan(err) else (" ✓" if err <= BAND else " ✗")
        rows.append(f"<tr><td>{_text(r.model)}</td><td>{_text(r.mode)}</td><td>{_text(r.config)}</td>"
                    f"<td class='n'>{_num(r.measured_epoch_s, 's')}</td><td class='n'>{_num(r.predicted_epoch_s, 's')}</td>"
                    f"<td class='n'>{'—' if math.isnan(r.ratio) else f'{r.ratio:.2f}'}{mark}</td>"
                    f"<td class='n'>{'—' if math.isnan(r.profile_age_s) else f'{r.profile_age_s / 60:.1f}'}</td></tr>")
    median = "—" if math.isnan(s["median_abs_error"]) else f"{s['median_abs_error']:.1%}"
    table = ("<div class='scroll'><table id='prediction-check-table'><thead><tr><th>model</th><th>mode</th><th>config</th>"
             "<th class='n'>measured epoch (s)</th><th class='n'>predicted epoch (s)</th><th class='n'>measured / "
             f"predicted</th><th class='n'>profile's age at launch (min)</th></tr></thead><tbody>{''.join(rows)}"
             f"</tbody></table></div>"
             f"<p>{s['within']} of {s['runs']} runs within ±{BAND:.0%} of their prediction; median |ratio − 1| "
             f"{median} (goal: at most {MEDIAN_GOAL:.0%}). On a CPU host with more workers than cores the same run "
             f"started twice differs from itself by a median of about {NOISE_FLOOR:.0%}, and the same models profiled "
             f"again minutes later predict it differently by a median of about {PROFILE_FLOOR:.0%}: the floors of this "
             "check there; with a core per worker the goal is every run within 10% (<code>benchmarks/cores</code>).</p>")
    figures = "".join(figure(p, "Every run: left, its measured epoch time against the epoch time predicted before "
                                f"it started (log-log; the line is y = x, the band ±{BAND:.0%}); right, measured / "
                                "predicted per run")
                     for p in plots if p.name == PLOT_NAME)
    return table + figures


def html_report(table: pd.DataFrame, notes: list[str], results: Path, *, provenance: dict[str, str] | None = None,
                explanations: dict[str, list[str]] | None = None, calibration: pd.DataFrame | None = None,
                runs: dict[str, list[tuple[str, str, str | None]]] | None = None,
                prediction_check: pd.DataFrame | None = None, sections: tuple[str, ...] = ()) -> str:
    """The whole page as one string: every PNG under ``<results>/plots`` inlined as a ``data:`` URI.

    Args:
        table: Table 1 (:func:`pipedream.table1.table.build_table`).
        notes: its footnotes.
        results: the results folder (plots are read from ``plots/``).
        provenance: label -> text (:func:`pipedream.table1.provenance.collect`).
        explanations: row name -> why its prediction is off the paper
            (:func:`pipedream.table1.table.read_explanations`).
        calibration: the per-cluster fit of DP's link speed (:func:`pipedream.table1.table.read_calibration`).
        runs: model -> ``(mode, run_id, url)`` of its MLflow runs (:func:`pipedream.table1.measured.mlflow_runs`).
        prediction_check: every run's measured and predicted epoch time
            (:func:`pipedream.table1.prediction.prediction_rows`); None leaves the section out.
        sections: more sections' HTML, before the plots (e.g. :func:`pipedream.table2bw.html.section`).
    """
    explanations = explanations or {}
    plots = sorted((results / "plots").glob("*.png"))
    top = [p for p in plots if p.name == HEADLINE_PLOT]
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width,initial-scale=1'>",
        f"<title>pipedream-repro: Table 1</title><style>{CSS}</style></head><body>",
        "<h1>PipeDream reproduction: Table 1</h1>",
        "<p class='lede'>Speedup of PipeDream over data parallelism (DP time / PipeDream time) for every row of the "
        "paper's Table 1: the paper's numbers, our planner and simulator at paper scale, and reduced models "
        "trained on this machine.</p>",
        _provenance(provenance or {}),
        "<h2>Headline</h2>",
        _headline(table, explanations, runs or {}),
        "<p class='muted'>epoch = epoch-time speedup, TTA = time-to-accuracy speedup; (±%) = predicted / paper − 1; "
        "line rate = DP at the links' line rate; calibrated, LOO = DP between servers at the fraction of line rate "
        "fitted on the other rows of the cluster (<a href='#calibration'>below</a>); "
        f"— = not available. MLflow links open once the UI runs: <code>{UI_COMMAND}</code>.</p>",
        *(figure(p, "Epoch-time speedup over DP per Table 1 row: paper, predicted, measured") for p in top),
        "<h2 id='calibration'>DP's effective link speed, fitted leave-one-out</h2>",
        _calibration(table, calibration),
        "<h2 id='why'>Why predictions differ from the paper</h2>",
        "<p>Rows whose predicted speedup is more than 15% off the paper, with the assumption that differs "
        "(the same sentences as <code>table1_predicted.md</code>).</p>",
        _explanations(table, explanations),
        "<h2>Table 1, every column</h2>",
        _full_table(table),
        "<ul class='notes'>" + "".join(f"<li>{escape(n, quote=False)}</li>" for n in notes) + "</ul>",
        *(("<h2 id='prediction-check'>The prediction check: measured against predicted epoch time</h2>",
            "<p>Before it starts, every run predicts its epoch time with the simulator from its own profile, plan, "
            "cluster, link throttle and host cores (<code>pipedream/sim/predict.py</code>); the ratio is the measured "
            "mean epoch time over that prediction (<code>prediction_check.csv</code>).</p>",
            _prediction_check(prediction_check, plots)) if prediction_check is not None else ()),
        *sections,
        "<h2>Plots</h2>",
        _plots(plots, list(dict.fromkeys(str(m) for m in table["model"]))),
        "<h2 id='mlflow'>MLflow runs</h2>",
        f"<p>Every training run is logged to <code>results/mlflow.db</code>. Start the UI with <code>{UI_COMMAND}</code> "
        "(<code>mlflow ui --backend-store-uri sqlite:///results/mlflow.db --host 127.0.0.1 --port 5000</code>) and "
        "open <a href='http://127.0.0.1:5000'>http://127.0.0.1:5000</a>; the links in the headline table go to each "
        "measured row's PipeDream and DP runs.</p>",
        "</body></html>",
    ]
    return "\n".join(parts)
