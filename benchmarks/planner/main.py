"""Planner speed: seconds per model and cluster, compat mode, against the release optimizer's times.

Usage (from the repository root):

    .venv/bin/python benchmarks/planner/main.py                      # the hierarchical and flat cases of the brief
    .venv/bin/python benchmarks/planner/main.py --all --repeats 3    # every profile on A_4x4, B_2x8 and the flat 16s
    .venv/bin/python benchmarks/planner/main.py --schedules          # the schedule search: 100 layers, 64 ranks

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

from pipedream.graph import LayerGraph, Node, profiled_batch  # noqa: E402
from pipedream.planner import PlanOptions, plan_pipeline  # noqa: E402
from pipedream.planner.schedule_choice import pipedream_plan  # noqa: E402
from pipedream.planner.schedule_search import SearchSettings, pipeline, search, shape_of  # noqa: E402
from pipedream.topology import get_cluster  # noqa: E402
from pipedream.torch_schedules import positions, torch_ops  # noqa: E402

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


def synthetic_chain(layers: int = 100, batch: int = 8) -> LayerGraph:
    """A chain of ``layers`` uneven layers (forward 1-7 ms, backward twice that, 1-3 MB of activations, 4-16 MB of
    parameters, in repeating patterns) profiled at ``batch`` samples."""
    g = LayerGraph(minibatch_size=batch)
    g.add_node(Node("node0", "Input", 0.0, 0.0, (1e6,), 0.0))
    for i in range(1, layers + 1):
        fwd = (1 + i % 7) / 1e3
        g.add_node(Node(f"node{i}", "Layer", fwd, 2 * fwd, ((1 + i % 3) * 1e6,), (1 + i % 4) * 4e6))
        g.add_edge(f"node{i - 1}", f"node{i}")
    return g


def time_schedules(repeats: int) -> None:
    """`--schedule auto`'s two parts for a 100-layer model on 64 ranks (B_8x8): the search over the seven flush
    schedules and PipeDream's 1F1B plan (on more than 16 workers the dynamic program's, not re-ranked)."""
    graph = synthetic_chain()
    cluster = get_cluster("B_8x8", REPO / "experiments" / "clusters.yaml")
    settings = SearchSettings(batch_size=graph.minibatch_size * cluster.workers)
    for label, run in (("search, 7 schedules", lambda: search(graph, cluster, settings)),
                       ("PipeDream 1F1B plan", lambda: pipedream_plan(graph, cluster, model="chain100"))):
        walls, cpus = [], []
        for _ in range(repeats):
            for cached in (shape_of, pipeline, torch_ops, positions):  # every repeat converts torch's lists anew
                cached.cache_clear()
            wall, cpu = time.perf_counter(), time.process_time()
            out = run()
            cpus.append(time.process_time() - cpu)
            walls.append(time.perf_counter() - wall)
        best = out[0] if isinstance(out, list) else out
        what = (f"{best.schedule} {best.depth}x{best.width} v{best.chunks} m{best.microbatches}"  # type: ignore[union-attr]
                if isinstance(out, list) else f"1f1b {best.config}")  # type: ignore[union-attr]
        print(f"{label:<22} {min(walls):8.2f} {min(cpus):8.2f}  target 10 s (both together)  best: {what}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="every profile on A_4x4, B_2x8, A_flat16 and B_flat16")
    parser.add_argument("--repeats", type=int, default=3, help="runs per case; the best is printed")
    parser.add_argument("--default-mode", action="store_true", help="time the default (fixed) mode instead of --compat")
    parser.add_argument("--schedules", action="store_true",
                        help="time the schedule search (plan --schedule auto): a 100-layer model on 64 ranks")
    args = parser.parse_args(argv)
    if args.schedules:
        print(f"schedule search, 100 layers on 64 ranks (B_8x8), best of {args.repeats}, {os.cpu_count()} CPUs")
        print(f"{'':<22} {'wall s':>8} {'cpu s':>8}")
        time_schedules(args.repeats)
        return 0
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
