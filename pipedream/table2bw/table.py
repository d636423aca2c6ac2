"""PipeDream-2BW's table, ``results/table_2bw.{csv,md}``: 2BW against GPipe, PipeDream-Flush, 1F1B and DP.

Two scopes, one row per (model, batch, schedule):

* ``predicted``: the paper's GPT models (1.3, 2.2 and 3.8 billion parameters) costed from FLOP counts
  (:mod:`.paper`) on its cluster (8 x 8 V100, ``B_8x8``) at the paper's batch sizes; for each schedule the 2BW
  planner's search picks that schedule's best configuration under the device memory
  (:mod:`pipedream.planner.twobw`, the cost model's three best shapes re-ranked by simulation), and the event
  simulator times it (``samples_per_s``; the planner's cost model in ``predicted_samples_per_s``;
  ``peak_memory_bytes_max_stage`` from the memory model). PipeDream-Flush only where this checkout has it.
* ``measured``: the reduced GPT trained on 4 CPU processes by ``make run-2bw`` (``experiments/2bw.yaml``), each
  schedule's ``run.json`` and ``metrics.json``: training samples per second over all epochs, the largest stage's
  measured peak bytes and the final validation loss and perplexity, beside the run's own prediction. The config's
  ``twobw.loss_check`` trains some schedules again with another optimizer (``<schedule>-<optimizer>`` run folders):
  with Adam, 2BW's one-step delay leaves its loss behind DP's (Zmushko et al., arXiv:2606.30634); Muon is robust
  to it. ``val_loss_vs_dp`` = final validation loss / DP's with the same optimizer - 1.

``weight_copies`` is what the memory model says the schedule's largest stage holds (2BW 2, flush schedules and
DP 1, 1F1B with weight stashing one per in-flight minibatch on its input stage). The validation losses per
epoch of every measured schedule go to ``results/table_2bw_val_loss.csv`` and ``results/plots/2bw_val_loss.png``
(2BW against DP: the paper's "similar final model accuracy").
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipedream import memory
from pipedream.errors import PipeDreamError
from pipedream.planner import twobw
from pipedream.table2bw.paper import PAPER_DEPTH, PAPER_PERPLEXITY, PAPER_SPEEDUP
from pipedream.topology import Cluster

COLUMNS = ["scope", "model", "batch_size", "schedule", "config", "samples_per_s", "predicted_samples_per_s",
           "twobw_speedup", "peak_memory_bytes_max_stage", "predicted_memory_bytes_max_stage", "weight_copies",
           "optimizer", "final_val_loss", "val_loss_vs_dp", "final_val_perplexity", "paper_depth",
           "paper_twobw_speedup"]
PREDICTED_MODELS = {"GPT-1.3B": "gpt", "GPT-2.2B": "gpt_2.2b", "GPT-3.8B": "gpt_3.8b"}
MEASURED_SCHEDULES = ("2bw", "gpipe", "pipedream_flush", "1f1b", "dp")
PLOT = "2bw_val_loss.png"  # under <results>/plots
LOSS_GOAL = 0.02  # the goal: 2BW's final validation loss within 2% of DP's


def config_text(c: twobw.Candidate) -> str:
    """``"w=8 d=8 b=2"`` plus ``" recompute"``."""
    return f"w={c.width} d={c.depth} b={c.microbatch}" + (" recompute" if c.recompute else "")


def copies(schedule: str, replicas: Sequence[int], microbatches: int) -> int | None:
    """Weight copies the largest holder, the input stage, keeps under ``schedule`` (:func:`pipedream.memory.weight_copies`
    at its in-flight count); None for a schedule the memory model lacks."""
    if schedule not in memory.SCHEDULES:
        return None
    return memory.weight_copies(schedule, memory.in_flight(schedule, replicas, 0, microbatches))


def predicted_rows(cluster: Cluster, batches: Sequence[int], models: dict[str, str] | None = None,
                   dataset_batches: int = 20, rerank: int = 3) -> list[dict[str, Any]]:
    """The ``predicted`` rows (module docstring) for the paper's models at ``batches`` on ``cluster``: each schedule at
    the configuration :func:`pipedream.planner.twobw.choose` picks (the cost model's ``rerank`` best, simulated)."""
    from pipedream.models.transformer import config_of
    from pipedream.table2bw.paper import transformer_graph

    rows = []
    for paper_name, name in (models or PREDICTED_MODELS).items():
        graph = transformer_graph(config_of(name, "full"))
        for batch in batches:
            group = []
            for schedule in twobw.available_schedules():
                row: dict[str, Any] = {"scope": "predicted", "model": paper_name, "batch_size": batch,
                                       "schedule": schedule, "paper_depth": PAPER_DEPTH.get(paper_name, "")
                                       if schedule == "2bw" else "", "paper_twobw_speedup": PAPER_SPEEDUP.get(schedule, "")}
                settings = twobw.Settings(batch_size=batch, schedule=schedule)
                try:
                    c, res, _ = twobw.choose(graph, cluster, settings, rerank, dataset_batches)
                except PipeDreamError as e:
                    group.append({**row, "config": f"nothing fits ({e})".split(":")[0], "samples_per_s": math.nan})
                    continue
                group.append({**row, "config": config_text(c), "samples_per_s": 1 / res.time_per_sample_s,
                              "predicted_samples_per_s": c.samples_per_s,
                              "peak_memory_bytes_max_stage": max(c.memory_bytes),
                              "weight_copies": copies(schedule, [c.width] * c.depth, c.width * c.microbatches)})
            rows += _with_speedups(group)
    return rows


def _with_speedups(group: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add ``twobw_speedup`` = 2BW's samples/s over each row's, within one (scope, model, batch) group."""
    ours = next((r["samples_per_s"] for r in group if r["schedule"] == "2bw"), math.nan)
    return [{**r, "twobw_speedup": ours / r["samples_per_s"] if r["samples_per_s"] else math.nan} for r in group]


def read_run(run_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """``(run.json, metrics.json rows)`` of a finished run folder, or None if it has none."""
    run, metrics = run_dir / "run.json", run_dir / "metrics.json"
    if not run.is_file() or not metrics.is_file():
        return None
    return json.loads(run.read_text()), json.loads(metrics.read_text())


def measured_rows(runs_dir: Path, model: str, batch_size: int, workers: int, depth: int, microbatches: int,
                  optimizer: str = "", loss_optimizer: str | None = None
                  ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The ``measured`` rows from ``runs_dir/<schedule>/`` (``workers / depth`` pipelines of ``depth`` stages,
    ``batch_size`` samples per update, in ``microbatches`` microbatches for 2BW, GPipe and PipeDream-Flush; DP on
    every worker) trained with ``optimizer``, then those of ``runs_dir/<schedule>-<loss_optimizer>/`` (the loss
    check's runs), and the per-epoch validation losses of every run."""
    rows, curve = [], []
    for opt, suffix in [(optimizer, "")] + ([(loss_optimizer, f"-{loss_optimizer}")] if loss_optimizer else []):
        group = []
        for schedule in MEASURED_SCHEDULES:
            found = read_run(runs_dir / f"{schedule}{suffix}")
            if found is None:
                continue
            run, epochs = found
            group.append(_measured_row(run, epochs, model, schedule, opt, batch_size, workers, depth, microbatches))
            curve += [{"schedule": schedule, "optimizer": opt, "epoch": e["epoch"], "wall_time_s": e["wall_time_s"],
                       "val_loss": e["val_loss"], "train_loss": e["train_loss"]} for e in epochs]
        dp = next((r["final_val_loss"] for r in group if r["schedule"] == "dp"), math.nan)
        rows += [{**r, "val_loss_vs_dp": r["final_val_loss"] / dp - 1} for r in _with_speedups(group)]
    return rows, curve


def _measured_row(run: dict[str, Any], epochs: list[dict[str, Any]], model: str, schedule: str, optimizer: str,
                  batch_size: int, workers: int, depth: int, microbatches: int) -> dict[str, Any]:
    """One ``measured`` row from a run's ``run.json`` and ``metrics.json`` rows (see :func:`measured_rows`)."""
    peaks = [v for k, v in run.items() if k.startswith("measured_memory_bytes_stage")]
    needs = [v for k, v in run.items() if k.startswith("predicted_memory_bytes_stage")]
    flushed = schedule in ("2bw", "gpipe", "pipedream_flush")
    micro = microbatches if flushed else 1
    width = workers // depth
    replicas = [workers] if schedule == "dp" else [width] * depth
    config = (f"dp x{workers}, {batch_size // workers} each" if schedule == "dp"
              else f"w={width} d={depth} b={batch_size // micro if flushed else batch_size // width}")
    samples = sum(e["train_samples"] for e in epochs)
    seconds = sum(e["epoch_time_s"] for e in epochs)
    ratio = run.get("prediction_ratio")  # measured / predicted epoch time
    return {"scope": "measured", "model": f"{model} (reduced)", "batch_size": batch_size,
            "schedule": schedule, "config": config, "samples_per_s": samples / seconds,
            "predicted_samples_per_s": samples / seconds * ratio if ratio else math.nan,
            "peak_memory_bytes_max_stage": max(peaks) if peaks else math.nan,
            "predicted_memory_bytes_max_stage": max(needs) if needs else math.nan,
            "weight_copies": copies(schedule, replicas, micro), "optimizer": optimizer,
            "final_val_loss": epochs[-1]["val_loss"], "final_val_perplexity": math.exp(epochs[-1]["val_loss"]),
            "paper_depth": "", "paper_twobw_speedup": PAPER_SPEEDUP.get(schedule, "")}


def loss_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One sentence per optimizer of the measured rows: 2BW's final validation loss against DP's (the goal of
    2%; the paper's own GPT figures are perplexity 19.28 vanilla vs 19.56 2BW)."""
    out = []
    for opt in dict.fromkeys(r.get("optimizer") for r in rows if r["scope"] == "measured"):
        by = {r["schedule"]: r for r in rows if r["scope"] == "measured" and r.get("optimizer") == opt}
        if "2bw" in by and "dp" in by:
            gap = by["2bw"]["val_loss_vs_dp"]
            out.append(f"With {opt or 'the config optimizer'}: 2BW's final validation loss "
                       f"{by['2bw']['final_val_loss']:.3f} vs DP's {by['dp']['final_val_loss']:.3f} "
                       f"({gap:+.1%}; {'within' if abs(gap) <= LOSS_GOAL else 'outside'} {LOSS_GOAL:.0%}).")
    return out


def to_markdown(rows: list[dict[str, Any]]) -> str:
    """The table as Markdown, then the paper's facts it is compared with."""
    def cell(k: str, v: Any) -> str:
        if isinstance(v, float):
            if math.isnan(v):
                return ""
            return memory.format_bytes(v) if "memory_bytes" in k else f"{v:.3g}"
        return "" if v is None else str(v)

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(k, r.get(k)) for k in COLUMNS) + " |" for r in rows]
    lines += ["", *loss_lines(rows), ""]
    lines += ["Paper (PipeDream-2BW, ICML 2021; taken from a transcription of its text): planner depth 8 for "
              "GPT-2.2B and 16 for GPT-3.8B; 2BW up to 3.2x faster than GPipe, up to 1.6x faster than PipeDream-Flush "
              f"at small batches and 1.15x at batch 2048; GPT perplexity {PAPER_PERPLEXITY['vanilla']} (vanilla) vs "
              f"{PAPER_PERPLEXITY['2bw']} (2BW).",
              "Predicted rows: FLOP-costed layers on a V100 at an ASSUMED 30% of 125 TFLOP/s "
              "(pipedream/table2bw/paper.py); each schedule at its own best configuration of the 2BW planner's search "
              "under 16 GB; samples_per_s from the event simulator, predicted_samples_per_s from the planner's cost "
              "model. Measured rows: the reduced GPT on 4 CPU processes (experiments/2bw.yaml), 1 Gbps links; "
              "predicted_* is each run's own prediction (simulator with the 2 cores shared, memory model)."]
    return "\n".join(lines) + "\n"


def write(out_dir: Path, rows: list[dict[str, Any]], curve: list[dict[str, Any]], plots: bool = True) -> list[Path]:
    """``table_2bw.{csv,md}``, ``table_2bw_val_loss.csv`` and (with ``plots`` and a curve)
    ``plots/2bw_val_loss.png`` under ``out_dir``; returns the paths written."""
    import pandas as pd

    from pipedream.io import atomic_write_text

    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "table_2bw.csv", out_dir / "table_2bw.md", out_dir / "table_2bw_val_loss.csv"]
    atomic_write_text(written[0], pd.DataFrame(rows, columns=COLUMNS).to_csv(index=False))
    atomic_write_text(written[1], to_markdown(rows))
    atomic_write_text(written[2], pd.DataFrame(curve, columns=["schedule", "optimizer", "epoch", "wall_time_s",
                                                               "val_loss", "train_loss"]).to_csv(index=False))
    if plots and curve:
        written.append(plot_val_loss(curve, out_dir / "plots" / PLOT))
    return written


def plot_val_loss(curve: list[dict[str, Any]], path: Path) -> Path:
    """Validation loss against epoch, one line per (schedule, optimizer): 2BW and DP solid with the first optimizer
    and dotted with the loss check's, the other schedules dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    optimizers = list(dict.fromkeys(r.get("optimizer", "") for r in curve))
    for opt in optimizers:
        for schedule in MEASURED_SCHEDULES:
            pts = [(r["epoch"], r["val_loss"]) for r in curve
                   if r["schedule"] == schedule and r.get("optimizer", "") == opt]
            if pts:
                style = "--" if schedule not in ("2bw", "dp") else "-" if opt == optimizers[0] else ":"
                ax.plot(*zip(*pts, strict=True), marker="o", label=f"{schedule} ({opt})" if opt else schedule,
                        linestyle=style)
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation loss (nats/token)")
    ax.set_title("reduced GPT on Penn Treebank: 2BW vs DP")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
