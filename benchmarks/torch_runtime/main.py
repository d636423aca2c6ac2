"""torch.distributed.pipelining runs our plans: measured against predicted, schedule by schedule.

Usage (from the repository root, nothing else running: each of the 2 ranks wants a core of its own):

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python benchmarks/torch_runtime/main.py
    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python benchmarks/torch_runtime/main.py --models vgg16 --repeats 1

For each model (the reduced GPT, the reduced VGG-16 and torchvision's ResNet-18 as a user's model,
``benchmarks.torch_runtime.main:resnet18``), on 2 ranks of a 2-worker cluster (``--cluster``, 1 GB/s links like
``cpu4``):

1. ``pipedream profile`` at the microbatch size the runs train at (``--batch-size / --microbatches``), so no layer
   time is scaled from another batch size (CPU kernels are not linear in it);
2. per schedule (torch's seven), the plan of ``pipedream.planner.schedule_search`` at depth 2 and ``--microbatches``
   microbatches (our balanced cut points), and its predicted iteration: ``pipedream train``'s own prediction
   (:func:`pipedream.run_prediction.predict_run`: the simulator on the profile, with the host's cores) of the epoch,
   over its minibatches;
3. training with ``pipedream.train(..., runtime="torch")`` under torchrun, as ``pipedream train`` runs it: 2 epochs of
   ``--minibatches`` minibatches; the measured iteration is the second epoch's time over its minibatches (the first
   pays the start-up), the median of ``--repeats`` runs taken in rounds (each configuration once a round, so a slow
   spell of the host falls on all alike);
4. our runtime's PipeDream-Flush against torch's ``Schedule1F1B`` on the same plan (the pipedream_flush one), in the
   same rounds.

Printed per model: predicted and measured iteration and their ratio per schedule; Kendall's tau between the ranking
by prediction and by measurement (``scipy.stats.kendalltau``) and the measured time of the predicted best over the
measured best; ours over torch's 1F1B. Then, on ``--uneven`` (VGG-16: its convolutions and its classifier differ by
far per layer), our chosen plan (the schedule of the least prediction, our cut points) and our cut points with
``Schedule1F1B`` against an equal split of layers with ``Schedule1F1B`` (``partitioner="equal"``), all on torch's
runtime. The spread of the repeats (half the range over the median: the run-to-run floor of this host) is printed
beside every measured number. ``--out`` writes every number as JSON. The defaults take about 25 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from pipedream.graph import LayerGraph, profiled_batch, read_meta  # noqa: E402
from pipedream.plan import Plan  # noqa: E402
from pipedream.runtime.config import TORCH_SCHEDULES, TrainConfig  # noqa: E402

MODELS = {"gpt": "gpt", "vgg16": "vgg16", "resnet18": "benchmarks.torch_runtime.main:resnet18"}


def resnet18() -> Any:
    """torchvision's ResNet-18 for 10 classes: a user's model, captured and trained on Fashion-MNIST (32 x 32 x 3)."""
    import torchvision

    model = torchvision.models.resnet18(num_classes=10)
    for m in model.modules():
        if hasattr(m, "inplace"):
            m.inplace = False
    return model


@dataclass(frozen=True)
class Setup:
    """What every run of the benchmark shares."""

    batch_size: int
    microbatches: int
    minibatches: int
    repeats: int
    cluster: str
    out_dir: Path


def profile(model: str, setup: Setup) -> Path:
    """``pipedream profile`` of ``model`` at the microbatch size (kept in ``out_dir``; a second call reuses it)."""
    out = setup.out_dir / "profiles" / model
    if not (out / "graph.txt").is_file():
        subprocess.run([sys.executable, "-m", "pipedream.cli", "profile", "--model", MODELS[model], "--profiled-batch",
                        str(setup.batch_size // setup.microbatches), "--optimizers", "adam", "--iters", "10",
                        "--out-dir", str(out)], check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return out / "graph.txt"


def plan_for(model: str, path: Path, schedule: str, setup: Setup, partitioner: str = "balanced") -> Plan:
    """The plan of ``schedule`` at depth 2 and ``setup.microbatches`` microbatches (our cut points or ``partitioner``)."""
    from pipedream.planner.schedule_choice import to_plan
    from pipedream.planner.schedule_search import SearchSettings, search
    from pipedream.sim.profiled import step_rates
    from pipedream.topology import get_cluster

    graph = LayerGraph.read(path)
    graph.minibatch_size = profiled_batch(path)
    cluster = get_cluster(setup.cluster)
    settings = SearchSettings(batch_size=setup.batch_size, schedules=(schedule,), depths=(2,),
                              microbatches=setup.microbatches, step=step_rates(read_meta(path), "adam"),
                              partitioner=partitioner)
    return to_plan(search(graph, cluster, settings), graph, cluster, settings, model=MODELS[model])


def config(model: str, setup: Setup, runtime: str, schedule: str, name: str) -> TrainConfig:
    return TrainConfig(model=MODELS[model], runtime=runtime, schedule=schedule, microbatches=setup.microbatches,
                       epochs=2, batch_size=setup.batch_size, train_subset=setup.batch_size * setup.minibatches,
                       val_subset=setup.batch_size, optimizer="adam", lr=3e-4, weight_decay=0.0, progress=False,
                       measure_memory=False, out_dir=str(setup.out_dir / "runs" / model / name))


def predicted_s(cfg: TrainConfig, plan: Plan, path: Path, setup: Setup) -> float:
    """``pipedream train``'s predicted seconds of one minibatch (its predicted epoch over its minibatches)."""
    from pipedream.run_prediction import predict_run, run_host

    pred = predict_run(cfg, "pipedream", plan, path, "experiments/clusters.yaml",
                       num_samples=setup.batch_size * setup.minibatches, host=run_host(plan.workers, 1))
    return pred.epoch_s / setup.minibatches


