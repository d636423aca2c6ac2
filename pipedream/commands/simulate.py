"""Simulate a schedule of a plan (or of the planner's plan for a cluster) at paper scale and predict an epoch.

Examples::

    pipedream simulate --profile experiments/data/profiles/vgg16/graph.txt --cluster A_4x4 --batch-size 64
    pipedream simulate --profile PROFILE --plan results/plans/vgg16/A_4x4.json --schedule dp --json out.json
    pipedream simulate --profile PROFILE --cluster '8x8:25e9,12.5e9' --schedule gpipe --microbatches 8
    pipedream simulate --profile PROFILE --cluster A_4x4 --schedule pipedream_flush --microbatches 8 --recompute
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from pipedream.paths import CLUSTERS

HELP = ("simulate PipeDream / GPipe / 2BW / PipeDream-Flush / DP on a modelled cluster: epoch time, bubble, bytes, "
        "DP stalls")
SCHEDULE_CHOICES = ("1f1b", "gpipe", "2bw", "pipedream_flush", "dp")


def _schedule(name: str) -> str:
    """``--schedule`` value; ``pipedream``, the old name of ``1f1b``, is still accepted."""
    return "1f1b" if name == "pipedream" else name


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``pipedream simulate``."""
    p.add_argument("--profile", required=True,
                   help="graph.txt of the model (e.g. experiments/data/profiles/vgg16/graph.txt)")
    p.add_argument("--profiled-batch", type=int, default=None,
                   help="samples in the profiled minibatch (default: minibatch_size in meta.json beside the profile)")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--plan", help="plan JSON from `pipedream plan` (its cluster comes from --cluster or the plan)")
    where.add_argument("--cluster", help="plan with the planner for this cluster (name or what-if string)")
    p.add_argument("--plan-cluster", default=None, help="with --plan: the cluster to simulate on (default: the plan's)")
    p.add_argument("--clusters", default=CLUSTERS,
                   help="clusters YAML file (a relative path not found here is looked up in the checkout)")
    p.add_argument("--schedule", default="1f1b", type=_schedule, choices=SCHEDULE_CHOICES,
                   help="schedule to time: 1f1b (PipeDream 1F1B-RR), gpipe, 2bw (PipeDream-2BW), pipedream_flush "
                        "(1F1B over each minibatch's microbatches, then a flush) or dp")
    p.add_argument("--microbatches", type=int, default=4,
                   help="microbatches per minibatch (gpipe, 2bw, pipedream_flush)")
    p.add_argument("--recompute", action="store_true",
                   help="activation recomputation: every backward runs its forward again (compute x 4/3 when a "
                        "backward costs two forwards, PipeDream-2BW's figure)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="samples per minibatch of the pipeline (and of each DP worker), as in `pipedream train`; "
                        "the profile is scaled to it (default: the profiled minibatch)")
    p.add_argument("--dataset-size", type=int, default=1_281_167, help="samples in an epoch (default: ImageNet)")
    p.add_argument("--no-overlap", action="store_true", help="allreduce after the backward, not layer by layer")
    p.add_argument("--allreduce", default="ring", choices=["ring", "hierarchical"],
                   help="allreduce algorithm (default: pipedream.sim.DEFAULT_ALLREDUCE, as the planner assumes)")
    p.add_argument("--optimizer", default=None, choices=("sgd", "adam", "muon"),
                   help="whose optimizer step to charge, at the rates the profile's meta.json measured where it has them, "
                        "else memory-bound (default: the one the --plan was made for, else sgd)")
    p.add_argument("--json", default=None, help="also write the results as JSON to this path")


def run(args: argparse.Namespace) -> int:
    """Simulate and print the results; returns 0."""
    from pipedream.errors import PipeDreamError
    from pipedream.graph import LayerGraph, profiled_batch, read_meta
    from pipedream.io import atomic_write_json
    from pipedream.paths import shipped
    from pipedream.plan import Plan
    from pipedream.sim import SimOptions, simulate_dp, simulate_plan
    from pipedream.sim.profiled import step_rates
    from pipedream.topology import get_cluster

    if args.microbatches < 1 or (args.batch_size is not None and args.batch_size < 1) or args.dataset_size < 1:
        raise PipeDreamError("--microbatches, --batch-size and --dataset-size must be positive")
    path = shipped(args.profile)
    graph = LayerGraph.read(path)
    graph.minibatch_size = profiled_batch(path, args.profiled_batch)
    if args.batch_size:
        graph = graph.scaled(args.batch_size)
    meta = read_meta(path) or {}
    if args.plan:
        plan = Plan.load(args.plan)
        cluster = get_cluster(args.plan_cluster or plan.cluster, args.clusters)
        source = args.plan
        step = step_rates(meta, args.optimizer or plan.optimizer or "sgd")
    else:
        from pipedream.planner import plan_pipeline

        cluster = get_cluster(args.cluster, args.clusters)
        step = step_rates(meta, args.optimizer or "sgd")
        plan = plan_pipeline(graph, cluster, model=path.parent.name, minibatch_size=graph.minibatch_size, step=step)
        source = "planner"
    opts = SimOptions(schedule=args.schedule, dataset_size=args.dataset_size, overlap=not args.no_overlap,
                      allreduce=args.allreduce, microbatches=args.microbatches, recompute=args.recompute, step=step)
    res = simulate_plan(graph, plan, cluster, opts)
    # the baseline DP run never recomputes
    dp = res if args.schedule == "dp" else simulate_dp(graph, cluster, replace(opts, recompute=False), workers=plan.workers)
    out = {"profile": str(path), "plan": source, "plan_config": plan.config, "cluster": cluster.describe(),
           **res.to_dict(), "dp_epoch_time_s": dp.epoch_time_s, "speedup_over_dp": dp.epoch_time_s / res.epoch_time_s,
           "dp_comm_stall_fraction": dp.comm_stall_fraction}
    print(f"{args.schedule} on {cluster.describe()}, plan {plan.config} ({source})")
    print(f"  time per minibatch of {res.samples_per_minibatch} samples: {res.time_per_minibatch_s * 1e3:.2f} ms "
          f"({1 / res.time_per_sample_s:.0f} samples/s)")
    print(f"  epoch of {res.dataset_size} samples: {res.epoch_time_s:.1f} s; DP: {dp.epoch_time_s:.1f} s; "
          f"speedup over DP {out['speedup_over_dp']:.2f}x")
    print(f"  bubble {res.bubble_fraction:.1%} (steady {res.steady_bubble_fraction:.1%}); utilisation per rank "
          + " ".join(f"{u:.2f}" for u in res.utilisation))
    print(f"  bytes/sample: activations {res.p2p_bytes_per_sample:.3g}, allreduce {res.allreduce_bytes_per_sample:.3g}; "
          f"DP allreduce {dp.allreduce_bytes_per_sample:.3g}")
    print(f"  stalls: allreduce {res.comm_stall_fraction:.1%}, receive {res.recv_stall_fraction:.1%}; "
          f"DP allreduce stall {dp.comm_stall_fraction:.1%}")
    if args.json:
        atomic_write_json(Path(args.json), out)
    return 0
