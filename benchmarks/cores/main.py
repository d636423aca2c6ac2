"""The reduced Table 1's runs with a core per worker: issue #18's prediction check on a machine with more cores
than a run has workers (the device machine's 16 cores, a workstation, a cluster node).

The cores this process may use are taken one logical CPU per physical core (``lscpu -p=CPU,CORE,SOCKET``) and
split into groups of the config's ``workers`` (or ``--workers``: 2 puts a core per worker within reach of a
2-core machine, on the config's cluster resized to 2 workers). Each group runs its share of the models one after the other, as
``make run`` does (``pipedream profile``, ``plan``, ``train --mode dp``, ``train --mode pipedream``), every process
pinned to the group's cores with ``taskset``: each run's workers have a core each, and its profile's host probe
and its prediction see those cores (:func:`pipedream.host_timing.host_cores`). The config's settings are the
workflow's (profile, trainings, cluster, emulated link); no time-to-accuracy threshold is set, so no BLEU is
scored after training. By default one model runs at a time, on the first group's cores, as ``make run`` runs one
job at a time: a core's speed depends on how many of the machine's cores are busy (on the device machine one copy
of AlexNet's step alone took 16.8 ms of CPU, four at once on four cores 21.3 ms, sixteen on sixteen 24.3 ms:
``benchmarks/host``), which a profile measures only for its own copies. ``--groups N`` runs N groups at once (up to N
times faster), each group's profile then taken and its runs trained beside whatever the others do at the time
(session 35: four groups at once, then two of the models again alone on profiles from the crowded machine, 0.75-0.96
of their predictions; experiments/prediction_log.md).

Models go to groups longest first, each to the group with the least work (:data:`SECONDS`: profile and both
trainings on the device machine). ``OUT`` is laid out as ``make run``'s results (``profiles/<model>/``,
``plans/<model>.json``, ``runs/<model>/<mode>/``, ``logs/<model>/``); rows go to ``OUT/check.csv`` as runs finish
(``model, mode, cpus, config, measured_epoch_s, predicted_epoch_s, ratio, first_epoch_s, wall_s, repeat``), and at
the end ``OUT/prediction_check.csv``, ``OUT/compute_check.csv`` and ``OUT/plots/prediction_check.png`` are written as
the report writes them (:func:`pipedream.table1.prediction.write_prediction_check`). ``--tar`` also packs ``OUT``
(without model files and the MLflow database) into one file after every model, for machines that hand back few
files. A model whose group would start it with less than ``--min-left-s`` of ``--deadline-s`` left is skipped.

``--repeats N`` trains each model's two runs N times, one after the other, on the same profile and plan (repeat
``k > 1`` in ``OUT/repeat<k>``, with its own prediction check), and prints the median ``|a / b - 1|`` between
repeats of the same run: how far the host moves a run from itself. ``--reuse DIR`` takes the profiles and plans
of an earlier ``OUT`` (an unpacked ``--tar`` too) and runs only the trainings. On a machine without MLflow set
``PIPEDREAM_TRACKING=off`` (:func:`pipedream.tracking.tracking_enabled`); ``device_kit.py`` beside this file packs
what the lent device machine lacks.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/cores/main.py [--out results/benchmarks/cores]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import shutil
import statistics
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

# Wall seconds of each model's profile, plan and two trainings in its group of 4 cores, four groups at once, on
# the device machine (16-core Intel Xeon, 2026-11-29, experiments/ci.yaml): only the order of the work matters
SECONDS = {"gnmt16": 270, "awd_lm": 245, "gnmt8": 215, "resnet50": 154, "s2vt": 147, "vgg16": 132, "alexnet": 109}
HEADER = ["model", "mode", "cpus", "config", "measured_epoch_s", "predicted_epoch_s", "ratio", "first_epoch_s",
          "wall_s", "repeat"]


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


def with_host_seconds(cfg: dict[str, Any], seconds: float) -> dict[str, Any]:
    """``cfg`` with its profile's host probe at ``seconds`` per copy count (``pipedream profile --host-seconds``)."""
    return {**cfg, "profile": {**cfg["profile"], "host_seconds": seconds}}


def profile_command(cfg: dict[str, Any], model: str, profile: Path, oversubscribed: bool = True) -> str:
    """The ``pipedream profile`` command line (without ``pipedream``) of ``model`` into ``profile``, with the
    workflow's settings from the config (workflows/rules/profile.smk): its batch, warm-up, iterations and host probe
    seconds, timing the optimizer the model's runs use (TrainConfig's default where unset); with
    ``oversubscribed`` False, ``--no-host-oversubscribed`` (no two copies per core)."""
    mc, prof = cfg["models"][model], cfg["profile"]
    optimizer = mc["train"].get("optimizer", TrainConfig().optimizer)
    host = f"--host-seconds {prof['host_seconds']} " if "host_seconds" in prof else ""
    return (f"profile --model {model} --preset {mc['preset']} --profiled-batch {prof['batch_size']} "
            f"--warmup {prof['warmup']} --iters {prof['iters']} --device cpu {host}"
            f"{'' if oversubscribed else '--no-host-oversubscribed '}--optimizers {optimizer} --out-dir {profile}")


