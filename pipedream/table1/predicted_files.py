"""The predicted tables as files: ``<stem>.csv`` and ``<stem>.md`` (Table 1 predicted, what-if tables), with
an explanation of every row more than 15% off the paper (:mod:`pipedream.table1.explain`) and the calibration
summary of :mod:`pipedream.table1.calibration`, and their plots; :func:`write` is the whole predicted step
(``pipedream report --predicted``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from pipedream.errors import PipeDreamError
from pipedream.io import atomic_write_text
from pipedream.placement import replica_ranks
from pipedream.planner.fixed_split import split_for_replicas
from pipedream.sim import SimOptions, simulate_stages
from pipedream.sim.network import Network
from pipedream.table1 import plots as P
from pipedream.table1.calibration import markdown_section, within_counts
from pipedream.table1.explain import THRESHOLD, calibrated, explain
from pipedream.table1.predicted import NO_PROFILE, V100_SCALE_KEY, build_tables, find_profile
from pipedream.table1.table import to_markdown
from pipedream.table1.whatif import H100_PROFILES, slug, whatif_h100, whatif_table
from pipedream.topology import get_cluster

MD_COLUMNS = {"row": "row", "predicted_config": "predicted config", "predicted_speedup": "predicted speedup",
              "paper_config": "paper config", "paper_speedup": "paper speedup", "rel_error": "rel. error",
              "loo_fraction": "DP fraction of line rate (LOO)", "loo_predicted_speedup": "calibrated (LOO)",
              "loo_rel_error": "rel. error (LOO)",
              "paper_config_predicted_speedup": "paper config, predicted", "paper_config_rel_error": "rel. error (paper config)",
              "paper_config_speedup_if_dp_not_overlapped": "paper config, DP not overlapped",
              "planner_estimate_speedup": "planner estimate", "dp_cost_model_speedup": "DP cost model alone",
              "release_warmup_speedup": "ours, release warm-up", "independent_replicas_speedup": "ours, independent replicas",
              "simulator_best_config": "best simulated", "simulator_best_speedup": "its speedup",
              "dp_comm_stall_fraction": "DP comm stall", "pipedream_steady_bubble": "PipeDream bubble",
              "pipedream_p2p_bytes_per_sample": "PipeDream act. bytes/sample", "dp_bytes_per_sample": "DP weight bytes/sample"}


def mismatch_explanations(df: pd.DataFrame, clusters_path: Path) -> list[list[str]]:
    """Per row of a predicted Table 1: why its prediction, at line rate or calibrated leave-one-out, is more than
    15% off the paper (:func:`pipedream.table1.explain.explain`, :func:`pipedream.table1.explain.calibrated`), or
    why it has none; an empty list where both are within 15%."""
    out: list[list[str]] = []
    for _, r in df.iterrows():
        if r["predicted_config"] == NO_PROFILE:
            out.append([f"{NO_PROFILE} — {r['profile']}; not predicted."])
            continue
        cluster = get_cluster(r["cluster"], clusters_path)
        why = explain(r, cluster) if "rel_error" in r and abs(r["rel_error"]) > THRESHOLD else []
        loo = calibrated(r, cluster)
        out.append(why + ([loo] if loo else []))
    return out


def write_predicted(df: pd.DataFrame, out_dir: Path, clusters_path: Path, stem: str = "table1_predicted",
                    title: str = "Table 1, predicted at paper scale (simulated) beside the paper",
                    calibration: pd.DataFrame | None = None) -> None:
    """``<stem>.csv`` and ``<stem>.md`` (table, assumptions, an explanation of every mismatch > 15%), and with a
    ``calibration`` summary (:func:`build_tables`) ``table1_calibration.csv`` and a section of the markdown.

    Beside the paper, the CSV gets a column ``explanation``: the same sentences as the markdown's
    mismatch notes, as a JSON list per row (``[]`` where the row is within 15%).
    """
    compared = "paper_speedup" in df.columns  # else a what-if table: nothing to compare with
    lines = mismatch_explanations(df, clusters_path) if compared else []
    csv = df.assign(explanation=[json.dumps(x) for x in lines]) if compared else df
    atomic_write_text(out_dir / f"{stem}.csv", csv.to_csv(index=False))
    cols = [c for c in MD_COLUMNS if c in df.columns]
    md = to_markdown(df[cols].rename(columns=MD_COLUMNS), title, [
        "speedup = DP epoch time / PipeDream epoch time, both simulated (pipedream.sim) on the row's cluster "
        "from the release's V100 profiles; rel. error = predicted / paper - 1; 'best simulated' = the fastest of our "
        "planner's config, the paper's config and DP.",
        "DP baseline = the paper's PyTorch 1.1 DistributedDataParallel: NCCL 2.4 flat ring allreduce (every NIC carries "
        "2(n-1)/n of the gradients) overlapped with the backward layer by layer (wait-free backpropagation), at line "
        "rate. PipeDream = our runtime's 1F1B-RR (consistent warm-up) on our planner's plan (simulator-re-ranked, so "
        "'planner estimate' is its simulation; 'DP cost model alone' is what the dynamic program estimated for its own "
        "choice), replicated stages synchronised the same way in lockstep; collectives and activation transfers share "
        "links without queueing behind each other; 'paper config' = the paper's configuration split by "
        "pipedream.planner.fixed_split.",
        "Bytes/sample: activations and their gradients between stages (PipeDream) vs weight-gradient allreduce (DP).",
        f"{NO_PROFILE}: the row's profile is neither the release's V100 profile nor marked in its meta.json as brought "
        f"to V100 scale ({V100_SCALE_KEY}); a reduced model's CPU profile says nothing about the paper's V100 run, so "
        "the row has no predicted number and is left out of the counts.",
    ])
    if not compared:
        atomic_write_text(out_dir / f"{stem}.md", md)
        return
    notes = []
    if calibration is not None:
        atomic_write_text(out_dir / "table1_calibration.csv", calibration.to_csv(index=False))
        notes += markdown_section(calibration, within_counts(df))
    notes += ["", f"## Mismatches above {THRESHOLD:.0%}", ""]
    for (_, r), why in zip(df.iterrows(), lines, strict=True):
        if r["predicted_config"] == NO_PROFILE:
            notes.append(f"- **{r['row']}**: {why[0]}")
        elif why:
            loo = r.get("loo_rel_error", math.nan)
            notes.append(f"- **{r['row']}** (predicted {r['predicted_speedup']:.2f}x vs paper {r['paper_speedup']:.2f}x, "
                         f"{r['rel_error']:+.0%}" + ("" if math.isnan(loo) else
                                                     f"; calibrated {r['loo_predicted_speedup']:.2f}x, {loo:+.0%}") + "):")
            notes += [f"  - {line}" for line in why]
    atomic_write_text(out_dir / f"{stem}.md", md + "\n".join(notes) + "\n")


def write(out_dir: Path, clusters_path: Path, paper_table: Path, profiles_dir: Path, plans_dir: Path | None = None,
          models: list[str] | None = None, cluster_name: str | None = None, plots: bool = True,
          jobs: int = 1) -> pd.DataFrame:
    """Write the predicted Table 1 (or, with ``cluster_name``, the what-if table of that cluster) and its
    plots under ``out_dir``; returns the table. ``jobs``: processes predicting the table's rows
    (:func:`pipedream.table1.predicted.build_tables`).

    Raises:
        PipeDreamError: an unknown cluster or model, a missing profile or paper table.
    """
    if cluster_name:
        cluster = get_cluster(cluster_name, clusters_path)
        df = whatif_table(cluster, profiles_dir, plans_dir, models)
        stem = f"whatif_{slug(cluster.name)}"
        write_predicted(df, out_dir, clusters_path, stem, f"What-if: predicted PipeDream vs DP on {cluster.describe()}")
        if plots:
            P.dp_stall_bars(df, out_dir / "plots" / f"{stem}_dp_comm_stall.png")
        return df
    df, summary = build_tables(paper_table, clusters_path, profiles_dir, plans_dir, models, jobs)
    write_predicted(df, out_dir, clusters_path, calibration=summary)
    if plots:
        have = df[df["predicted_config"] != NO_PROFILE]
        P.predicted_speedup_bars(have, out_dir / "plots" / "table1_predicted_speedup.png")
        P.dp_stall_bars(have, out_dir / "plots" / "dp_comm_stall.png")
        timeline_panels(out_dir / "plots" / "timeline_gnmt8_A_1x4.png", clusters_path)
    if not models and H100_PROFILES.is_dir():
        write_whatif_h100(out_dir, clusters_path, plots)
    return df


def write_whatif_h100(out_dir: Path, clusters_path: Path, plots: bool = True) -> pd.DataFrame:
    """``whatif_h100.{csv,md}`` and ``plots/whatif_h100_speedup.png`` under ``out_dir``; returns the table."""
    df = whatif_h100(clusters_path)
    write_predicted(df, out_dir, clusters_path, "whatif_h100",
                    "What-if at today's hardware: H100 profiles, predicted PipeDream vs DP (simulated)")
    if plots:
        P.whatif_speedup_bars(df, out_dir / "plots" / "whatif_h100_speedup.png",
                              "H100 profiles: simulated speedup of the default plan over data parallelism")
    return df


def timeline_panels(out: Path, clusters_path: Path, model: str = "gnmt8", cluster_name: str = "A_1x4",
                    microbatches: int = 4) -> None:
    """Gantt chart of the first minibatches of one plan under PipeDream, GPipe, 2BW, PipeDream-Flush and DP."""
    cluster = get_cluster(cluster_name, clusters_path)
    prof = find_profile(model, Path("results/profiles"))
    if prof is None:
        raise PipeDreamError(f"no profile for {model}; cannot draw the timeline")
    reps = [1] * cluster.workers
    stages = split_for_replicas(prof.graph, reps, Network(cluster), prof.batch)
    ranks = replica_ranks(reps, cluster)
    panels = []
    for sched, label in (("1f1b", "PipeDream 1F1B"), ("gpipe", f"GPipe, {microbatches} microbatches"),
                         ("2bw", f"PipeDream-2BW, {microbatches} microbatches"),
                         ("pipedream_flush", f"PipeDream-Flush, {microbatches} microbatches"), ("dp", "data parallelism")):
        nodes = [list(prof.graph.nodes)] if sched == "dp" else stages
        rk = [list(range(cluster.workers))] if sched == "dp" else ranks
        options = SimOptions(schedule=sched, microbatches=microbatches, keep_trace=True)
        res = simulate_stages(prof.graph, nodes, rk, cluster, options)
        assert res.trace is not None
        panels.append((f"{label}: {model} on {cluster_name} ({res.config}), bubble {res.steady_bubble_fraction:.0%}", res.trace))
    P.gantt(panels, out, cluster.workers)
