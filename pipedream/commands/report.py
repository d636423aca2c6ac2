"""Build Table 1 (paper beside measured) and the plots from the runs of an experiment config."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pipedream import predicted
from pipedream.config import load_config
from pipedream.errors import PipeDreamError
from pipedream.report import write_report, write_speedup

HELP = "write results/table1.{md,csv} and plots from finished runs"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``pipedream report``."""
    p.add_argument("--config", default="experiments/ci.yaml", help="experiment config (YAML)")
    p.add_argument("--predicted", action="store_true",
                   help="write the predicted Table 1 (V100 profiles, planner, simulator) instead; see pipedream/predicted.py")
    p.add_argument("--speedup", metavar="MODEL", help="only write MODEL's measured speedup JSON to --out")
    p.add_argument("--out", help="output file of --speedup, e.g. results/speedup/vgg16.json")
    predicted.add_arguments(p)


def run(args: argparse.Namespace) -> int:
    """Write the report and print the table; returns 0."""
    if args.predicted:
        print(predicted.run(args).to_string(index=False))
        return 0
    cfg = load_config(args.config)
    if args.speedup:
        if args.speedup not in cfg["models"]:
            raise PipeDreamError(f"model {args.speedup!r} is not in {args.config}; known: {', '.join(cfg['models'])}")
        if not args.out:
            raise PipeDreamError("--speedup needs --out FILE")
        print(json.dumps(write_speedup(args.speedup, cfg, Path(args.out)), indent=2))
        return 0
    df = write_report(cfg)
    print(df.to_string(index=False))
    return 0
