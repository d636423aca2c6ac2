"""Partitioners: our cut points against an equal split of layers and against balancing compute alone.

Usage (from the repository root):

    .venv/bin/python benchmarks/partitioners/main.py                 # GNMT-8, AWD-LM, VGG-16, GPT-1.3B on B_2x8
    .venv/bin/python benchmarks/partitioners/main.py --cluster A_4x4 --schedules gpipe zbv

For each model and schedule, the schedule search (pipedream.planner.schedule_search, our "balanced" cut points:
compute, transfers and memory) picks the depth (2 or more: a pipeline to cut), chunks and microbatches; the same
shape is then cut by the two simple partitioners: "equal", the same number of layers a stage (torchtitan's
default), and "compute", forward and backward balanced alone (the cost-based partitioner proposed upstream for
torch.distributed.pipelining). All three are simulated with the same schedule; printed is each one's predicted
throughput and ours over theirs (> 1: ours is faster), and whether each fits the device memory.

AWD-LM has no V100 profile: its full preset (embedding 400, LSTMs of 1150, 1150 and 400, vocabulary 10,000) is
profiled here on the CPU at 8 sequences, once per run (a few seconds); its ratios are of CPU layer times.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from pipedream import costmodel  # noqa: E402
from pipedream.errors import PipeDreamError  # noqa: E402
from pipedream.graph import LayerGraph, profiled_batch  # noqa: E402
from pipedream.planner.schedule_search import SEARCHED, SearchSettings, evaluate, search  # noqa: E402
from pipedream.topology import get_cluster  # noqa: E402

MODELS = ("gnmt", "awd_lm", "vgg16", "gpt")


def load(model: str) -> tuple[LayerGraph, str, int]:
    """The profile of ``model``, its optimizer and the samples an iteration (the profiled minibatch a GPU on 16)."""
    if model == "gpt":
        from pipedream.models.transformer import config_of
        from pipedream.table2bw.paper import transformer_graph

        return transformer_graph(config_of("gpt", "full")), "adam", 512
    if model == "awd_lm":
        from pipedream.api import profile
        from pipedream.models import build_model, example_input

        graph = profile(build_model("awd_lm", "full"), example_input("awd_lm", 8, "full"), in_situ=False, name="awd_lm")
        return graph, "sgd", 8 * 16
    path = REPO / "experiments" / "data" / "profiles" / model / "graph.txt"
    graph = LayerGraph.read(path)
    graph.minibatch_size = profiled_batch(path)
    return graph, "sgd", graph.minibatch_size * 16


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", default="B_2x8", help="a cluster of experiments/clusters.yaml (16 GPUs by default)")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--schedules", nargs="+", default=list(SEARCHED), choices=SEARCHED)
    args = parser.parse_args(argv)
    cluster = get_cluster(args.cluster, REPO / "experiments" / "clusters.yaml")
    print(f"partitioners on {cluster.name}: samples/s of each, ours over each (> 1: ours faster); "
          "'!' = does not fit the device")
    print(f"{'model':<8} {'schedule':<17} {'shape':<14} {'ours':>10} {'equal':>10} {'compute':>10} "
          f"{'ours/equal':>10} {'ours/compute':>12}")
    start = time.perf_counter()
    for model in args.models:
        graph, optimizer, batch = load(model)
        batch = batch * cluster.workers // 16 or cluster.workers
        depths = tuple(d for d in range(2, cluster.workers + 1) if cluster.workers % d == 0)  # pipelines: cuts to compare
        settings = SearchSettings(batch_size=batch, step=costmodel.StepRates(optimizer), depths=depths)
        for schedule in args.schedules:
            try:
                (ours,) = search(graph, cluster, replace(settings, schedules=(schedule,)))
            except PipeDreamError as e:
                print(f"{model:<8} {schedule:<17} {e}")
                continue
            theirs = {}
            for name in ("equal", "compute"):
                theirs[name] = evaluate(graph, cluster, replace(settings, partitioner=name, memory_limit=False),
                                        schedule, ours.depth, ours.chunks, ours.microbatches)
                theirs[name].fits = max(theirs[name].peak_bytes) <= cluster.device_memory_bytes
            shape = f"{ours.depth}x{ours.width} v{ours.chunks} m{ours.microbatches}"
            rate = {k: f"{batch / o.iteration_s:9.1f}{'' if o.fits else '!'}" for k, o in (("ours", ours), *theirs.items())}
            print(f"{model:<8} {schedule:<17} {shape:<14} {rate['ours']:>10} {rate['equal']:>10} "
                  f"{rate['compute']:>10} {theirs['equal'].iteration_s / ours.iteration_s:10.3f} "
                  f"{theirs['compute'].iteration_s / ours.iteration_s:12.3f}")
    print(f"\n{time.perf_counter() - start:.1f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
