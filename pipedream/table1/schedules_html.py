"""The report's section of the what-if table of every pipeline schedule (:mod:`pipedream.table1.schedules` writes
the table; this module only reads it, so the report needs none of the planner)."""

from __future__ import annotations

from html import escape
from pathlib import Path

import pandas as pd

CSV_NAME = "schedules_whatif.csv"
NOTE = ("Each schedule's fastest shape (pipelines of depth x width, chunks a rank, microbatches of a size) for Table "
        "1's models and PipeDream-2BW's GPTs, simulated at paper scale; bubble = the idle share of an iteration, the "
        "step's allreduce over the replicas included; peak memory of the busiest GPU walked over its action list "
        "(pipedream.memory.rank_memory); the best that fits in bold. How: docs/schedules.md.")


def section(results: Path) -> str:
    """The report's section: per model and cluster, every schedule's throughput and peak memory per GPU, the best
    in bold (from ``schedules_whatif.csv``; a note where the results have none)."""
    path = results / CSV_NAME
    head = "<h2 id='schedules'>What-if: every pipeline schedule at paper scale</h2>"
    if not path.is_file():
        return head + f"<p class='muted'>No {CSV_NAME} in the results (written by the predicted step).</p>"
    df = pd.read_csv(path)
    cells = ["<table><tr><th>model</th><th>cluster</th><th>schedule</th><th>depth x width</th><th>chunks</th>"
             "<th>microbatches</th><th>samples/s</th><th>bubble</th><th>peak GB/GPU</th></tr>"]
    for _, r in df.iterrows():
        bold = (lambda t: f"<b>{t}</b>") if bool(r["best"]) else (lambda t: t)
        peak = f"{r['peak_gb_per_gpu']:.1f}" + ("" if bool(r["fits"]) else " (over)")
        cells.append("<tr>" + "".join(f"<td>{bold(escape(str(v)))}</td>" for v in (
            r["model"], r["cluster"], r["schedule"], f"{r['depth']} x {r['width']}", r["chunks"],
            f"{r['microbatches']} of {r['microbatch_size']}", f"{r['samples_per_s']:.1f}", f"{r['bubble']:.1%}", peak))
            + "</tr>")
    return head + f"<p>{NOTE}</p>" + "".join(cells) + "</table>"
