"""How far the profile's host probe moves between profiles of one model, at several probe lengths.

Every prediction takes the probe's copy step (``meta.json`` ``host.copy_step_s``: the compute's scale), its two
copies per core (``host.oversubscribed``) and one per core (``host.contention``) (:mod:`pipedream.host_timing`).
This profiles one model again and again as ``make run`` does (the config's ``profile`` settings and the optimizer
its runs use, :func:`benchmarks.cores.main.profile_command`), cycling through the given ``--host-seconds``, and
prints each figure's spread between the profiles at each length (standard deviation of the logarithm), its range
and the profiles' duration. Run it alone on the host: anything else running moves what it measures.

    .venv/bin/python benchmarks/probe/repeat.py [--model resnet50] [--repeats 5] [--seconds 6 12] [--out DIR]

On the 2-core CI VM (2026-11-30) ``--model resnet50 --repeats 5`` took about 7 minutes (README.md).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # `pipedream` from this checkout, also in a worktree

from benchmarks.cores.main import profile_command, with_host_seconds  # noqa: E402

FIGURES = ("copy_step_s", "oversubscribed", "contention")


def spread(xs: list[float]) -> float:
    """Standard deviation of the logarithms of ``xs`` (about their coefficient of variation); nan for fewer than 2."""
    return statistics.stdev(math.log(x) for x in xs) if len(xs) > 1 else math.nan


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet50", help="a model of the config (default: resnet50)")
    p.add_argument("--repeats", type=int, default=5, help="profiles at each length (default: 5)")
    p.add_argument("--seconds", type=float, nargs="+", default=[6.0, 12.0],
                   help="the probe lengths, --host-seconds, taken in turn (default: 6 12)")
    p.add_argument("--config", default=str(ROOT / "experiments" / "ci.yaml"), help="the workflow config")
    p.add_argument("--out", default="/tmp/probe_repeat", help="where the profiles go (one folder each)")
    args = p.parse_args()
    cfg = yaml.safe_load(Path(args.config).read_text())
    if args.model not in cfg["models"]:
        sys.exit(f"error: no model {args.model!r} in {args.config}; pick one of {', '.join(cfg['models'])}")
    got: dict[float, list[tuple[float, ...]]] = {s: [] for s in args.seconds}
    for i in range(1, args.repeats + 1):
        for seconds in args.seconds:
            folder = Path(args.out) / f"{args.model}_{seconds:g}_{i}"
            cmd = profile_command(with_host_seconds(cfg, seconds), args.model, folder)
            folder.mkdir(parents=True, exist_ok=True)
            start = time.perf_counter()
            with open(folder / "profile.log", "w") as log:
                rc = subprocess.run([sys.executable, "-m", "pipedream.cli", *shlex.split(cmd)], cwd=ROOT,
                                    stdout=log, stderr=subprocess.STDOUT).returncode
            if rc:
                sys.exit(f"error: profiling {args.model} failed (rc={rc}); see {folder / 'profile.log'}")
            host = json.loads((folder / "meta.json").read_text()).get("host", {})
            if any(f not in host for f in FIGURES):
                sys.exit(f"error: {folder / 'meta.json'} has no host probe ({', '.join(FIGURES)}); "
                         "give --seconds above 0")
            row = (time.perf_counter() - start, *(host[f] for f in FIGURES))
            got[seconds].append(row)
            print(f"--host-seconds {seconds:g}: {row[0]:.1f} s, copy step {row[1] * 1e3:.1f} ms, two a core "
                  f"{row[2]:.3f}, one a core {row[3]:.3f}", flush=True)
    for seconds, rows in got.items():
        d, c, o, k = (list(x) for x in zip(*rows, strict=True))
        print(f"--host-seconds {seconds:g}, {len(rows)} profiles of {statistics.fmean(d):.1f} s: spread (sd of log) "
              f"copy step {spread(c):.3f} ({min(c) * 1e3:.1f}-{max(c) * 1e3:.1f} ms), two a core {spread(o):.3f} "
              f"({min(o):.3f}-{max(o):.3f}), one a core {spread(k):.3f}")


if __name__ == "__main__":
    main()
