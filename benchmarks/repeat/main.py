"""How far `make run`'s trainings move when they are run again: issue #18's prediction check against the runs' own
repeatability on the same host.

Every training of ``make run`` logs its measured epoch beside the simulator's prediction (``prediction_ratio``;
``results/prediction_check.csv``). The prediction depends only on the run's profile, plan, cluster and the host's
cores, so it is the same every time the same run is started again; the measured epoch is not. Here each of
``make run``'s trainings runs ``--repeats`` more times with the workflow's own command line (``snakemake -n -p``
prints it; ``--threshold`` is left out, so no model is scored for time-to-accuracy after training) against the same
profile and plan, in ``make run``'s order, one repeat of all the trainings after the other so that a run's
repeats lie minutes apart. ``make run``'s own run is repeat 0.

Printed per run: each repeat's measured epoch and ``measured / predicted``, and the coefficient of variation of the
measured epochs. Then per repeat what the goal of issue #18 asks (runs within 15%, the median
``|ratio - 1|``), and what an exact prediction of one repeat would have scored against another: over every pair of
repeats of a run, the median ``|a / b - 1|`` and the share of pairs within 15%. Where the repeats of one run
disagree with each other as much as with the prediction, the check cannot tell the model from the host; a run whose
repeats all miss on the same side is the model's.

Rows go to ``OUT/repeat.csv`` (``model, mode, config, repeat, measured_epoch_s, predicted_epoch_s, ratio,
first_epoch_s, wall_s``) as runs finish; runs under ``OUT/runs/<model>/<mode>/<repeat>/``, MLflow in
``OUT/mlflow.db``. Needs a finished ``make run`` (its profiles, plans and runs). Do not start anything else on the
host meanwhile: it is what is measured.

    .venv/bin/python benchmarks/repeat/main.py [--repeats 2] [--models vgg16,gnmt8] [--out results/benchmarks/repeat]
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
HEADER = ["model", "mode", "config", "repeat", "measured_epoch_s", "predicted_epoch_s", "ratio", "first_epoch_s",
          "wall_s"]
MODES = ("pipedream", "dp")


def workflow_commands(config: Path, targets: list[str]) -> dict[str, str]:
    """The workflow's shell command of each ``run.json`` target (``snakemake -n -p -f``: a dry run forcing
    them, nothing executed), keyed by target. Raises RuntimeError when snakemake prints none for one."""
    snakemake = Path(sys.executable).with_name("snakemake")
    done = subprocess.run([str(snakemake), "--cores", "1", "--configfile", str(config), "-n", "-p", "-f", *targets],
                          capture_output=True, text=True, cwd=ROOT)
    text = done.stdout + done.stderr
    found = {}
    for line in text.splitlines():
        if "Shell command:" in line and " train --mode " in line:
            cmd = line.split("Shell command:", 1)[1].strip()
            for t in targets:
                if f"$(dirname {t})" in cmd:
                    found[t] = cmd
    missing = [t for t in targets if t not in found]
    if missing:
        raise RuntimeError(f"snakemake printed no train command for {', '.join(missing)}: {text.strip()[-300:]}")
    return found


def repeat_argv(cmd: str, out_dir: Path) -> list[str]:
    """``cmd`` (the workflow's shell line, ``--out-dir`` and the log's redirection last) as an argv with
    ``--out-dir out_dir``, ``--threshold`` and ``--threshold-metric`` left out (no scoring after training).

    >>> repeat_argv("python3 -m pipedream.cli train --mode dp --threshold 5 --threshold-metric top1 "
    ...             "--out-dir $(dirname r/run.json) > log 2>&1", Path("/o"))
    ['python3', '-m', 'pipedream.cli', 'train', '--mode', 'dp', '--out-dir', '/o']
    """
    argv, skip = [], False
    for w in shlex.split(cmd.split(" --out-dir ", 1)[0]):
        if skip:
            skip = False
        elif w in ("--threshold", "--threshold-metric"):
            skip = True
        else:
            argv.append(w)
    return [*argv, "--out-dir", str(out_dir)]


def row(model: str, mode: str, repeat: int, run_dir: Path, wall_s: float | None) -> list[Any] | None:
    """One ``repeat.csv`` row from ``run_dir/run.json``; None without one (a failed run) or without a measured and
    predicted epoch (a run whose prediction failed: its tag ``prediction_error`` says why)."""
    try:
        r = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return None
    if not all(isinstance(r.get(k), int | float) for k in ("steady_epoch_time_s", "predicted_epoch_time_s",
                                                              "prediction_ratio")):
        return None
    return [model, mode, r.get("config"), repeat, r.get("steady_epoch_time_s"), r.get("predicted_epoch_time_s"),
            r.get("prediction_ratio"), r.get("first_epoch_time_s"), "" if wall_s is None else f"{wall_s:.1f}"]


def pair_errors(measured: list[float]) -> list[float]:
    """``|a / b - 1|`` over every ordered pair of distinct repeats: what an exact prediction of repeat ``b`` scores
    against repeat ``a``.

    >>> [round(e, 3) for e in pair_errors([1.0, 1.2])]
    [0.167, 0.2]
    """
    return [abs(a / b - 1) for a, b in itertools.permutations(measured, 2)]


def report(rows: list[list[Any]]) -> str:
    """The printed summary of ``repeat.csv``'s rows (module docstring)."""
    runs: dict[tuple[str, str], list[list[Any]]] = {}
    for r in rows:
        runs.setdefault((r[0], r[1]), []).append(r)
    lines, pairs = [], []
    for (model, mode), rs in runs.items():
        rs.sort(key=lambda r: r[3])
        measured = [float(r[4]) for r in rs]
        pairs += pair_errors(measured)
        spread = statistics.pstdev(measured) / statistics.fmean(measured) if len(measured) > 1 else float("nan")
        lines.append(f"{model:9s} {mode:9s} {str(rs[0][2]):9s} predicted {float(rs[0][5]):6.2f} s; measured "
                     + ", ".join(f"{m:.2f} ({float(r[6]):.2f})" for m, r in zip(measured, rs, strict=True))
                     + f"; cv {spread:.3f}")
    for k in sorted({r[3] for r in rows}):
        ratios = [float(r[6]) for r in rows if r[3] == k]
        errors = [abs(x - 1) for x in ratios]
        lines.append(f"repeat {k}: {len(ratios)} runs, {sum(e <= 0.15 for e in errors)} within 15%, "
                     f"{sum(e <= 0.10 for e in errors)} within 10%, median |ratio - 1| {statistics.median(errors):.1%}")
    if pairs:
        lines.append(f"repeat against repeat of the same run ({len(pairs)} ordered pairs): median |a / b - 1| "
                     f"{statistics.median(pairs):.1%}, {sum(e <= 0.15 for e in pairs) / len(pairs):.0%} within 15%")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--config", type=Path, default=ROOT / "experiments" / "ci.yaml",
                   help="the experiment config make run used (default experiments/ci.yaml)")
    p.add_argument("--repeats", type=int, default=2, help="runs of every training besides make run's (default 2)")
    p.add_argument("--models", default="", help="comma-separated models (default: the config's)")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "benchmarks" / "repeat",
                   help="results folder (default results/benchmarks/repeat)")
    args = p.parse_args(argv)
    cfg = yaml.safe_load(args.config.read_text())
    results = Path(cfg["results_dir"])
    models = args.models.split(",") if args.models else list(cfg["models"])
    if unknown := [m for m in models if m not in cfg["models"]]:
        p.error(f"--models: {', '.join(unknown)} not in {args.config}'s models ({', '.join(cfg['models'])})")
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    targets = {(m, mode): f"{results}/runs/{m}/{mode}/run.json" for m in models for mode in MODES}
    absent = [t for t in targets.values() if not (ROOT / t).is_file()]
    if absent:
        print(f"error: {absent[0]} (and {len(absent) - 1} more) missing: run `make run` first", file=sys.stderr)
        return 2
    try:
        cmds = workflow_commands(args.config, list(targets.values()))
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    rows = [r for (m, mode), t in targets.items() if (r := row(m, mode, 0, (ROOT / t).parent, None))]
    with open(out / "repeat.csv", "w", newline="") as f:
        csv.writer(f).writerows([HEADER, *rows])
    env = dict(os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{out}/mlflow.db", MLFLOW_DISABLE_TELEMETRY="true")
    for k in range(1, args.repeats + 1):
        for (m, mode), t in targets.items():
            run_dir = out / "runs" / m / mode / str(k)
            run_dir.mkdir(parents=True, exist_ok=True)
            t0 = time.time()
            with open(run_dir / "train.log", "w") as log:
                rc = subprocess.run(repeat_argv(cmds[t], run_dir), stdout=log, stderr=subprocess.STDOUT, env=env,
                                    cwd=ROOT).returncode
            r = row(m, mode, k, run_dir, time.time() - t0)
            if r is None:
                print(f"repeat {k} {m} {mode}: rc={rc}, no measured and predicted epoch, see {run_dir / 'train.log'}",
                      flush=True)
                continue
            print(f"repeat {k} {m} {mode}: measured {float(r[4]):.2f} s, predicted {float(r[5]):.2f} s, "
                  f"ratio {float(r[6]):.2f}", flush=True)
            rows.append(r)
            with open(out / "repeat.csv", "a", newline="") as f:
                csv.writer(f).writerow(r)
    print(report(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
