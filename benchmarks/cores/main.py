"""The reduced Table 1's runs with a core per worker: issue #18's prediction check on a machine with more cores
than a run has workers (the device machine's 16 cores, a workstation, a cluster node).

The cores this process may use are taken one logical CPU per physical core (``lscpu -p=CPU,CORE,SOCKET``) and
split into groups of the config's ``workers`` (or ``--workers``: 2 puts a core per worker within reach of a
2-core machine, on the config's cluster resized to 2 workers). Each group runs its share of the models one after the other, as
``make run`` does (``pipedream profile``, ``plan``, ``train --mode dp``, ``train --mode pipedream``), every process
pinned to the group's cores with ``taskset``: each run's workers have a core each, and its profile's host probe
and its prediction see those cores (:func:`pipedream.host_timing.host_cores`). The config's settings are the
workflow's (profile, trainings, cluster, emulated link); no time-to-accuracy threshold is set, so no BLEU is
scored after training. Groups run at once and share the machine's memory system and caches: ``--groups 1`` runs
one model at a time on the first group's cores.

Models go to groups longest first, each to the group with the least work (:data:`SECONDS`: profile and both
trainings on the device machine). ``OUT`` is laid out as ``make run``'s results (``profiles/<model>/``,
``plans/<model>.json``, ``runs/<model>/<mode>/``, ``logs/<model>/``); rows go to ``OUT/check.csv`` as runs finish
(``model, mode, cpus, config, measured_epoch_s, predicted_epoch_s, ratio, first_epoch_s, wall_s``), and at the end
``OUT/prediction_check.csv``, ``OUT/compute_check.csv`` and ``OUT/plots/prediction_check.png`` are written as the
report writes them (:func:`pipedream.table1.prediction.write_prediction_check`). ``--tar`` also packs ``OUT``
(without model files and the MLflow database) into one file after every model, for machines that hand back few
files. A model whose group would start it with less than ``--min-left-s`` of ``--deadline-s`` left is skipped.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/cores/main.py [--out results/benchmarks/cores]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # `pipedream` from this checkout, also in a worktree

from pipedream.runtime.config import TrainConfig, flags_from_experiment  # noqa: E402
from pipedream.table1.prediction import summary, write_prediction_check  # noqa: E402

# Wall seconds of each model's profile and two trainings in its group of 4 cores, four groups at once, on the
# device machine (16-core Intel Xeon, 2026-11-27, experiments/ci.yaml): only the order of the work matters
SECONDS = {"awd_lm": 342, "gnmt16": 319, "gnmt8": 261, "resnet50": 180, "s2vt": 172, "vgg16": 161, "alexnet": 108}
HEADER = ["model", "mode", "cpus", "config", "measured_epoch_s", "predicted_epoch_s", "ratio", "first_epoch_s",
          "wall_s"]


def physical_cpus(lscpu: str, allowed: set[int]) -> list[int]:
    """One logical CPU per physical core, in CPU order, among ``allowed``, from the text of
    ``lscpu -p=CPU,CORE,SOCKET`` (``#`` lines are comments; an empty field counts as 0). Empty when lscpu
    printed nothing usable."""
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


def assign(models: list[str], groups: int) -> list[list[str]]:
    """Models to ``groups`` groups, longest first (:data:`SECONDS`; an unknown model counts the median), each to
    the group with the least work so far (the first such group on a tie); each group's list in that order."""
    default = sorted(SECONDS.values())[len(SECONDS) // 2]
    work: list[list[str]] = [[] for _ in range(groups)]
    load = [0] * groups
    for model in sorted(models, key=lambda m: -SECONDS.get(m, default)):
        g = load.index(min(load))
        work[g].append(model)
        load[g] += SECONDS.get(model, default)
    return work


def with_workers(cfg: dict[str, Any], workers: int, out: Path) -> dict[str, Any]:
    """``cfg`` with ``workers`` workers a run on its cluster resized to them: the cluster's one level with
    ``workers`` in place of its own, written with the config's other clusters to ``out/clusters.yaml`` as
    ``<cluster>_w<workers>`` (the plan and the prediction read it as the workflow reads the config's).

    Raises:
        ValueError: fewer than 2 workers, or a cluster of several levels (which level would shrink is not
            the config's to say).
    """
    if workers < 2:
        raise ValueError(f"--workers {workers}: a run needs at least 2 workers")
    source = Path(cfg.get("clusters_file", "experiments/clusters.yaml"))
    clusters = yaml.safe_load((source if source.is_absolute() else ROOT / source).read_text())
    table = clusters["clusters"]
    base = table[cfg["cluster"]]
    if len(base["levels"]) != 1:
        raise ValueError(f"--workers: cluster {cfg['cluster']} has {len(base['levels'])} levels; give a config "
                         "whose cluster has one")
    name = f"{cfg['cluster']}_w{workers}"
    table[name] = {**base, "description": f"{base.get('description', cfg['cluster'])} (resized to {workers} "
                   "workers by benchmarks/cores --workers)", "levels": [{**base["levels"][0], "workers": workers}]}
    out.mkdir(parents=True, exist_ok=True)
    (out / "clusters.yaml").write_text(yaml.safe_dump(clusters, sort_keys=False))
    return {**cfg, "workers": workers, "cluster": name, "clusters_file": str(out / "clusters.yaml")}


def commands(cfg: dict[str, Any], model: str, out: Path, clusters: str) -> list[tuple[str, str]]:
    """``(name, pipedream command line)`` of one model's profile, plan and two trainings, with the workflow's
    settings from the config (workflows/rules: profile.smk, plan.smk, train.smk) in ``make run``'s layout under
    ``out`` (``profiles/<model>``, ``plans/<model>.json``, ``runs/<model>/<mode>``)."""
    mc, prof = cfg["models"][model], cfg["profile"]
    profile, plan = out / "profiles" / model, out / "plans" / f"{model}.json"
    optimizer = mc["train"].get("optimizer", TrainConfig().optimizer)
    host = f"--host-seconds {prof['host_seconds']} " if "host_seconds" in prof else ""
    cmds = [("profile", f"profile --model {model} --preset {mc['preset']} --profiled-batch {prof['batch_size']} "
                        f"--warmup {prof['warmup']} --iters {prof['iters']} --device cpu {host}"
                        f"--optimizers {optimizer} --out-dir {profile}"),
            ("plan", f"plan --profile {profile}/graph.txt --clusters {clusters} --cluster {cfg['cluster']} "
                     f"--model {model} --out {plan}")]
    link = f"--emulate-bandwidth-Bps {cfg['emulate_bandwidth_Bps']} " if cfg.get("emulate_bandwidth_Bps") else ""
    for mode in ("dp", "pipedream"):
        cmds.append((mode, f"train --mode {mode} --model {model} --preset {mc['preset']} --plan {plan} "
                           f"--profile {profile}/graph.txt --clusters {clusters} --workers {cfg['workers']} "
                           f"{flags_from_experiment(mc['train'])} {link}--timeout-s 1800 --experiment cores/{model} "
                           f"--no-progress --out-dir {out}/runs/{model}/{mode}"))
    return cmds


def row(model: str, mode: str, cpus: list[int], run_dir: Path, rc: int, wall_s: float) -> list[Any]:
    """One ``check.csv`` row from ``run_dir/run.json`` (``failed rc=N`` in the config column without one)."""
    try:
        r = json.loads((run_dir / "run.json").read_text())
    except OSError:
        return [model, mode, ",".join(map(str, cpus)), f"failed rc={rc}", "", "", "", "", f"{wall_s:.1f}"]
    return [model, mode, ",".join(map(str, cpus)), r.get("config"), r.get("steady_epoch_time_s"),
            r.get("predicted_epoch_time_s"), r.get("prediction_ratio"), r.get("first_epoch_time_s"), f"{wall_s:.1f}"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--config", type=Path, default=ROOT / "experiments" / "ci.yaml",
                   help="experiment config (default experiments/ci.yaml: make run's models and settings)")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "benchmarks" / "cores",
                   help="results folder, make run's layout (default results/benchmarks/cores)")
    p.add_argument("--tar", type=Path, default=None, help="also pack OUT into this .tar.gz after every model")
    p.add_argument("--models", default="", help="comma-separated models (default: the config's)")
    p.add_argument("--groups", type=int, default=4, help="groups of cores at most (default 4)")
    p.add_argument("--workers", type=int, default=None,
                   help="workers a run (default: the config's); fewer than the config's put a core per worker "
                        "within reach of a small machine (2 on a 2-core one), on the config's cluster with that "
                        "many workers (OUT/clusters.yaml)")
    p.add_argument("--deadline-s", type=float, default=3600.0,
                   help="seconds after which no model starts (default 3600)")
    p.add_argument("--min-left-s", type=float, default=120.0,
                   help="a model starts only with this many seconds of the deadline left (default 120)")
    args = p.parse_args()
    t0 = time.time()
    cfg = yaml.safe_load(args.config.read_text())
    models = args.models.split(",") if args.models else list(cfg["models"])
    unknown = [m for m in models if m not in cfg["models"]]
    if unknown:
        print(f"error: {', '.join(unknown)} not in {args.config}'s models: pick from {', '.join(cfg['models'])}",
              file=sys.stderr)
        return 2
    if args.workers is not None:
        try:
            cfg = with_workers(cfg, args.workers, args.out.resolve())
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    workers = int(cfg["workers"])
    lscpu = subprocess.run(["lscpu", "-p=CPU,CORE,SOCKET"], capture_output=True, text=True).stdout
    cpus = physical_cpus(lscpu, os.sched_getaffinity(0)) or sorted(os.sched_getaffinity(0))
    n = min(args.groups, len(cpus) // workers)
    if n < 1:
        print(f"error: {len(cpus)} physical cores, fewer than the config's {workers} workers: a core per worker "
              f"needs a larger machine (make run shares 2 cores instead)", file=sys.stderr)
        return 2
    groups = [cpus[i * workers:(i + 1) * workers] for i in range(n)]
    out = args.out.resolve()
    clusters = str(cfg.get("clusters_file", "experiments/clusters.yaml"))
    plan = assign(models, n)
    print(f"cores {cpus}; groups {groups}; models {plan}", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / "check.csv"
    with open(csv_path, "w", newline="") as f:
        csv.writer(f).writerow(HEADER)
    env = dict(os.environ, OMP_NUM_THREADS="1", MLFLOW_DISABLE_TELEMETRY="true",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    env.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{out}/mlflow.db")
    env.setdefault("PIPEDREAM_FORCE_GLOO", "1")  # the workers train on the CPU also where there is a GPU
    lock = threading.Lock()

    def run(cmd: str, cpuset: list[int], log: Path) -> int:
        log.parent.mkdir(parents=True, exist_ok=True)
        full = ["taskset", "-c", ",".join(map(str, cpuset)), sys.executable, "-m", "pipedream.cli", *shlex.split(cmd)]
        with open(log, "w") as f:
            f.write(shlex.join(full) + "\n")
            f.flush()
            return subprocess.run(full, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT).returncode

    def group(gi: int) -> None:
        cpuset = groups[gi]
        for model in plan[gi]:
            left = args.deadline_s - (time.time() - t0)
            if left < args.min_left_s:
                print(f"[group {gi}] {model}: skipped, {left:.0f} s left", flush=True)
                continue
            for name, cmd in commands(cfg, model, out, clusters):
                log = out / "logs" / model / f"{name}.log"
                ts = time.time()
                rc = run(cmd, cpuset, log)
                wall = time.time() - ts
                if name in ("profile", "plan"):
                    print(f"[group {gi}] {model} {name}: rc={rc} in {wall:.0f} s", flush=True)
                    if rc:
                        break
                    continue
                r = row(model, name, cpuset, out / "runs" / model / name, rc, wall)
                errors = [line for line in log.read_text().splitlines() if line.startswith("error:")]
                measured, predicted, ratio = (f"{x:.3g}" if isinstance(x, float | int) else "none" for x in r[4:7])
                print(f"[group {gi}] {model} {name}: " + (f"{r[3]}, {errors[-1] if errors else 'see ' + str(log)}"
                      if str(r[3]).startswith("failed") else f"{r[3]} measured {measured} s predicted {predicted} s "
                      f"ratio {ratio}"), flush=True)
                with lock, open(csv_path, "a", newline="") as f:
                    csv.writer(f).writerow(r)
            if args.tar:
                with lock, tarfile.open(args.tar, "w:gz") as tar:
                    tar.add(out, arcname=out.name, filter=lambda ti: None if ti.name.endswith((".pt", ".db")) else ti)

    threads = [threading.Thread(target=group, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    df = write_prediction_check(out, models)
    if df.empty:
        print(f"done in {time.time() - t0:.0f} s: no run finished (logs in {out / 'logs'})", flush=True)
        return 1
    ten, fifteen = summary(df, 0.10), summary(df)
    print(f"done in {time.time() - t0:.0f} s: {ten['runs']} runs predicted, {ten['within']} within 10%, "
          f"{fifteen['within']} within 15%, median |ratio - 1| {100 * ten['median_abs_error']:.1f}% "
          f"({out / 'prediction_check.csv'}, compute_check.csv)", flush=True)
    resim = summary(df, 0.10, "resimulated_ratio")
    if resim["runs"]:
        print(f"resimulated with each stage's compute as measured (a diagnosis, not a prediction): {resim['within']} "
              f"of {resim['runs']} within 10%, {summary(df, column='resimulated_ratio')['within']} within 15%, "
              f"median |ratio - 1| {100 * resim['median_abs_error']:.1f}%", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
