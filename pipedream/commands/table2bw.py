"""PipeDream-2BW's table: 2BW against GPipe, PipeDream-Flush, 1F1B and DP, measured and predicted.

Writes ``<results>/table_2bw.{csv,md}`` (columns: scope measured|predicted, model, batch, schedule, config,
samples/s, the largest stage's peak memory, weight copies, paper numbers where known),
``<results>/table_2bw_val_loss.csv``, ``<results>/plots/2bw_val_loss.png`` (pipedream/table2bw/table.py) and
``<results>/report_2bw.html`` (pipedream/table2bw/html.py; report.html has the same section when it is built after).
The measured rows come from the runs of ``make run-2bw`` (``<results>/runs_2bw/<model>/<schedule>/``, and
``<schedule>-<optimizer>/`` for the config's ``twobw.loss_check``); the
predicted rows plan and simulate the paper's GPT models from FLOP counts on its cluster::

    pipedream table2bw --config experiments/2bw.yaml              # both scopes, after make run-2bw
    pipedream table2bw --config experiments/2bw.yaml --no-measured
"""

from __future__ import annotations

import argparse

HELP = "write results/table_2bw.{csv,md}: PipeDream-2BW vs GPipe, PipeDream-Flush, 1F1B, DP (measured, predicted)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``pipedream table2bw``."""
    p.add_argument("--config", default="experiments/2bw.yaml",
                   help="experiment config with a twobw: section (a relative path not found here is looked up in the checkout)")
    p.add_argument("--out-dir", default=None, help="where the files go (default: the config's results_dir)")
    p.add_argument("--clusters", default=None, help="clusters file (default: the config's clusters_file)")
    p.add_argument("--no-measured", action="store_true", help="only the predicted rows")
    p.add_argument("--no-predicted", action="store_true", help="only the measured rows")
    p.add_argument("--no-plots", action="store_true", help="skip the validation-loss plot")


def run(args: argparse.Namespace) -> int:
    """Collect the rows, write the files, print the table; returns 0."""
    from pathlib import Path

    from pipedream.errors import PipeDreamError
    from pipedream.experiment import load_config
    from pipedream.io import atomic_write_text
    from pipedream.paths import CLUSTERS
    from pipedream.table2bw import table
    from pipedream.table2bw.html import page
    from pipedream.table2bw.paper import PAPER_BATCHES, PAPER_CLUSTER
    from pipedream.topology import get_cluster

    cfg = load_config(args.config)
    tb = cfg.get("twobw")
    if tb is None:
        raise PipeDreamError(f"{args.config} has no twobw: section; use experiments/2bw.yaml")
    results = Path(args.out_dir or cfg["results_dir"])
    rows, curve = [], []
    if not args.no_measured:
        model = tb["model"]
        batch = cfg["models"][model]["train"]["batch_size"]  # B = b M: M microbatches of b in all pipelines
        rows, curve = table.measured_rows(results / "runs_2bw" / model, model, batch, cfg["workers"], tb["depth"],
                                          batch // tb["microbatch"], cfg["models"][model]["train"].get("optimizer", ""),
                                          tb.get("loss_check", {}).get("optimizer"))
    if not args.no_predicted:
        pred = tb.get("predicted", {})
        cluster = get_cluster(pred.get("cluster", PAPER_CLUSTER), args.clusters or cfg.get("clusters_file", CLUSTERS))
        rows += table.predicted_rows(cluster, pred.get("batches", PAPER_BATCHES))
    written = table.write(results, rows, curve, plots=not args.no_plots)
    atomic_write_text(results / "report_2bw.html", page(results))
    written.append(results / "report_2bw.html")
    print(table.to_markdown(rows))
    print("wrote " + ", ".join(str(p) for p in written))
    return 0
