"""Simulator speed: one ImageNet-size epoch (1,281,167 samples) on 16 workers, per schedule.

Each case builds the stage costs once, then times ``simulate_stages`` (two short event simulations and the
closed-form steady state, see pipedream/sim/simulate.py) as the best of ``--repeats`` runs. ``--check``
also event-simulates every minibatch of the epoch and prints the relative difference to the closed form.

    .venv/bin/python benchmarks/simulator/main.py [--repeats 3] [--check] [--out results/benchmarks/simulator.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pipedream.graph import LayerGraph, profiled_batch  # noqa: E402
from pipedream.placement import replica_ranks  # noqa: E402
from pipedream.planner.fixed_split import replicas_of, split_for_replicas  # noqa: E402
from pipedream.sim import IMAGENET_TRAIN_SAMPLES, SimOptions, run_minibatches, simulate_stages  # noqa: E402
from pipedream.sim.costs import stage_costs  # noqa: E402
from pipedream.sim.network import Network  # noqa: E402
from pipedream.topology import get_cluster  # noqa: E402

PROFILES = Path("experiments/data/profiles")
# (label, profile folder, per-GPU batch, cluster, schedule, paper config, microbatches)
CASES = [
    ("VGG-16 DP", "vgg16", 64, "A_4x4", "dp", "16", 1),
    ("VGG-16 PipeDream 15-1", "vgg16", 64, "A_4x4", "1f1b", "15-1", 1),
    ("ResNet-50 DP (5 DDP buckets)", "resnet50", 128, "B_2x8", "dp", "16", 1),
    ("GNMT-16 PipeDream straight", "gnmt_large", 64, "A_4x4", "1f1b", "straight", 1),
    ("GNMT-16 GPipe straight, m=16", "gnmt_large", 64, "A_4x4", "gpipe", "straight", 16),
    ("GNMT-16 2BW straight, m=16", "gnmt_large", 64, "A_4x4", "2bw", "straight", 16),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--check", action="store_true", help="also event-simulate the whole epoch (slow)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    rows = []
    for label, folder, batch, cname, sched, config, m in CASES:
        path = PROFILES / folder / "graph.txt"
        g = LayerGraph.read(path, profiled_batch(path)).scaled(batch)
        cluster = get_cluster(cname)
        reps = replicas_of(config, cluster.workers)
        if sched == "dp":
            stages, ranks = [list(g.nodes)], [list(range(cluster.workers))]
        else:
            ranks = replica_ranks(reps, cluster)
            stages = split_for_replicas(g, reps, Network(cluster), batch, ranks)
        costs = stage_costs(g, stages, batch)
        options = SimOptions(schedule=sched, microbatches=m, dataset_size=IMAGENET_TRAIN_SAMPLES)
        best = math.inf
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            res = simulate_stages(g, stages, ranks, cluster, options, costs=costs)
            best = min(best, time.perf_counter() - t0)
        row = {"case": label, "cluster": cname, "minibatches": res.epoch_minibatches, "epoch_time_s": res.epoch_time_s,
               "simulate_s": best}
        if args.check:
            unit = math.lcm(*(len(r) for r in ranks))  # schedules need a multiple of every replica count
            n = unit * math.ceil(res.epoch_minibatches / unit)
            closed = simulate_stages(g, stages, ranks, cluster, replace(options, dataset_size=n * res.samples_per_minibatch),
                                     costs=costs)
            t0 = time.perf_counter()
            full = run_minibatches(ranks, costs, cluster, n, options)
            row["full_event_sim_s"] = time.perf_counter() - t0
            row["closed_form_rel_diff"] = closed.epoch_time_s / full.makespan_s - 1
        rows.append(row)
        extra = (f"  full event sim {row['full_event_sim_s']:.1f} s, closed form differs by {row['closed_form_rel_diff']:.1e}"
                 if args.check else "")
        print(f"{label:38s} {cname}  {res.epoch_minibatches:6d} minibatches  epoch {res.epoch_time_s:8.1f} s  "
              f"simulated in {best:.3f} s{extra}", flush=True)
    if args.out:
        from pipedream.io import atomic_write_json

        atomic_write_json(Path(args.out), rows)
    else:
        print(json.dumps({"max_simulate_s": max(r["simulate_s"] for r in rows)}))


if __name__ == "__main__":
    main()