def commands(cfg: dict[str, Any], model: str, out: Path, clusters: str, runs: Path | None = None) -> list[tuple[str, str]]:
    """``(name, pipedream command line)`` of one model's profile, plan and two trainings, with the workflow's
    settings from the config (workflows/rules: profile.smk, plan.smk, train.smk; the profile without two copies per
    core, ``--no-host-oversubscribed``, which no run with a core per worker takes) in ``make run``'s layout under
    ``out`` (``profiles/<model>``, ``plans/<model>.json``, ``runs/<model>/<mode>``; the trainings under
    ``<runs>/runs/<model>/<mode>`` where ``runs`` is given, :func:`repeat_dir`)."""
    mc = cfg["models"][model]
    profile, plan = out / "profiles" / model, out / "plans" / f"{model}.json"
    # every run here has a core per worker: two copies per core (host.oversubscribed) would enter no prediction
    cmds = [("profile", profile_command(cfg, model, profile, oversubscribed=False)),
            ("plan", f"plan --profile {profile}/graph.txt --clusters {clusters} --cluster {cfg['cluster']} "
                     f"--model {model} --out {plan}")]
    link = f"--emulate-bandwidth-Bps {cfg['emulate_bandwidth_Bps']} " if cfg.get("emulate_bandwidth_Bps") else ""
    for mode in ("dp", "pipedream"):
        cmds.append((mode, f"train --mode {mode} --model {model} --preset {mc['preset']} --plan {plan} "
                           f"--profile {profile}/graph.txt --clusters {clusters} --workers {cfg['workers']} "
                           f"{flags_from_experiment(mc['train'])} {link}--timeout-s 1800 --experiment cores/{model} "
                           f"--no-progress --out-dir {runs or out}/runs/{model}/{mode}"))
    return cmds


def row(model: str, mode: str, cpus: list[int], run_dir: Path, rc: int, wall_s: float, repeat: int = 1) -> list[Any]:
    """One ``check.csv`` row from ``run_dir/run.json`` (``failed rc=N`` in the config column without one)."""
    try:
        r = json.loads((run_dir / "run.json").read_text())
    except OSError:
        return [model, mode, ",".join(map(str, cpus)), f"failed rc={rc}", "", "", "", "", f"{wall_s:.1f}", repeat]
    return [model, mode, ",".join(map(str, cpus)), r.get("config"), r.get("steady_epoch_time_s"),
            r.get("predicted_epoch_time_s"), r.get("prediction_ratio"), r.get("first_epoch_time_s"), f"{wall_s:.1f}",
            repeat]


def repeat_dir(out: Path, repeat: int) -> Path:
    """Where repeat ``repeat`` (1-based) of the trainings writes ``runs/<model>/<mode>``: ``out`` for the first,
    ``out/repeat<k>`` for the others."""
    return out if repeat == 1 else out / f"repeat{repeat}"


def reuse(source: Path, out: Path, models: list[str]) -> None:
    """Copy each model's profile (``profiles/<model>/``) and plan (``plans/<model>.json``) of an earlier ``OUT``
    (``source``) into ``out``, so that only the trainings run again, on the same predictions' inputs.

    Raises:
        ValueError: ``source`` lacks a model's profile or plan.
    """
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


