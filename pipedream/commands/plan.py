"""Partition a profiled model into replicated pipeline stages for a cluster (paper §3.1).

Reads a graph.txt profile and a cluster (by name from clusters.yaml, or a what-if string such as
'8x2:25e9,3.125e9', innermost level first), runs PipeDream's hierarchical dynamic program, writes the
plan as JSON and prints the stage table. --compat reproduces the release optimizer's predicted time;
the default mode fixes its known problems (listed in pipedream/planner/__init__.py).

--planner 2bw is PipeDream-2BW's planner instead (pipedream/planner/twobw.py): w parallel pipelines of depth d,
the microbatch and recomputation for the highest throughput at --batch-size under the device memory, its --rerank
best shapes simulated; --flops MODEL plans MODEL's full preset from FLOP counts instead of a profile, e.g.

    pipedream plan --planner 2bw --flops gpt_2.2b --cluster B_8x8 --batch-size 512 --out gpt_2.2b.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipedream.paths import CLUSTERS

HELP = "partition a profile into pipeline stages for a cluster (PipeDream's planner)"
SCHEDULE_CHOICES = ("auto", "1f1b", "2bw", "gpipe", "pipedream_flush", "interleaved_1f1b", "looped_bfs", "interleaved_zb",
                    "zbv", "dualpipev")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``pipedream plan``."""
    p.add_argument("--profile",
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
    p.add_argument("--optimizer", default=None, choices=("sgd", "adam", "muon"),
                   help="the optimizer the plan's runs train with: its state is held and its step charged, at the rates "
                        "the profile's meta.json measured where it has them, else memory-bound (muon: Muon on the "
                        "hidden matrices, Adam on the rest; default: sgd, the paper's, or adam with --planner 2bw; "
                        "ignored with --compat, whose release optimizer charges no step)")
    p.add_argument("--runtime", choices=("pipedream", "torch"), default=None,
                   help="the runtime the plan is for: torch plans only torch.distributed.pipelining's seven schedules "
                        "(--schedule auto over them unless one is named) and writes extra.torch: the split_spec, the "
                        "stage-to-rank map, the schedule class and the microbatch count (default: pipedream)")
    p.add_argument("--export", choices=("torch",), default=None,
                   help="torch: also write the schedule's action lists beside the plan, <plan stem>.schedule.csv, as "
                        "torch's _load_csv reads them (implies --runtime torch)")
    g = p.add_argument_group("PipeDream-2BW's planner (--planner 2bw)")
    g.add_argument("--planner", choices=("pipedream", "2bw"), default="pipedream",
                   help="PipeDream's dynamic program, or PipeDream-2BW's search over width x depth x microbatch x "
                        "recomputation")
    g.add_argument("--flops", metavar="MODEL",
                   help="instead of --profile: MODEL's full preset (gpt, gpt_2.2b, gpt_3.8b, bert) costed from FLOP "
                        "counts on a V100 (assumed 30%% of 125 TFLOP/s)")
    g.add_argument("--batch-size", type=int,
                   help="samples per update over all pipelines, B = b w d g (required with --planner 2bw; with "
                        "--schedule default: the profiled minibatch times the workers)")
    g.add_argument("--schedule", default=None, choices=SCHEDULE_CHOICES,
                   help="--planner 2bw: 2bw (default), gpipe or pipedream_flush. PipeDream's planner: auto searches "
                        "every schedule (PipeDream's 1F1B with replicated stages, and straight pipelines of GPipe, "
                        "1F1B and torch's interleaved, zero-bubble and V-shaped schedules) for the fastest simulated "
                        "iteration of --batch-size samples that fits the device; a name plans that one "
                        "(docs/schedules.md); default: 1f1b")
    g.add_argument("--max-microbatches", type=int, default=64,
                   help="with --schedule: the most microbatches an iteration is cut into")
    g.add_argument("--max-microbatch", type=int, default=64, help="largest microbatch tried (powers of two)")
    g.add_argument("--depth", type=int, nargs="+", help="only these depths (--planner 2bw, --schedule)")
    g.add_argument("--microbatches", type=int, default=None,
                   help="with --schedule: exactly this many microbatches an iteration on each pipeline (e.g. "
                        "--batch-size / the profiled minibatch, so the runs compute at the profiled size)")
    g.add_argument("--microbatch", type=int, nargs="+", help="only these microbatch sizes")
    g.add_argument("--recompute", choices=("search", "on", "off"), default="search",
                   help="activation recomputation: try both, or only on or off")
    g.add_argument("--rerank", type=int, default=3,
                   help="simulate the cost model's best configuration of each of its K best shapes (w, d) and keep the "
                        "fastest simulated (0: the cost model's best, not simulated)")


def run(args: argparse.Namespace) -> int:
    """Plan, write the JSON, print the table (and the explanation); returns 0."""
    from pipedream.api import partition
    from pipedream.errors import PipeDreamError
    from pipedream.graph import LayerGraph
    from pipedream.paths import shipped
    from pipedream.planner.explain import format_plan
    from pipedream.topology import get_cluster

    if args.export == "torch" or args.runtime == "torch":
        _torch_runtime(args)
    if args.planner == "2bw":
        return _run_2bw(args)
    if args.schedule not in (None, "1f1b"):
        return _run_schedules(args)
    if args.profile is None or args.flops:
        raise PipeDreamError("PipeDream's planner needs --profile (--flops is for --planner 2bw)")
    if args.activation_compression_ratio is not None and args.activation_compression_ratio <= 0:
        raise PipeDreamError("--activation-compression-ratio must be positive")
    profile = shipped(args.profile)
    graph = LayerGraph.read(profile)
    cluster = get_cluster(args.cluster, args.clusters)
    plan = partition(str(profile), args.cluster, model=args.model or profile.resolve().parent.name,
                     straight=args.straight, memory_limit=args.memory_limit, compat=args.compat, clusters=args.clusters,
                     profiled_batch=args.profiled_batch, activation_compression_ratio=args.activation_compression_ratio,
                     optimizer=args.optimizer or "sgd")
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


def _torch_runtime(args: argparse.Namespace) -> None:
    """Check the options of ``--runtime torch`` (or ``--export torch``) and default ``--schedule`` to ``auto``.

    Raises:
        PipeDreamError: ``--export torch`` with ``--runtime pipedream``, ``--planner 2bw``, or a schedule of
            PipeDream's own runtime (``1f1b``, ``2bw``).
    """
    from pipedream.errors import PipeDreamError

    if args.runtime == "pipedream":
        raise PipeDreamError("--export torch writes torch.distributed.pipelining's schedule, which a plan for "
                             "--runtime pipedream does not run; pass --runtime torch or drop --export")
    args.runtime = "torch"
    if args.planner == "2bw":
        raise PipeDreamError("--runtime torch plans torch.distributed.pipelining's schedules, and --planner 2bw plans "
                             "PipeDream-2BW's; drop --planner 2bw (--schedule gpipe or pipedream_flush plans those "
                             "for torch)")
    if args.schedule in ("1f1b", "2bw"):
        raise PipeDreamError(f"--schedule {args.schedule} runs on PipeDream's runtime only (torch has no "
                             f"{'weight stashing' if args.schedule == '1f1b' else 'double-buffered weights'}); "
                             "with --runtime torch pass --schedule auto or one of gpipe, pipedream_flush, "
                             "interleaved_1f1b, looped_bfs, interleaved_zb, zbv, dualpipev")
    args.schedule = args.schedule or "auto"


def _run_2bw(args: argparse.Namespace) -> int:
    """``--planner 2bw``: search, write the plan, print it; returns 0."""
    from pipedream.costmodel import StepRates
    from pipedream.errors import PipeDreamError
    from pipedream.graph import LayerGraph, profiled_batch, read_meta
    from pipedream.paths import shipped
    from pipedream.planner.twobw import Settings, format_2bw, plan_2bw
    from pipedream.topology import get_cluster

    if (args.profile is None) == (args.flops is None):
        raise PipeDreamError("--planner 2bw needs exactly one of --profile and --flops MODEL")
    if args.batch_size is None or args.batch_size < 1 or args.max_microbatch < 1:
        raise PipeDreamError("--planner 2bw needs --batch-size B (samples per update, a multiple of the workers) and "
                             "a positive --max-microbatch")
    args.schedule = args.schedule or "2bw"
    if args.schedule not in ("2bw", "gpipe", "pipedream_flush"):
        raise PipeDreamError(f"--planner 2bw plans 2bw, gpipe or pipedream_flush, not --schedule {args.schedule}; "
                             "drop --planner 2bw to search the others")
    cluster = get_cluster(args.cluster, args.clusters)
    args.optimizer = args.optimizer or "adam"
    step = StepRates(args.optimizer)  # memory bound on a V100: a FLOP model has no measured rates
    if args.flops:
        from pipedream.models.transformer import config_of
        from pipedream.table2bw.paper import transformer_graph

        try:
            graph = transformer_graph(config_of(args.flops, "full"))
        except KeyError:
            raise PipeDreamError(f"--flops {args.flops!r}: no FLOP model; use gpt, gpt_2.2b, gpt_3.8b or bert") from None
        model = args.model or args.flops
    else:
        from pipedream.sim.profiled import step_rates

        profile = shipped(args.profile)
        graph = LayerGraph.read(profile)
        graph.minibatch_size = profiled_batch(profile, args.profiled_batch)
        model = args.model or profile.resolve().parent.name
        step = step_rates(read_meta(profile), args.optimizer)
    settings = Settings(batch_size=args.batch_size, schedule=args.schedule, step=step,
                        max_microbatch=args.max_microbatch, depths=args.depth, microbatch_sizes=args.microbatch,
                        recompute=None if args.recompute == "search" else [args.recompute == "on"])
    plan = plan_2bw(graph, cluster, settings, model=model, rerank=args.rerank)
    if args.flops:
        plan.extra["flops_model"] = args.flops
    plan.save(args.out)
    print(format_2bw(plan))
    print(f"\nwrote {args.out}")
    return 0


def _run_schedules(args: argparse.Namespace) -> int:
    """``--schedule auto`` or a named schedule (:mod:`pipedream.planner.schedule_search`): search, write the plan,
    print it and every schedule's best (all of them with --explain); returns 0."""
    from pipedream.errors import PipeDreamError
    from pipedream.graph import LayerGraph, profiled_batch, read_meta
    from pipedream.paths import shipped
    from pipedream.planner.explain import format_plan
    from pipedream.planner.schedule_choice import format_schedules, pipedream_plan, to_plan
    from pipedream.planner.schedule_search import SEARCHED, SearchSettings, search
    from pipedream.sim.profiled import step_rates
    from pipedream.topology import get_cluster

    if args.profile is None or args.flops or args.compat:
        raise PipeDreamError("--schedule needs --profile (not --flops or --compat)")
    if args.max_microbatches < 1 or (args.microbatches is not None and args.microbatches < 1):
        raise PipeDreamError("--max-microbatches and --microbatches must be positive")
    profile = shipped(args.profile)
    graph = LayerGraph.read(profile)
    graph.minibatch_size = profiled_batch(profile, args.profiled_batch)
    cluster = get_cluster(args.cluster, args.clusters)
    meta = read_meta(profile)
    step = step_rates(meta, args.optimizer or "sgd")
    batch = args.batch_size or graph.minibatch_size * cluster.workers
    settings = SearchSettings(batch_size=batch, schedules=SEARCHED if args.schedule == "auto" else (args.schedule,),
                              memory_limit=args.memory_limit is not False, step=step,
                              max_microbatches=args.max_microbatches, depths=tuple(args.depth) if args.depth else None,
                              microbatches=args.microbatches)
    model = args.model or profile.resolve().parent.name
    options = search(graph, cluster, settings)
    pipedream = pipedream_plan(graph, cluster, model=model, step=step, memory_limit=args.memory_limit)
    dp_s = pipedream.dp_time_per_sample_s
    weigh = args.schedule == "auto" and args.runtime != "torch"  # PipeDream's own plan runs on our runtime only
    plan = to_plan(options, graph, cluster, settings, model=model, pipedream=pipedream if weigh else None,
                   dp_time_per_sample_s=dp_s)
    if "granularity" in meta:  # the runtime cuts the model at the granularity the node ids were profiled at
        plan.extra["granularity"] = str(meta["granularity"])
    csv_path = None
    if args.runtime == "torch":
        from pipedream.torch_export import torch_section, write_schedule_csv

        modules = meta.get("modules", {})
        if not isinstance(modules, dict):
            raise PipeDreamError(f"'modules' in the meta.json beside {profile} is not an object; profile the model again")
        plan.extra.update({"runtime": "torch", "torch": torch_section(plan, graph, modules)})
        if args.export == "torch":
            csv_path = Path(args.out).with_name(Path(args.out).stem + ".schedule.csv")
            write_schedule_csv(plan.extra["torch"], csv_path)
    plan.save(args.out)
    print(format_plan(plan))
    rows = plan.extra["schedules"]
    print()
    print(format_schedules(rows if args.explain else rows[:1]))
    note = plan.extra.get("torch", {}).get("split_spec_note")
    if note:
        print(f"\n{note}")
    print(f"\nwrote {args.out}" + (f" and {csv_path}" if csv_path else ""))
    return 0
