"""Build Table 1 (paper beside measured) and the plots from the runs of an experiment config."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pipedream.paths import CI_CONFIG, CLUSTERS, PAPER_TABLE

HELP = "write results/table1.{md,csv} and plots from finished runs"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``pipedream report``."""
    p.add_argument("--config", default=CI_CONFIG,
                   help="experiment config (YAML; a relative path not found here is looked up in the checkout)")
    p.add_argument("--predicted", action="store_true",
                   help="write the predicted Table 1 (V100 profiles, planner, simulator) instead "
                        "(pipedream/table1/predicted.py)")
    p.add_argument("--speedup", metavar="MODEL", help="only write MODEL's measured speedup JSON to --out")
    p.add_argument("--out", help="output file of --speedup, e.g. results/speedup/vgg16.json")
    g = p.add_argument_group("predicted Table 1 (with --predicted)")
    g.add_argument("--out-dir", default="results", help="where table1_predicted.{csv,md} and plots/ go")
    g.add_argument("--cluster", default=None,
                   help="what-if: a cluster name or string like '8x8:25e9,12.5e9' (innermost first, bytes/s)")
    g.add_argument("--clusters", default=CLUSTERS, help="clusters file (looked up in the checkout if not found here)")
    g.add_argument("--paper-table", default=PAPER_TABLE,
                   help="the paper's Table 1 as CSV (looked up in the checkout if not found here)")
    g.add_argument("--profiles-dir", default="results/profiles", help="user profiles (<dir>/<model>/graph.txt)")
    g.add_argument("--plans-dir", default=None, help="reuse <dir>/<model>/<cluster>.json plans when present")
    g.add_argument("--models", nargs="+", default=None, help="only these models")
    g.add_argument("--no-plots", action="store_true", help="skip the plots")
    g.add_argument("--jobs", type=int, default=1,
                   help="processes that predict the table's rows in parallel (default 1; the table is the same)")
    g.add_argument("--schedules", action="store_true",
                   help="also the what-if of every pipeline schedule at paper scale, schedules_whatif.{csv,md} "
                        "(docs/schedules.md): the --models of Table 1, or every model and PipeDream-2BW's GPTs")


def run(args: argparse.Namespace) -> int:
    """Write the report and print the table; returns 0."""
    from pipedream.errors import PipeDreamError
    from pipedream.experiment import load_config
    from pipedream.paths import shipped

    if args.predicted:
        from pipedream.table1.predicted_files import write

        df = write(Path(args.out_dir), shipped(args.clusters), shipped(args.paper_table), Path(args.profiles_dir),
                   Path(args.plans_dir) if args.plans_dir else None, args.models, args.cluster, not args.no_plots,
                   max(1, args.jobs))
        print(df.to_string(index=False))
        if args.schedules and not args.cluster:
            from pipedream.table1 import schedules

            chosen = tuple(m for m in args.models if m in schedules.TABLE1_MODELS) if args.models else (
                schedules.TABLE1_MODELS + schedules.GPT_MODELS)
            if chosen:
                schedules.write(Path(args.out_dir), shipped(args.clusters), chosen, jobs=max(1, args.jobs))
        return 0
    from pipedream.table1.measured import write_speedup

    cfg = load_config(args.config)
    if args.speedup:  # one model's two runs: without the report's imports (pandas, the models: seconds of start-up)
        if args.speedup not in cfg["models"]:
            raise PipeDreamError(f"model {args.speedup!r} is not in {args.config}; known: {', '.join(cfg['models'])}")
        if not args.out:
            raise PipeDreamError("--speedup needs --out FILE")
        print(json.dumps(write_speedup(args.speedup, cfg, Path(args.out)), indent=2))
        return 0
    from pipedream.table1.table import write_report

    df = write_report(cfg, args.config)
    print(df.to_string(index=False))
    return 0