def self_agreement(rows: list[list[Any]]) -> float | None:
    """Median over every pair of repeats of the same run (model and mode) of ``|a / b - 1|`` of their measured
    epochs (``check.csv`` rows): what an exact prediction of one repeat would score against another; None without
    a pair."""
    epochs: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if isinstance(r[4], float | int):
            epochs.setdefault((r[0], r[1]), []).append(float(r[4]))
    pairs = [abs(a / b - 1) for xs in epochs.values() for i, a in enumerate(xs) for b in xs[i + 1:]]
    return statistics.median(pairs) if pairs else None


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
    p.add_argument("--groups", type=int, default=1,
                   help="groups of cores running at once (default 1: one model at a time; more share the machine "
                        "with each other, module docstring)")
    p.add_argument("--host-seconds", type=float, default=None,
                   help="the profile's host probe per copy count, s (default: the config's profile.host_seconds): "
                        "shorter where machine time is short (the probe is most of a profile)")
    p.add_argument("--workers", type=int, default=None,
                   help="workers a run (default: the config's); fewer than the config's put a core per worker "
                        "within reach of a small machine (2 on a 2-core one), on the config's cluster with that "
                        "many workers (OUT/clusters.yaml)")
    p.add_argument("--reuse", type=Path, default=None,
                   help="an earlier OUT whose profiles and plans to train on again (no profile, no plan)")
    p.add_argument("--repeats", type=int, default=1,
                   help="trainings of each model, one after the other (default 1); repeat k>1 writes to OUT/repeat<k>")
    p.add_argument("--deadline-s", type=float, default=3600.0,
                   help="seconds after which no model starts (default 3600)")
    p.add_argument("--min-left-s", type=float, default=120.0,
                   help="a model starts only with this many seconds of the deadline left (default 120)")
    args = p.parse_args()
    t0 = time.time()
    cfg = yaml.safe_load(args.config.read_text())
    if args.host_seconds is not None:
        cfg = with_host_seconds(cfg, args.host_seconds)
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
    if args.repeats < 1:
        print(f"error: --repeats {args.repeats}: give 1 or more", file=sys.stderr)
        return 2
    if args.reuse is not None:
        try:
            reuse(args.reuse, args.out, models)
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

    rows: list[list[Any]] = []

    def step(gi: int, model: str, name: str, cmd: str, repeat: int) -> bool:
        """Run one command of ``model`` on group ``gi``'s cores; a training's row goes to check.csv. False when
        a profile or plan failed."""
        cpuset = groups[gi]
        log = out / "logs" / model / (f"{name}.log" if repeat == 1 else f"{name}-r{repeat}.log")
        ts = time.time()
        rc = run(cmd, cpuset, log)
        wall = time.time() - ts
        if name in ("profile", "plan"):
            print(f"[group {gi}] {model} {name}: rc={rc} in {wall:.0f} s", flush=True)
            return rc == 0
        r = row(model, name, cpuset, repeat_dir(out, repeat) / "runs" / model / name, rc, wall, repeat)
        errors = [line for line in log.read_text().splitlines() if line.startswith("error:")]
        measured, predicted, ratio = (f"{x:.3g}" if isinstance(x, float | int) else "none" for x in r[4:7])
        again = f" (repeat {repeat})" if args.repeats > 1 else ""
        print(f"[group {gi}] {model} {name}{again}: " + (f"{r[3]}, {errors[-1] if errors else 'see ' + str(log)}"
              if str(r[3]).startswith("failed") else f"{r[3]} measured {measured} s predicted {predicted} s "
              f"ratio {ratio}"), flush=True)
        with lock, open(csv_path, "a", newline="") as f:
            csv.writer(f).writerow(r)
            rows.append(r)
        return True

    def group(gi: int) -> None:
        for model in plan[gi]:
            cmds = commands(cfg, model, out, clusters)
            for repeat in range(1, args.repeats + 1):
                left = args.deadline_s - (time.time() - t0)
                if left < args.min_left_s:
                    print(f"[group {gi}] {model}: skipped{'' if repeat == 1 else f' from repeat {repeat}'}, "
                          f"{left:.0f} s left", flush=True)
                    break
                if repeat == 1 and args.reuse is None and not all(step(gi, model, n, c, 1) for n, c in cmds[:2]):
                    break
                for name, cmd in commands(cfg, model, out, clusters, repeat_dir(out, repeat))[2:]:
                    step(gi, model, name, cmd, repeat)
            if args.tar:
                with lock, tarfile.open(args.tar, "w:gz") as tar:
                    tar.add(out, arcname=out.name, filter=lambda ti: None if ti.name.endswith((".pt", ".db")) else ti)

    threads = [threading.Thread(target=group, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    finished = 0
    for repeat in range(1, args.repeats + 1):
        where = repeat_dir(out, repeat)
        if not (where / "runs").is_dir():  # every run of this repeat skipped at the deadline
            continue
        df = write_prediction_check(where, models)
        if df.empty:
            continue
        finished += 1
        ten, fifteen = summary(df, 0.10), summary(df)
        again = f"repeat {repeat}: " if args.repeats > 1 else ""
        print(f"{again}{ten['runs']} runs predicted, {ten['within']} within 10%, {fifteen['within']} within 15%, "
              f"median |ratio - 1| {100 * ten['median_abs_error']:.1f}% ({where / 'prediction_check.csv'}, "
              f"compute_check.csv)", flush=True)
        resim = summary(df, 0.10, "resimulated_ratio")
        if resim["runs"]:
            print(f"  resimulated with each stage's compute as measured (a diagnosis, not a prediction): "
                  f"{resim['within']} of {resim['runs']} within 10%, "
                  f"{summary(df, column='resimulated_ratio')['within']} within 15%, "
                  f"median |ratio - 1| {100 * resim['median_abs_error']:.1f}%", flush=True)
    agreement = self_agreement(rows)
    if agreement is not None:
        print(f"the same run against itself (every pair of repeats): median |a / b - 1| {100 * agreement:.1f}%",
              flush=True)
    print(f"done in {time.time() - t0:.0f} s" + ("" if finished else f": no run finished (logs in {out / 'logs'})"),
          flush=True)
    return 0 if finished else 1


if __name__ == "__main__":
    sys.exit(main())
