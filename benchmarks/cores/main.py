"""The simulator against measured runs at a core per worker: each run's measured epoch beside the epoch the
simulator predicted for it before it started. The goal: every run within 10%.

For each model of the config this runs what ``make run`` runs, with its settings and the workflow's flags
(``pipedream profile``, ``plan``, ``train --mode dp``, ``train --mode pipedream``; no time-to-accuracy threshold),
every process pinned with ``taskset`` to ``--workers`` CPUs, one per physical core, on the config's cluster resized
to that many workers (``OUT/clusters.yaml``). ``OUT`` is laid out as ``make run``'s results (``profiles/<model>/``,
``plans/<model>.json``, ``runs/<model>/<mode>/``, ``logs/<model>/``); at the end ``prediction_check.csv``,
``compute_check.csv`` and ``plots/prediction_check.png`` are written there as the report writes them.

``--repeats N`` trains each model's two runs N times on the same profile and plan (repeat k > 1 in
``OUT/repeat<k>``) and prints the median ``|a / b - 1|`` between repeats of a run: the noise floor, the closest
any prediction can come. ``--reuse DIR`` trains on an earlier ``OUT``'s profiles and plans. Without MLflow, set
``PIPEDREAM_TRACKING=off``.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/cores/main.py [--models alexnet,vgg16] [--workers 2]
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # `pipedream` from this checkout, also in a worktree

from pipedream.runtime.config import TrainConfig, flags_from_experiment  # noqa: E402
from pipedream.table1.prediction import summary, write_prediction_check  # noqa: E402

GOAL = 0.10  # every run's |measured / predicted - 1| at most this


def physical_cpus(lscpu: str, allowed: set[int]) -> list[int]:
    """One logical CPU per physical core, in CPU order, among ``allowed``, from the text of
    ``lscpu -p=CPU,CORE,SOCKET`` (``#`` lines are comments; an empty field counts as 0)."""
    seen: set[tuple[int, int]] = set()
    cpus = []
    for line in lscpu.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        cpu, core, socket = (int(x or 0) for x in line.split(",")[:3])
        if cpu in allowed and (core, socket) not in seen:
            seen.add((core, socket))
            cpus.append(cpu)
    return cpus


def with_workers(cfg: dict[str, Any], workers: int, out: Path) -> dict[str, Any]:
    """``cfg`` with its one-level cluster resized to ``workers`` workers, written beside the config's other clusters
    to ``out/clusters.yaml`` as ``<cluster>_w<workers>`` (``cfg`` itself where it has ``workers``); a ValueError for
    fewer than 2 workers or a cluster of several levels."""
    if workers < 2:
        raise ValueError(f"--workers {workers}: a run needs at least 2 workers")
    if workers == cfg["workers"]:
        return cfg
    source = Path(cfg.get("clusters_file", "experiments/clusters.yaml"))
    clusters = yaml.safe_load((source if source.is_absolute() else ROOT / source).read_text())
    base = clusters["clusters"][cfg["cluster"]]
    if len(base["levels"]) != 1:
        raise ValueError(f"--workers: cluster {cfg['cluster']} has {len(base['levels'])} levels; give a config "
                         "whose cluster has one")
    name = f"{cfg['cluster']}_w{workers}"
    clusters["clusters"][name] = {**base, "description": f"{base.get('description', cfg['cluster'])} (resized to "
                                  f"{workers} workers by benchmarks/cores)",
                                  "levels": [{**base["levels"][0], "workers": workers}]}
    out.mkdir(parents=True, exist_ok=True)
    (out / "clusters.yaml").write_text(yaml.safe_dump(clusters, sort_keys=False))
    return {**cfg, "workers": workers, "cluster": name, "clusters_file": str(out / "clusters.yaml")}


def commands(cfg: dict[str, Any], model: str, out: Path, runs: Path | None = None) -> list[tuple[str, str]]:
    """``(name, arguments of pipedream)`` of one model's profile, plan, DP run and pipeline run, as the workflow
    builds them (workflows/rules/*.smk) but on the CPU and without a threshold, in ``make run``'s layout under
    ``out``; the trainings write under ``runs`` (default ``out``: :func:`repeat_dir`)."""
    mc, prof = cfg["models"][model], cfg["profile"]
    optimizer = mc["train"].get("optimizer", TrainConfig().optimizer)
    clusters = cfg.get("clusters_file", "experiments/clusters.yaml")
    profile, plan = out / "profiles" / model, out / "plans" / f"{model}.json"
    extra = [f"--data {cfg['data']}"] if cfg.get("data") and "data" not in mc["train"] else []
    if cfg.get("emulate_bandwidth_Bps"):
        extra.append(f"--emulate-bandwidth-Bps {cfg['emulate_bandwidth_Bps']}")
    extra.append(f"--timeout-s {mc['train']['epochs'] * cfg.get('train_epoch_timeout_s', 1800) + 600:g}")
    cmds = [("profile", f"profile --model {model} --preset {mc['preset']} --profiled-batch {prof['batch_size']} "
                        f"--warmup {prof['warmup']} --iters {prof['iters']} --device cpu --optimizers {optimizer} "
                        f"--out-dir {profile}"),
            ("plan", f"plan --profile {profile}/graph.txt --clusters {clusters} --cluster {cfg['cluster']} "
                     f"--model {model} --optimizer {optimizer} --out {plan}")]
    for mode in ("dp", "pipedream"):
        cmds.append((mode, f"train --mode {mode} --model {model} --preset {mc['preset']} --plan {plan} "
                           f"--profile {profile}/graph.txt --clusters {clusters} --workers {cfg['workers']} "
                           f"{flags_from_experiment(mc['train'])} {' '.join(extra)} --experiment cores/{model} "
                           f"--no-progress --out-dir {runs or out}/runs/{model}/{mode}"))
    return cmds


def repeat_dir(out: Path, repeat: int) -> Path:
    """Where repeat ``repeat`` (1-based) writes ``runs/``: ``out``, then ``out/repeat<k>``."""
    return out if repeat == 1 else out / f"repeat{repeat}"


def reuse(source: Path, out: Path, models: list[str]) -> None:
    """Copy each model's profile and plan of an earlier ``OUT`` (``source``) into ``out``; a ValueError where
    ``source`` lacks one."""
    missing = [str(p) for m in models for p in (source / "profiles" / m / "graph.txt", source / "plans" / f"{m}.json")
               if not p.is_file()]
    if missing:
        raise ValueError(f"--reuse {source}: no {', '.join(missing)}; give the folder of an earlier run of this script")
    if source.resolve() == out.resolve():
        return
    for m in models:
        shutil.copytree(source / "profiles" / m, out / "profiles" / m, dirs_exist_ok=True)
        (out / "plans").mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / "plans" / f"{m}.json", out / "plans" / f"{m}.json")


