"""Planner speed: seconds per model and cluster, compat mode, against the release optimizer's times.

Usage (from the repository root):

    .venv/bin/python benchmarks/planner/main.py                      # the hierarchical and flat cases of the brief
    .venv/bin/python benchmarks/planner/main.py --all --repeats 3    # every profile on A_4x4, B_2x8 and the flat 16s

Prints, per case, the best wall-clock and CPU (process) seconds over the repeats, the config string and
the predicted time per sample. CPU seconds are what the planner itself costs; wall seconds also count
waiting for a shared, busy machine. The release numbers are those quoted in the project brief for
``optimizer_graph_hierarchical.py`` on the same profiles.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from pipedream.graph import LayerGraph, profiled_batch  # noqa: E402
from pipedream.planner import PlanOptions, plan_pipeline  # noqa: E402
from pipedream.topology import get_cluster  # noqa: E402

MODELS = ("alexnet", "vgg16", "resnet50", "gnmt", "gnmt_large")  # release profiles (meta.json: profiled batch)
# The release's optimizer on the same profiles: hierarchical clusters (brief), and the flat 16-worker runs of
# its compat reference (5-7 s each; the target is 100x faster).
RELEASE_S = {("resnet50", "A_4x4"): "46", ("resnet50", "B_2x8"): "143", ("gnmt_large", "A_4x4"): ">328",
             ("resnet50", "A_flat16"): "5-7", ("resnet50", "B_flat16"): "5-7",
             ("gnmt_large", "A_flat16"): "5-7", ("gnmt_large", "B_flat16"): "5-7"}
TARGET_S = {("resnet50", "A_4x4"): 0.5, ("resnet50", "B_2x8"): 0.5, ("gnmt_large", "A_4x4"): 3.0,
            ("resnet50", "A_flat16"): 0.05, ("resnet50", "B_flat16"): 0.05,
            ("gnmt_large", "A_flat16"): 0.05, ("gnmt_large", "B_flat16"): 0.05}


def time_case(model: str, cluster_name: str, repeats: int, compat: bool) -> tuple[float, float, object]:
    """Best (wall s, CPU s) over ``repeats`` runs of the whole planner (states + DP + plan), and the plan."""
    path = REPO / "experiments" / "data" / "profiles" / model / "graph.txt"
    graph = LayerGraph.read(path)
    cluster = get_cluster(cluster_name, REPO / "experiments" / "clusters.yaml")
    walls, cpus, plan = [], [], None
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        plan = plan_pipeline(graph, cluster, model=model, minibatch_size=profiled_batch(path),
                             options=PlanOptions(compat=compat))
        cpus.append(time.process_time() - cpu)
        walls.append(time.perf_counter() - wall)
    return min(walls), min(cpus), plan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="every profile on A_4x4, B_2x8, A_flat16 and B_flat16")
    parser.add_argument("--repeats", type=int, default=3, help="runs per case; the best is printed")
    parser.add_argument("--default-mode", action="store_true", help="time the default (fixed) mode instead of --compat")
    args = parser.parse_args(argv)
    clusters = ("A_4x4", "B_2x8", "A_flat16", "B_flat16")
    cases = list(RELEASE_S) if not args.all else [(m, c) for m in MODELS for c in clusters]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"planner benchmark, {'default' if args.default_mode else 'compat'} mode, best of {args.repeats}, "
          f"{os.cpu_count()} CPUs, load average {load:.1f}")
    header = ("model", "cluster", "wall s", "cpu s", "target s", "release s", "config", "s/sample")
    print("{:<11} {:<8} {:>8} {:>8} {:>8} {:>9}  {:<28} {:>12}".format(*header))
    for model, cluster in cases:
        wall, cpu, plan = time_case(model, cluster, args.repeats, compat=not args.default_mode)
        target = TARGET_S.get((model, cluster))
        print(f"{model:<11} {cluster:<8} {wall:8.3f} {cpu:8.3f} {target if target else '':>8} "
              f"{RELEASE_S.get((model, cluster), ''):>9}  {plan.config:<28} {plan.time_per_sample_s:12.6e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
