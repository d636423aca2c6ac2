"""How long does a ``pipedream train`` run's prediction take? Every run of a ``make run`` predicted again as
``pipedream train`` predicts it, with a short epoch simulated after one look for the steady state (as it is) and
after the simulator's full steady-state search (as before), side by side.
:func:`pipedream.sim.simulate.simulate_stages` looks for the steady state by
doubling its runs of minibatches until two successive periods agree (:func:`pipedream.sim.simulate._steady_state`),
then simulates an epoch no longer than its last run exactly. An epoch of at most
:data:`pipedream.sim.simulate.EXACT_EPOCH_MINIBATCHES` minibatches needs that search only for the steady-state
figures, so a prediction (``steady_figures=False``) now gives it one look (runs of n0, 2 n0, 3 n0) and, unsettled,
simulates it exactly. With the
search, the reduced GNMT-8's straight pipeline (64 minibatches an epoch) ran to 480 minibatches in 47 of the
prediction's 65 simulations (the mean and the layouts' draws, :mod:`pipedream.sim.layout`) and to 2,560 in the other
18, which tick-balanced run queues (:mod:`pipedream.sim.run_queues`) kept from settling. This times
:func:`pipedream.sim.predict.predict_run` for every run of ``--results`` (its profile, plan, stage factors from its
``prediction.json``, this host's cores and tick) both ways, and prints both predicted epochs (equal up to the
search's extrapolation where it settled before the epoch), both times and their ratio. Nothing is trained; the
search takes minutes per pipeline on the 2-core VM (``--models``). Needs a ``make run`` results folder (the
trainings' command lines come from ``snakemake -n -p`` on ``--config``, as ``benchmarks/repeat`` gets them).
Measured numbers: README.md here.

    .venv/bin/python benchmarks/prediction_time/main.py --results results [--models gnmt8 alexnet]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # `pipedream` from this checkout, also in a worktree

from benchmarks.sharing import main as sharing  # noqa: E402  (its models and make run's command lines)
from pipedream.host_timing import host_cores  # noqa: E402
from pipedream.plan import Plan  # noqa: E402
from pipedream.runtime.launch import WORKER_THREADS  # noqa: E402
from pipedream.sim import simulate  # noqa: E402
from pipedream.sim.predict import predict_run, training_samples  # noqa: E402
from pipedream.sim.run_queues import scheduler_tick_s  # noqa: E402


def timed_predictions(results: Path, model: str, mode: str, argv: list[str]) -> list[tuple[float, float]]:
    """``[(epoch s, seconds to predict it)]``, a short epoch after one look and then after the full search,
    for the run of ``model`` in ``mode`` whose command line is ``argv`` (:func:`repeat_argv` of
    ``benchmarks/repeat``)."""
    from pipedream.cli import build_parser
    from pipedream.commands.train import _config

    run_dir = results / "runs" / model / mode
    args = build_parser().parse_args(argv[argv.index("train"):])
    args.profile = Path(str(args.profile).replace("results/", f"{results}/", 1))
    cfg = _config(args)
    plan = Plan.load(next((results / "plans" / model).glob("*.json")))
    stage_factors = json.loads((run_dir / "prediction.json").read_text()).get("stage_factors")
    samples = training_samples(cfg)
    limit = simulate.EXACT_EPOCH_MINIBATCHES
    out = []
    for exact in (limit, 0):  # as is; every epoch searched
        simulate.EXACT_EPOCH_MINIBATCHES = exact
        try:
            t0 = time.perf_counter()
            pred = predict_run(cfg, mode, plan, Path(args.profile), args.clusters, num_samples=samples,
                               cores=host_cores(), threads=WORKER_THREADS, hosts=args.nnodes,
                               stage_factors=stage_factors, tick_s=scheduler_tick_s())
            out.append((pred.epoch_s, time.perf_counter() - t0))
        finally:
            simulate.EXACT_EPOCH_MINIBATCHES = limit
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--results", type=Path, default=ROOT / "results", help="a make run results folder (default results)")
    p.add_argument("--config", type=Path, default=ROOT / "experiments" / "ci.yaml",
                   help="the workflow config the runs were made with (default experiments/ci.yaml)")
    p.add_argument("--models", nargs="+", default=list(sharing.MODELS), help="models (default: all seven)")
    args = p.parse_args()
    targets = {(m, mode): f"results/runs/{m}/{mode}/run.json" for m in args.models for mode in ("pipedream", "dp")
               if (args.results / "runs" / m / mode / "prediction.json").is_file()}
    if not targets:
        print(f"error: no runs with a prediction in {args.results}/runs: run `make run` first", file=sys.stderr)
        return 1
    repeat = sharing.repeat_module()
    commands = repeat.workflow_commands(args.config, list(targets.values()))
    print(f"{host_cores()} cores; the prediction after one look (now) and after the full search (before)")
    print(f"{'model':9s} {'mode':9s} {'epoch now':>10s} {'before':>10s} {'s now':>7s} {'s before':>9s} {'ratio':>6s}")
    total = [0.0, 0.0]
    for (model, mode), target in targets.items():
        (e_now, s_now), (e_old, s_old) = timed_predictions(args.results, model, mode,
                                                           repeat.repeat_argv(commands[target], Path("/nonexistent")))
        total[0] += s_now
        total[1] += s_old
        print(f"{model:9s} {mode:9s} {e_now:10.4f} {e_old:10.4f} {s_now:7.1f} {s_old:9.1f} {s_old / s_now:6.1f}",
              flush=True)
    print(f"{'all':19s} {'':21s} {total[0]:7.1f} {total[1]:9.1f} {total[1] / total[0]:6.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