def repeat_noise(epochs: dict[tuple[str, str], list[float]]) -> float | None:
    """Median over every pair of repeats of the same run, earlier ``a`` and later ``b``, of ``|a / b - 1|`` of their
    measured epochs (``(model, mode)``: epochs in repeat order; NaN entries, failed runs, skipped); None without a
    pair."""
    pairs = []
    for runs in epochs.values():
        xs = [x for x in runs if not math.isnan(x)]
        pairs += [abs(a / b - 1) for i, a in enumerate(xs) for b in xs[i + 1:]]
    return statistics.median(pairs) if pairs else None


def table(df: pd.DataFrame) -> str:
    """The prediction check's rows (:func:`pipedream.table1.prediction.prediction_rows`) as a text table, and how
    many runs are within :data:`GOAL` of their prediction."""
    lines = [f"{'model':<10} {'mode':<10} {'config':<12} {'measured s':>10} {'predicted s':>11} {'ratio':>6}"]
    lines += [f"{r.model:<10} {r.mode:<10} {r.config:<12} {r.measured_epoch_s:10.2f} {r.predicted_epoch_s:11.2f} "
              f"{r.ratio:6.3f}" for r in df.itertuples()]
    s = summary(df, GOAL)
    return "\n".join([*lines, f"{s['within']} of {s['runs']} within {GOAL:.0%}, median |ratio - 1| "
                               f"{s['median_abs_error']:.1%}"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--config", type=Path, default=ROOT / "experiments" / "ci.yaml",
                   help="experiment config (default experiments/ci.yaml: make run's models and settings)")
    p.add_argument("--models", default="", help="comma-separated models (default: all of the config's)")
    p.add_argument("--workers", type=int, default=2,
                   help="workers a run, each pinned to a physical core of its own (default 2)")
    p.add_argument("--repeats", type=int, default=1,
                   help="trainings of each model on the same profile and plan (default 1); more print the noise floor")
    p.add_argument("--reuse", type=Path, default=None, help="an earlier OUT whose profiles and plans to train on")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "benchmarks" / "cores",
                   help="results folder, make run's layout (default results/benchmarks/cores)")
    args = p.parse_args()
    t0, out = time.time(), args.out.resolve()
    cfg = yaml.safe_load(args.config.read_text())
    models = args.models.split(",") if args.models else list(cfg["models"])
    lscpu = subprocess.run(["lscpu", "-p=CPU,CORE,SOCKET"], capture_output=True, text=True).stdout
    cpus = physical_cpus(lscpu, os.sched_getaffinity(0)) or sorted(os.sched_getaffinity(0))
    try:
        if unknown := [m for m in models if m not in cfg["models"]]:
            raise ValueError(f"{', '.join(unknown)} not in {args.config}: pick from {', '.join(cfg['models'])}")
        if args.repeats < 1:
            raise ValueError(f"--repeats {args.repeats}: give 1 or more")
        if len(cpus) < args.workers:
            raise ValueError(f"{len(cpus)} physical cores, fewer than --workers {args.workers}")
        cfg = with_workers(cfg, args.workers, out)
        if args.reuse is not None:
            reuse(args.reuse, out, models)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    cpuset = ",".join(map(str, cpus[:args.workers]))
    env = dict(os.environ, OMP_NUM_THREADS="1", MLFLOW_DISABLE_TELEMETRY="true",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    env.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{out}/mlflow.db")
    env.setdefault("PIPEDREAM_FORCE_GLOO", "1")  # the workers train on the CPU also where there is a GPU
    print(f"{len(models)} models, {args.workers} workers a run on CPUs {cpuset}", flush=True)

    def run(model: str, name: str, cmd: str, repeat: int) -> int:
        log = out / "logs" / model / (f"{name}.log" if repeat == 1 else f"{name}-r{repeat}.log")
        log.parent.mkdir(parents=True, exist_ok=True)
        argv = ["taskset", "-c", cpuset, sys.executable, "-m", "pipedream.cli", *shlex.split(cmd)]
        ts = time.time()
        log.write_text(shlex.join(argv) + "\n")
        with open(log, "a") as f:
            rc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT).returncode
        print(f"{model} {name}{f' (repeat {repeat})' if repeat > 1 else ''}: "
              f"{'ok' if rc == 0 else f'failed rc={rc}, see {log}'} in {time.time() - ts:.0f} s", flush=True)
        return rc

    for model in models:
        if args.reuse is None and any(run(model, n, c, 1) for n, c in commands(cfg, model, out)[:2]):
            continue  # no profile or plan: no runs
        for repeat in range(1, args.repeats + 1):
            for name, cmd in commands(cfg, model, out, repeat_dir(out, repeat))[2:]:
                run(model, name, cmd, repeat)

    epochs: dict[tuple[str, str], list[float]] = {}
    for repeat in range(1, args.repeats + 1):
        if (repeat_dir(out, repeat) / "runs").is_dir():  # else no run of this repeat started
            df = write_prediction_check(repeat_dir(out, repeat), models)
            print(f"\n{repeat_dir(out, repeat)}:\n{table(df)}")
            for r in df.itertuples():
                epochs.setdefault((r.model, r.mode), []).append(r.measured_epoch_s)
    noise = repeat_noise(epochs)
    if noise is not None:
        print(f"noise floor (the same run against its repeats): median |a / b - 1| {noise:.1%}")
    print(f"done in {time.time() - t0:.0f} s", flush=True)
    return 0 if epochs else 1


if __name__ == "__main__":
    sys.exit(main())