def measured_once(cfg: TrainConfig, plan: Plan, setup: Setup) -> float:
    """The second epoch's seconds per minibatch of one run under torchrun."""
    from pipedream import api

    rows = api.train(cfg.model, plan, None, cfg, launcher="torchrun", timeout_s=900)
    return float(rows[-1]["epoch_time_s"]) / setup.minibatches


def measured_s(runs: dict[str, tuple[TrainConfig, Plan]], setup: Setup) -> dict[str, list[float]]:
    """Every run of ``runs`` ``setup.repeats`` times, in rounds (each round runs each once), so that a slow spell of
    the host falls on every configuration alike."""
    out: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(setup.repeats):
        for name, (cfg, plan) in runs.items():
            out[name].append(measured_once(cfg, plan, setup))
    return out


def _spread(values: list[float]) -> str:
    return f"±{(max(values) - min(values)) / 2 / statistics.median(values):.0%}" if len(values) > 1 else ""


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e3:.1f}ms {_spread(values)}".strip()


def bench_model(model: str, setup: Setup, schedules: tuple[str, ...]) -> dict[str, Any]:
    """Every schedule of ``model`` on torch's runtime and our PipeDream-Flush on the pipedream_flush plan: predicted
    and measured seconds per minibatch, Kendall's tau, the predicted best against the measured best, ours over
    torch's 1F1B."""
    from scipy.stats import kendalltau

    path = profile(model, setup)
    plans = {s: plan_for(model, path, s, setup) for s in (*schedules, "pipedream_flush")}
    runs = {s: (config(model, setup, "torch", s, s), plans[s]) for s in schedules}
    runs["ours"] = (config(model, setup, "pipedream", "pipedream_flush", "ours_pipedream_flush"), plans["pipedream_flush"])
    if "pipedream_flush" not in runs:
        runs["pipedream_flush"] = (config(model, setup, "torch", "pipedream_flush", "pipedream_flush"),
                                   plans["pipedream_flush"])
    predicted = {s: predicted_s(runs[s][0], plans[s], path, setup) for s in schedules}
    measured = measured_s(runs, setup)
    print(f"\n{model}: {setup.batch_size} samples a minibatch in {setup.microbatches} microbatches, 2 ranks "
          f"({setup.cluster})\n{'schedule':<17} {'predicted':>10} {'measured':>16} {'ratio':>6}")
    for s in schedules:
        print(f"{s:<17} {predicted[s] * 1e3:>8.1f}ms {_ms(measured[s]):>16} "
              f"{statistics.median(measured[s]) / predicted[s]:>6.2f}")
    names = list(schedules)
    pred = [predicted[s] for s in names]
    meas = [statistics.median(measured[s]) for s in names]
    tau = float(kendalltau(pred, meas).statistic) if len(names) > 1 else float("nan")
    best_pred = names[pred.index(min(pred))]
    regret = statistics.median(measured[best_pred]) / min(meas)
    speed = statistics.median(measured["pipedream_flush"]) / statistics.median(measured["ours"])
    print(f"Kendall tau {tau:.2f}; predicted best {best_pred}: {regret:.3f}x the measured best "
          f"({names[meas.index(min(meas))]}); ours (PipeDream-Flush) {_ms(measured['ours'])} against torch's "
          f"Schedule1F1B {_ms(measured['pipedream_flush'])}: {speed:.2f}x")
    rows = {s: {"predicted_s": predicted[s], "measured_s": measured[s], "cut": [len(st.nodes) for st in plans[s].stages]}
            for s in schedules}
    return {"schedules": rows, "kendall_tau": tau, "predicted_best": best_pred, "predicted_best_over_measured_best":
            regret, "ours_pipedream_flush_s": measured["ours"], "torch_1f1b_s": measured["pipedream_flush"],
            "ours_over_torch_1f1b": speed}


