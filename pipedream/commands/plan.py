"""Partition a profiled model into replicated pipeline stages for a cluster (paper §3.1).

Reads a graph.txt profile and a cluster (by name from clusters.yaml, or a what-if string such as
'8x2:25e9,3.125e9', innermost level first), runs PipeDream's hierarchical dynamic program, writes the
plan as JSON and prints the stage table. --compat reproduces the release optimizer's predicted time;
the default mode fixes its known problems (listed in pipedream/planner/__init__.py).
"""

from __future__ import annotations

import argparse

from pipedream.paths import CLUSTERS

HELP = "partition a profile into pipeline stages for a cluster (PipeDream's planner)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``pipedream plan``."""
    p.add_argument("--profile", required=True,
                   help="graph.txt of the model (times in ms per profiled minibatch); the release's V100 profiles "
                        "are experiments/data/profiles/<model>/graph.txt")
    p.add_argument("--cluster", required=True, help="cluster name in --clusters, or a what-if string like '8x2:25e9,3.125e9'")
    p.add_argument("--clusters", default=CLUSTERS,
                   help="clusters YAML file (a relative path not found here is looked up in the checkout)")
    p.add_argument("--model", default=None, help="model name for the plan (default: the profile's folder name)")
    p.add_argument("--profiled-batch", type=int, default=None,
                   help="samples in the profiled minibatch (default: minibatch_size in meta.json beside the profile)")
    p.add_argument("--out", required=True, help="where to write the plan JSON")
    p.add_argument("--memory-limit", action=argparse.BooleanOptionalAction, default=None,
                   help="reject stages that do not fit the device memory (default: on, off with --compat)")
    p.add_argument("--straight", action="store_true", help="one replica per stage (a straight pipeline)")
    p.add_argument("--compat", action="store_true", help="reproduce the release optimizer's semantics exactly")
    p.add_argument("--activation-compression-ratio", type=float, default=None,
                   help="divide activation transfer bytes by R (in --compat, giving it also turns transfers on)")
    p.add_argument("--explain", action="store_true", help="say in words why this split won")


def run(args: argparse.Namespace) -> int:
    """Plan, write the JSON, print the table (and the explanation); returns 0."""
    from pipedream.api import partition
    from pipedream.errors import PipeDreamError
    from pipedream.graph import LayerGraph
    from pipedream.paths import shipped
    from pipedream.planner.explain import format_plan
    from pipedream.topology import get_cluster

    if args.activation_compression_ratio is not None and args.activation_compression_ratio <= 0:
        raise PipeDreamError("--activation-compression-ratio must be positive")
    profile = shipped(args.profile)
    graph = LayerGraph.read(profile)
    cluster = get_cluster(args.cluster, args.clusters)
    plan = partition(str(profile), args.cluster, model=args.model or profile.resolve().parent.name,
                     straight=args.straight, memory_limit=args.memory_limit, compat=args.compat, clusters=args.clusters,
                     profiled_batch=args.profiled_batch, activation_compression_ratio=args.activation_compression_ratio)
    if args.explain:
        from pipedream.planner.explain import explain

        plan.extra["explanation"] = explain(plan, graph, cluster)
    plan.save(args.out)
    print(format_plan(plan))
    if args.explain:
        print()
        print(plan.extra["explanation"])
    print(f"\nwrote {args.out}")
    return 0
