"""Does each stage of a plan, run alone, cost its profile's share of the whole step? One process, one thread, one core.

For each model with a plan of two stages or more in ``--results``, :func:`pipedream.stage_probe.probe` (what
``pipedream train`` measures before a CPU run, ``--stage-probe-rounds``) builds the plan's stage modules as a worker
does and times, interleaved, the profile's whole step and each stage's forward and backward alone, pinned to one
core here, twice side by side: warm (each stage's steps back to back, as the probe did before session 37) and cold
(the caches evicted before each forward and each backward, as the probe does now and as a run's stages find them). It
prints, per stage, its median main-thread CPU per step both ways, its share of the whole step and
``factor = alone / (share x whole)`` both ways; with a ``compute_check.csv`` in ``--results`` (``make run``'s, or
``benchmarks/cores``'s), also the run's ``compute_cpu_ratio`` times its prediction's factor (``stage_factor``): the
run's stage over its share, to set beside the two factors.

Why (issue 18): on the device machine's cores (a core per worker, session 33) every pipeline's last stage computed
at 0.88-1.13x its predicted work and every stage before it at 1.03-1.44x; measured numbers: README.md here.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/stages/main.py --results results [--models resnet50 gnmt16]
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # `pipedream` from this checkout, also in a worktree

MODELS = ("vgg16", "resnet50", "alexnet", "gnmt8", "gnmt16", "awd_lm", "s2vt")


def plan_file(results: Path, model: str) -> Path | None:
    """``model``'s plan in ``results``: ``plans/<model>.json`` (``benchmarks/cores``) or the one file in
    ``plans/<model>/`` (``make run``); None if there is none or several."""
    flat = results / "plans" / f"{model}.json"
    if flat.is_file():
        return flat
    found = sorted((results / "plans" / model).glob("*.json"))
    return found[0] if len(found) == 1 else None


def run_ratios(results: Path, model: str) -> dict[int, float]:
    """The pipeline run's stages over their shares: ``compute_cpu_ratio`` (its compute's CPU over the prediction's
    work) times ``stage_factor`` (the factor that work was taken at; 1 where the run had none) per stage, from
    ``results/compute_check.csv`` (empty if absent)."""
    path = results / "compute_check.csv"
    if not path.is_file():
        return {}
    with path.open() as f:
        return {int(r["stage"]): float(r["compute_cpu_ratio"]) * float(r.get("stage_factor") or 1.0)
                for r in csv.DictReader(f)
                if r["model"] == model and r["mode"] == "pipedream" and r.get("compute_cpu_ratio")}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", type=Path, default=ROOT / "results",
                   help="a make run results folder or a benchmarks/cores OUT: its plans, profiles and compute_check.csv")
    p.add_argument("--models", nargs="+", default=list(MODELS), help="models (default: all seven)")
    p.add_argument("--rounds", type=int, default=10, help="rounds of one block per step (default 10)")
    p.add_argument("--block", type=int, default=4, help="calls of a step in a row (default 4)")
    p.add_argument("--core", type=int, default=None, help="pin this process to this core (default: the first allowed)")
    args = p.parse_args()
    import torch

    from pipedream.graph import LayerGraph, profiled_batch
    from pipedream.plan import Plan
    from pipedream.runtime.config import TrainConfig
    from pipedream.runtime.task import load_task
    from pipedream.stage_probe import probe

    os.sched_setaffinity(0, {args.core if args.core is not None else min(os.sched_getaffinity(0))})
    torch.set_num_threads(1)
    for model in args.models:
        path = plan_file(args.results, model)
        graph_txt = args.results / "profiles" / model / "graph.txt"
        if path is None or not graph_txt.is_file():
            print(f"{model}: no plan or profile in {args.results}, left out")
            continue
        plan = Plan.load(path)
        if len(plan.stages) < 2:
            print(f"{model}: plan {plan.config} has one stage, left out")
            continue
        g = LayerGraph.read(graph_txt, profiled_batch(graph_txt))
        task = load_task(TrainConfig(model=model, preset="reduced", seed=0, data="real", batch_size=32))
        warm = probe(task, plan, g, 32, rounds=args.rounds, block=args.block, evict_bytes=0)
        cold = probe(task, plan, g, 32, rounds=args.rounds, block=args.block)
        ran = run_ratios(args.results, model)
        print(f"{model} {plan.config}: whole step {warm.whole_s * 1e3:.1f} / {cold.whole_s * 1e3:.1f} ms, the stages "
              f"alone warm {sum(warm.alone_s) * 1e3:.1f} ms, cold {sum(cold.alone_s) * 1e3:.1f} ms "
              f"({cold.evict_bytes >> 20} MiB evicted before each forward and backward)")
        for s, sh in enumerate(cold.shares):
            line = (f"  stage {s}: share {sh:.3f}; alone warm {warm.alone_s[s] * 1e3:.2f} ms -> factor "
                    f"{warm.factors[s]:.3f}, cold {cold.alone_s[s] * 1e3:.2f} ms -> {cold.factors[s]:.3f} "
                    f"(cold/warm {cold.alone_s[s] / warm.alone_s[s]:.3f})")
            if s in ran:
                line += f"; the run's stage over its share {ran[s]:.3f}"
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
