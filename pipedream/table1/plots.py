"""Every plot of the report (seaborn, PNG): measured accuracy against time, Table 1 speedup bars (paper,
predicted, measured), every run's measured against predicted epoch time, the predicted table's bars, DP
communication stalls and schedule timelines (:func:`gantt`; the simulated ones are
:func:`pipedream.table1.predicted_files.timeline_panels`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from pipedream.table1.measured import metric_value

if TYPE_CHECKING:
    from pipedream.sim.engine import Trace

COLORS = {"F": "#4C72B0", "B": "#DD8452", "ALLREDUCE": "#55A868", "SEND": "#8172B3"}


def _pyplot():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid")
    return plt, sns


def _save(fig, out: Path, rect: tuple[float, float, float, float] | None = None) -> None:  # type: ignore[no-untyped-def]
    """Lay ``fig`` out tightly (inside ``rect``), write it to ``out`` atomically (a temporary file, then a rename)
    and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout(rect=rect)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.stem}.tmp{out.suffix}")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(out)


METRIC_LABELS = {"accuracy": "validation accuracy", "top1": "validation top-1 (%)",
                 "token_accuracy": "validation token accuracy (%)", "perplexity": "validation perplexity",
                 "bleu": "BLEU", "bleu4": "BLEU-4"}


def accuracy_vs_time(model: str, runs: dict[str, list[dict[str, float]]], workers: int, out: Path,
                     metric: str = "accuracy", threshold: float | None = None) -> None:
    """The time-to-accuracy metric against wall time, one line per mode, a marker per epoch (paper
    Figure 10 style), and the threshold as a dashed line when there is one.

    Args:
        runs: mode (``"pipedream"``/``"dp"``) -> per-epoch metrics with ``wall_time_s`` and what
            :func:`pipedream.table1.measured.metric_value` reads for ``metric``.
        metric: a threshold metric (``"none"`` plots validation accuracy); ``threshold`` in its unit.
    """
    metric = "accuracy" if metric not in METRIC_LABELS else metric
    label = METRIC_LABELS[metric]
    plt, sns = _pyplot()
    rows = [{"mode": "PipeDream" if mode == "pipedream" else "DP", "wall time (s)": e["wall_time_s"],
             label: metric_value(e, metric)} for mode, epochs in runs.items() for e in epochs]
    fig, ax = plt.subplots(figsize=(6, 4))
    sns.lineplot(data=pd.DataFrame(rows), x="wall time (s)", y=label, hue="mode", style="mode",
                 markers=True, dashes=False, ax=ax)
    if threshold is not None and math.isfinite(threshold):
        ax.axhline(threshold, color="grey", linestyle="--", linewidth=1, label=f"threshold {threshold:g}")
        ax.legend()
    if metric == "perplexity":
        ax.set_yscale("log")
    ax.set_title(f"{model} (reduced, {workers} CPU workers): {label} vs time")
    _save(fig, out)


