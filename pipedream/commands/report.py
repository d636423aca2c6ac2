"""Build Table 1 (paper beside measured) and the plots from the runs of an experiment config."""

from __future__ import annotations

import argparse

from pipedream import predicted
from pipedream.config import load_config
from pipedream.report import write_report

HELP = "write results/table1.{md,csv} and plots from finished runs"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``pipedream report``."""
    p.add_argument("--config", default="experiments/ci.yaml", help="experiment config (YAML)")
    p.add_argument("--predicted", action="store_true",
                   help="write the predicted Table 1 (V100 profiles, planner, simulator) instead; see pipedream/predicted.py")
    predicted.add_arguments(p)


def run(args: argparse.Namespace) -> int:
    """Write the report and print the table; returns 0."""
    if args.predicted:
        print(predicted.run(args).to_string(index=False))
        return 0
    cfg = load_config(args.config)
    df = write_report(cfg)
    print(df.to_string(index=False))
    return 0
