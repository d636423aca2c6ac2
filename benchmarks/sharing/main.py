"""How well does the simulator share a host's cores? Every run of a ``make run`` resimulated with its compute as
measured, under the fluid model and under per-core run queues, side by side.

A run's resimulation (``resimulated_epoch_time_s`` in ``run.json``, :func:`pipedream.run_prediction.resimulated`)
predicts its epoch again with each stage's forwards and backwards at the CPU the run measured for them, and
everything else as predicted: what is left of the miss is the model of the rest, the way the ranks share the cores
first among it. This re-runs that resimulation for every run of ``--results`` twice: with the fluid model of
:mod:`pipedream.sim.cores` (``n`` computing ranks each get ``cores / n`` of a core: a core never idles while more
ranks compute than there are cores) and with :mod:`pipedream.sim.run_queues` (a run queue per core, a waking rank
on an idle core or its previous one, an idle core taking a queued rank at the next scheduler tick, ``1 /
CONFIG_HZ``; what ``pipedream train`` predicts with since session 38). It prints per run the measured epoch over
each resimulation (1: the model of everything but the compute is exact) and their means over the pipelines and over
the DP runs. Nothing is trained: a minute or so per results folder on the 2-core VM.

Needs a ``make run`` results folder (its runs, plans and profiles; the trainings' command lines come from
``snakemake -n -p`` on ``--config``, as ``benchmarks/repeat`` gets them). Run it on the host the runs ran on: the
resimulation takes this host's cores and tick. Measured numbers: README.md here.

    .venv/bin/python benchmarks/sharing/main.py --results results [--models alexnet resnet50]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # `pipedream` from this checkout, also in a worktree

from pipedream.host_timing import host_cores  # noqa: E402
from pipedream.plan import Plan  # noqa: E402
from pipedream.run_prediction import resimulation_factors  # noqa: E402
from pipedream.runtime.launch import WORKER_THREADS  # noqa: E402
from pipedream.sim.predict import predict_run, training_samples  # noqa: E402
from pipedream.sim.run_queues import scheduler_tick_s  # noqa: E402

MODELS = ("vgg16", "resnet50", "alexnet", "gnmt8", "gnmt16", "awd_lm", "s2vt")


def repeat_module() -> ModuleType:
    """``benchmarks/repeat/main.py``: the workflow's command lines of ``make run``'s trainings."""
    spec = importlib.util.spec_from_file_location("benchmark_repeat", ROOT / "benchmarks" / "repeat" / "main.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def resimulated_ratios(results: Path, model: str, mode: str, argv: list[str],
                       tick_s: float) -> tuple[float, float] | None:
    """``(fluid, queues)``: the run's measured steady epoch over its resimulation with the fluid model and with run
    queues at ``tick_s`` (``argv``: the run's command line, :func:`repeat_argv` of ``benchmarks/repeat``); None for
    a run without the measurements a resimulation takes (a GPU run, no prediction)."""
    from pipedream.cli import build_parser
    from pipedream.commands.train import _config

    run_dir = results / "runs" / model / mode
    run = json.loads((run_dir / "run.json").read_text())
    factors = resimulation_factors(run)
    if factors is None:
        return None
    args = build_parser().parse_args(argv[argv.index("train"):])
    args.profile = Path(str(args.profile).replace("results/", f"{results}/", 1))
    cfg = _config(args)
    plan = Plan.load(next((results / "plans" / model).glob("*.json")))
    stage_factors = json.loads((run_dir / "prediction.json").read_text()).get("stage_factors")
    out = []
    for tick in (None, tick_s):
        pred = predict_run(cfg, mode, plan, Path(args.profile), args.clusters, num_samples=training_samples(cfg),
                           cores=host_cores(), threads=WORKER_THREADS, hosts=args.nnodes,
                           stage_factors=stage_factors, compute_factors=factors, tick_s=tick)
        out.append(run["steady_epoch_time_s"] / pred.epoch_s)
    return out[0], out[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--results", type=Path, default=ROOT / "results", help="a make run results folder (default results)")
    p.add_argument("--config", type=Path, default=ROOT / "experiments" / "ci.yaml",
                   help="the workflow config the runs were made with (default experiments/ci.yaml)")
    p.add_argument("--models", nargs="+", default=list(MODELS), help="models (default: all seven)")
    args = p.parse_args()
    targets = {(m, mode): f"results/runs/{m}/{mode}/run.json" for m in args.models for mode in ("pipedream", "dp")
               if (args.results / "runs" / m / mode / "run.json").is_file()}
    if not targets:
        print(f"error: no runs in {args.results}/runs: run `make run` first", file=sys.stderr)
        return 1
    repeat = repeat_module()
    commands = repeat.workflow_commands(args.config, list(targets.values()))
    tick = scheduler_tick_s()
    print(f"{host_cores()} cores, scheduler tick {tick * 1e3:g} ms; measured epoch over its resimulation")
    print(f"{'model':9s} {'mode':9s} {'fluid':>7s} {'queues':>7s}")
    got: dict[str, list[tuple[float, float]]] = {"pipedream": [], "dp": []}
    for (model, mode), target in targets.items():
        pair = resimulated_ratios(args.results, model, mode, repeat.repeat_argv(commands[target], Path("/nonexistent")),
                                  tick)
        if pair is None:
            print(f"{model:9s} {mode:9s} (not resimulated: no measured compute)")
            continue
        got[mode].append(pair)
        print(f"{model:9s} {mode:9s} {pair[0]:7.3f} {pair[1]:7.3f}", flush=True)
    for mode, pairs in got.items():
        if pairs:
            print(f"mean {mode:9s} {statistics.fmean(a for a, _ in pairs):7.3f} {statistics.fmean(b for _, b in pairs):7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