def speedup_bars(table: pd.DataFrame, out: Path) -> None:
    """Epoch-time speedup over DP per Table 1 row: paper, predicted and measured bars side by side."""
    plt, sns = _pyplot()
    sources = {"paper": "paper_speedup_epoch_time", "predicted": "predicted_speedup_epoch_time",
               "measured (reduced, CPU)": "measured_speedup_epoch_time"}
    rows = [{"row": f"{r['model']} {r['hardware']}", "source": name, "speedup over DP": r[col]}
            for _, r in table.iterrows() for name, col in sources.items() if col in table.columns and pd.notna(r[col])]
    fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(table)), 4.5))
    if rows:
        sns.barplot(data=pd.DataFrame(rows), x="row", y="speedup over DP", hue="source", ax=ax)
        sns.move_legend(ax, "lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, title=None, frameon=False)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.tick_params(axis="x", rotation=60)
    for label in ax.get_xticklabels():
        label.set_horizontalalignment("right")
    ax.set_xlabel("")
    ax.set_title("Table 1: epoch-time speedup of PipeDream over data parallelism", pad=26)
    _save(fig, out)


def ratio_points(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of the ratio panel of :func:`predicted_vs_measured`: one per run with a ratio, in ``df``'s order,
    with ``run`` (``"<model> <config>"`` for PipeDream, ``"<model> DP"``), ``mode`` (``PipeDream`` or ``DP``) and
    ``ratio`` (measured / predicted)."""
    data = df[df["ratio"].notna() & (df["ratio"] > 0)]
    return pd.DataFrame({
        "run": [f"{m} DP" if mode == "dp" else f"{m} {c}" if str(c) else str(m)
                for m, mode, c in zip(data["model"], data["mode"], data["config"].fillna("").astype(str), strict=True)],
        "mode": data["mode"].map({"pipedream": "PipeDream", "dp": "DP"}).fillna(data["mode"]).tolist(),
        "ratio": data["ratio"].astype(float).tolist()})


def predicted_vs_measured(df: pd.DataFrame, out: Path, band: float = 0.25, title: str = "") -> None:
    """Every run's measured epoch time against its predicted one, in two panels. Left, the paper's
    real-versus-predicted figure: a log-log scatter, the line y = x and a band of +-``band`` around it. Right, one
    row per run (:func:`ratio_points`, which names them): measured / predicted, the same band shaded.

    Args:
        df: rows of :func:`pipedream.table1.prediction.prediction_rows` (seconds); rows without a
            prediction are left out.
        out: the PNG to write. band: the agreement band, a fraction (0.25: +-25%). title: the ratio panel's
            (:func:`pipedream.table1.prediction.write_prediction_check` gives the check's summary).
    """
    plt, sns = _pyplot()
    data = df.dropna(subset=["measured_epoch_s", "predicted_epoch_s"])
    data = data[(data["measured_epoch_s"] > 0) & (data["predicted_epoch_s"] > 0)].reset_index(drop=True)
    points = ratio_points(data)
    modes = list(dict.fromkeys(points["mode"]))
    palette = dict(zip(modes, sns.color_palette(), strict=False))
    markers = dict(zip(modes, ["o", "X", "s", "D", "^", "v"], strict=False))
    fig, (ax, rx) = plt.subplots(1, 2, figsize=(12, max(5.0, 0.3 * len(points) + 1.8)))
    if len(data):
        lo = min(data["measured_epoch_s"].min(), data["predicted_epoch_s"].min()) / 1.5
        hi = max(data["measured_epoch_s"].max(), data["predicted_epoch_s"].max()) * 1.5
        xs = [lo, hi]
        ax.plot(xs, xs, color="black", linewidth=1, label="measured = predicted")
        ax.fill_between(xs, [x * (1 - band) for x in xs], [x * (1 + band) for x in xs], color="grey", alpha=0.2,
                        label=f"within ±{band:.0%}")
        sns.scatterplot(data=data.assign(mode=points["mode"]), x="predicted_epoch_s", y="measured_epoch_s",
                        hue="mode", style="mode", palette=palette, markers=markers, s=60, ax=ax)
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xscale("log")
        ax.set_yscale("log")
        from matplotlib.ticker import FuncFormatter  # matplotlib is imported by _pyplot (Agg backend first)

        seconds = FuncFormatter(lambda v, _: f"{v:g}")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(seconds)
            axis.set_minor_formatter(seconds)
        ax.tick_params(which="both", labelsize=8)
        ax.legend(loc="upper left", fontsize=8)
        rx.axvspan(1 - band, 1 + band, color="grey", alpha=0.2, label=f"within ±{band:.0%}")
        rx.axvline(1.0, color="black", linewidth=1)
        for mode in modes:
            rows = points[points["mode"] == mode]
            rx.scatter(rows["ratio"], rows.index, marker=markers[mode], color=palette[mode], s=50, zorder=3,
                       label=f"{mode}: measured / predicted")
        values = points["ratio"]
        rx.set_xlim(min(values.min(), 1 - band) - 0.05, max(values.max(), 1 + band) + 0.05)
        rx.set_yticks(list(points.index), points["run"].tolist(), fontsize=8)
        rx.set_ylim(len(points) - 0.5, -0.5)  # the first run on top
        rx.set_title(title, fontsize=10)
        rx.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3, fontsize=7, frameon=False)
    ax.set_xlabel("predicted epoch time (s)")
    ax.set_ylabel("measured epoch time (s)")
    ax.set_title("Every run: measured against predicted epoch time")
    rx.set_xlabel("measured / predicted epoch time")
    _save(fig, out)


def predicted_speedup_bars(df: pd.DataFrame, out: Path) -> None:
    """Paper speedup beside the predicted ones (planner's config and the paper's config), one group per row.

    ``df`` needs ``row``, ``paper_speedup``, ``predicted_speedup`` and ``paper_config_predicted_speedup``.
    """
    plt, sns = _pyplot()
    long = df.melt(id_vars=["row"], value_vars=["paper_speedup", "predicted_speedup", "paper_config_predicted_speedup"],
                   var_name="source", value_name="speedup over DP (epoch time)").dropna()
    long["source"] = long["source"].map({"paper_speedup": "paper", "predicted_speedup": "predicted (our planner's config)",
                                         "paper_config_predicted_speedup": "predicted (paper's config)"})
    fig, ax = plt.subplots(figsize=(max(7, 0.8 * df["row"].nunique() + 2), 4.5))
    sns.barplot(data=long, x="row", y="speedup over DP (epoch time)", hue="source", ax=ax)
    ax.axhline(1.0, color="grey", lw=1, ls="--")
    ax.set_xlabel("")
    ax.tick_params(axis="x", rotation=60)
    ax.set_title("Table 1: PipeDream speedup over data parallelism, paper vs simulated")
    _save(fig, out)


def whatif_speedup_bars(df: pd.DataFrame, out: Path, title: str) -> None:
    """Simulated speedup over DP of the default plan (its config on the bar) per model, one colour per cluster.

    ``df`` needs ``model``, ``cluster``, ``predicted_config`` and ``predicted_speedup``.
    """
    plt, sns = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    sns.barplot(data=df, x="model", y="predicted_speedup", hue="cluster", ax=ax)
    for bars, (_, group) in zip(ax.containers, df.groupby("cluster", sort=False), strict=False):
        ax.bar_label(bars, labels=list(group["predicted_config"]), fontsize=7, rotation=90, padding=2)
    ax.axhline(1.0, color="grey", lw=1, ls="--")
    ax.set_ylabel("speedup over DP (epoch time)")
    ax.set_title(title)
    _save(fig, out)


def dp_stall_bars(df: pd.DataFrame, out: Path) -> None:
    """Share of DP worker time stalled in allreduce per model and cluster (the paper's Figure 1 argument).

    ``df`` needs ``model``, ``hardware`` and ``dp_comm_stall_fraction``.
    """
    plt, sns = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    sns.barplot(data=df.dropna(subset=["dp_comm_stall_fraction"]), x="model", y="dp_comm_stall_fraction",
                hue="hardware", ax=ax)
    ax.set_ylabel("DP time stalled in communication")
    ax.set_ylim(0, 1)
    ax.set_title("Data parallelism: communication stalls (simulated, wait-free backprop)")
    _save(fig, out)


def gantt(panels: list[tuple[str, Trace]], out: Path, ranks: int) -> None:
    """One timeline per schedule: compute spans per rank (forward, backward) and allreduce pieces.

    Args:
        panels: ``(title, trace)`` pairs, traces recorded with ``record=True``.
        out: PNG path.
        ranks: ranks to draw (0 .. ranks - 1).
    """
    plt, _ = _pyplot()
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 1.0 + 0.45 * ranks * len(panels)), squeeze=False)
    for ax, (title, tr) in zip(axes[:, 0], panels, strict=True):
        for r in range(ranks):
            for sp in tr.compute.get(r, []):
                kind = "B" if "B" in sp.what.lstrip("0123456789")[:1] else "F"
                ax.broken_barh([(sp.start, sp.end - sp.start)], (r - 0.4, 0.8), color=COLORS[kind], ec="white", lw=0.3)
        for sp in tr.collectives:
            ax.broken_barh([(sp.start, sp.end - sp.start)], (ranks - 0.4, 0.8), color=COLORS["ALLREDUCE"])
        ax.set_yticks(range(ranks + 1), [f"rank {r}" for r in range(ranks)] + ["allreduce"])
        ax.invert_yaxis()
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("time (s)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in (COLORS["F"], COLORS["B"], COLORS["ALLREDUCE"])]
    fig.legend(handles, ["forward", "backward", "allreduce"], loc="upper right", ncol=3, fontsize=8)
    _save(fig, out, rect=(0, 0, 1, 0.97))