def bench_chosen(model: str, setup: Setup, chosen: str) -> dict[str, Any]:
    """Our chosen plan (``chosen``: the schedule of the least prediction, our cut points) against an equal split of
    layers with Schedule1F1B, both on torch's runtime; and our cut points with Schedule1F1B, the split alone."""
    path = profile(model, setup)
    plans = {"chosen": plan_for(model, path, chosen, setup),
             "ours_1f1b": plan_for(model, path, "pipedream_flush", setup),
             "equal_1f1b": plan_for(model, path, "pipedream_flush", setup, partitioner="equal")}
    schedule = {"chosen": chosen, "ours_1f1b": "pipedream_flush", "equal_1f1b": "pipedream_flush"}
    runs = {k: (config(model, setup, "torch", schedule[k], f"{k}_{schedule[k]}"), plan) for k, plan in plans.items()}
    got = measured_s(runs, setup)
    cut = {k: [len(s.nodes) for s in plan.stages] for k, plan in plans.items()}
    equal = statistics.median(got["equal_1f1b"])
    print(f"\n{model}, against an equal split of layers with Schedule1F1B (layers a stage {cut['equal_1f1b']}, "
          f"{_ms(got['equal_1f1b'])}):\n  our chosen plan ({chosen}, layers a stage {cut['chosen']}) "
          f"{_ms(got['chosen'])}: {equal / statistics.median(got['chosen']):.2f}x\n  our split with Schedule1F1B "
          f"(layers a stage {cut['ours_1f1b']}) {_ms(got['ours_1f1b'])}: {equal / statistics.median(got['ours_1f1b']):.2f}x")
    return {"chosen": chosen, "measured_s": got, "cuts": cut,
            "speedup": equal / statistics.median(got["chosen"]),
            "split_alone_speedup": equal / statistics.median(got["ours_1f1b"])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated: gpt, vgg16, resnet18")
    parser.add_argument("--schedules", default=",".join(TORCH_SCHEDULES), help="comma-separated torch schedules")
    parser.add_argument("--batch-size", type=int, default=64, help="samples a minibatch")
    parser.add_argument("--microbatches", type=int, default=8, help="microbatches a minibatch")
    parser.add_argument("--minibatches", type=int, default=10, help="minibatches an epoch")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each configuration (the median is kept)")
    parser.add_argument("--cluster", default="2:1e9", help="the cluster the planner and the prediction see")
    parser.add_argument("--uneven", default="vgg16", help="the model of the chosen-plan comparison ('' skips it)")
    parser.add_argument("--out-dir", type=Path, default=REPO / "results" / "benchmarks" / "torch_runtime")
    parser.add_argument("--out", type=Path, help="write every number to this JSON file")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))  # the workers
    setup = Setup(args.batch_size, args.microbatches, args.minibatches, args.repeats, args.cluster, args.out_dir)
    schedules = tuple(args.schedules.split(","))
    result: dict[str, Any] = {"setup": {k: str(v) for k, v in vars(args).items()}, "models": {}}
    for model in args.models.split(","):
        result["models"][model] = bench_model(model, setup, schedules)
    if args.uneven:
        got = result["models"].get(args.uneven) or bench_model(args.uneven, setup, schedules)
        chosen = min(got["schedules"], key=lambda s: got["schedules"][s]["predicted_s"])
        result["chosen"] = bench_chosen(args.uneven, setup, chosen)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
