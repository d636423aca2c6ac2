"""The predicted Table 1: V100 profiles + paper clusters -> planner -> simulator -> speedup over DP.

For every row of the paper's Table 1 with a profile, the model is planned for the row's cluster
(:func:`pipedream.planner.plan_pipeline`) and both PipeDream (1F1B-RR on the plan) and data
parallelism are simulated (:mod:`pipedream.sim`); the predicted epoch-time speedup is DP epoch
time / PipeDream epoch time, as in the paper's Table 1. The paper's own configuration is simulated too
(split by :mod:`pipedream.planner.fixed_split`), which separates planner differences from model differences.

DP baseline (paper §5.1): PyTorch's DistributedDataParallel with NCCL (the release's DP driver). DDP
reduces gradient buckets while the backward is still running (wait-free backpropagation); NCCL rings are
ring-shaped: PyTorch 1.1 shipped NCCL 2.4, whose ring runs through all ``n`` GPUs so every server's NIC
carries ``2 (n - 1) / n`` of the gradient bytes. So the default here is ``allreduce="ring"`` with
``overlap=True`` for DP and for PipeDream's replicated stages (the release wraps them in DDP too); the
hierarchical (2D) allreduce, which moves only ``2 (s - 1) / s`` per NIC for ``s`` servers, and DP without
overlap are reported as alternatives. PipeDream runs what our runtime runs: 1F1B-RR with the consistent warm-up
(:func:`pipedream.schedules.warmup_count_consistent`), replicas synchronised in lockstep. Two variants show
what that choice is worth: the release runtime's warm-up counts (``warmup="release"``, ``--compat``) and
``sync="independent"`` replicas (§3.1's assumption). The plan is the default planner's, which re-ranks its
candidates with this simulator (:mod:`pipedream.planner.rerank`); ``dp_cost_model_speedup`` is what its
dynamic program alone estimated for its own choice.

For the GNMT rows whose paper config is a pipeline, what the release's driver config ran is simulated too
(``release_run_speedup``): its own stage modules on the ranks its stage map names
(:mod:`pipedream.table1.release_runs`, ``experiments/release_runs.yaml``; on the multi-server rows "straight" on
fewer GPUs than the row has). Where the paper's config simulates faster than the paper measured,
``pipedream_outer_Bps_matching_paper`` is the bandwidth between servers at which PipeDream (DP kept at line
rate) would be as slow as measured, the counterpart of ``dp_outer_Bps_matching_paper``, and
``tokens_scale_matching_paper`` the work per minibatch (compute and activations, times the profile's) at which
it would be, links at line rate.

Only a V100-scale profile gives a row numbers: the release's V100 profile, or a user profile whose meta.json
has :data:`V100_SCALE_KEY` (a reduced model's CPU profile says nothing about the paper's V100 run); other rows
say :data:`NO_PROFILE` and have no predicted columns. ``loo_*`` (:mod:`pipedream.table1.calibration`): each
row again with DP's allreduce between servers at the fraction of line rate fitted on the other rows of its
cluster (leave-one-out); ``dp_fraction_matching_paper``, the fraction at which this row alone would match the
paper, only explains the gap.

What-if tables (other clusters, today's H100) are in :mod:`pipedream.table1.whatif`; the files are written by
:mod:`pipedream.table1.predicted_files`.
"""

from __future__ import annotations

import functools
import math
import multiprocessing as mp
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from pipedream import costmodel
from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph, profiled_batch, read_meta
from pipedream.paths import RELEASE_PROFILES
from pipedream.plan import Plan
from pipedream.planner import plan_pipeline
from pipedream.planner.fixed_split import replicas_of
from pipedream.planner.rerank import _split_plan
from pipedream.sim import IMAGENET_TRAIN_SAMPLES, SimOptions, simulate_dp, simulate_plan
from pipedream.sim.costs import stage_costs
from pipedream.sim.network import Network
from pipedream.table1 import calibration
from pipedream.table1.explain import THRESHOLD
from pipedream.table1.release_runs import RELEASE_RUNS_FILE, ReleaseRun, load_release_runs, release_run_plan
from pipedream.table1.table import read_paper_table
from pipedream.topology import Cluster, get_cluster

# paper model -> (release profile folder, per-GPU batch of paper §5.1); the profiled minibatch is in the
# meta.json beside each release profile
PAPER_MODELS = {"vgg16": ("vgg16", 64), "resnet50": ("resnet50", 128), "alexnet": ("alexnet", 256),
                "gnmt8": ("gnmt", 64), "gnmt16": ("gnmt_large", 64)}
# samples per epoch (only epoch times depend on these, never the speedups)
DATASET_SAMPLES = {"imagenet": IMAGENET_TRAIN_SAMPLES, "synthetic": IMAGENET_TRAIN_SAMPLES,
                   "wmt16_en_de": 4_500_000, "penn_treebank": 929_589, "msvd": 1_200}
ALLREDUCE = "ring"  # NCCL 2.4's flat ring, what the paper's DDP baseline ran (see the module docstring)
# a row whose profile is neither the release's V100 profile nor brought to V100 scale: no predicted number
NO_PROFILE = "no V100-scale profile"
# meta.json key of a user profile brought to V100 scale: true, or a sentence saying how (e.g. "measured on a V100 16
# GB at the paper's model size and batch"); without it a user profile (e.g. a reduced model's on the CPU) says
# nothing about the paper's V100 runs
V100_SCALE_KEY = "v100_scale"


@dataclass
class Profile:
    """A profile ready to plan and simulate: the graph at the training batch, where it came from, and whether it
    stands for the paper's V100s (the release's profile, or a meta.json with :data:`V100_SCALE_KEY`)."""

    graph: LayerGraph
    path: str
    hardware: str
    profiled_batch: int
    batch: int
    v100_scale: bool = False


def find_profile(model: str, profiles_dir: Path, release: bool = True) -> Profile | None:
    """The V100 release profile of a paper model (if ``release``), else ``<profiles_dir>/<model>/graph.txt``
    (with its meta.json; at V100 scale where it has a true :data:`V100_SCALE_KEY`), else None."""
    if release and model in PAPER_MODELS:
        folder, batch = PAPER_MODELS[model]
        path = RELEASE_PROFILES / folder / "graph.txt"
        if path.is_file():
            mb = profiled_batch(path)
            return Profile(LayerGraph.read(path, mb).scaled(batch), str(path), "V100 (release)", mb, batch, True)
    path = profiles_dir / model / "graph.txt"
    if not path.is_file():
        return None
    if "minibatch_size" not in read_meta(path):
        raise PipeDreamError(f"{path}: no minibatch_size in the meta.json beside it; re-run `pipedream profile`")
    mb, meta = profiled_batch(path), read_meta(path)
    return Profile(LayerGraph.read(path, mb), str(path), str(meta.get("device", "unknown")), mb, mb,
                   bool(meta.get(V100_SCALE_KEY)))


def get_plan(model: str, prof: Profile, cluster: Cluster, plans_dir: Path | None) -> tuple[Plan, str]:
    """``<plans_dir>/<model>/<cluster>.json`` if it exists, else a fresh plan from the planner."""
    if plans_dir is not None:
        path = plans_dir / model / f"{cluster.name}.json"
        if path.is_file():
            return Plan.load(path), str(path)
    return plan_pipeline(prof.graph, cluster, model=model, minibatch_size=prof.batch), "planner"


def _outer_scaled(cluster: Cluster, factor: float) -> Cluster:
    levels = [*cluster.levels[:-1], (cluster.levels[-1][0], cluster.levels[-1][1] * factor)]
    return Cluster(name=f"{cluster.name}*{factor:.3g}", levels=levels, device_memory_bytes=cluster.device_memory_bytes,
                   latency_s=cluster.latency_s)


def _bandwidth_for(at: Callable[[float], float], cluster: Cluster, target_epoch_s: float,
                   lo: float, hi: float) -> float | None:
    """Outermost-level bandwidth (bytes/s), between ``lo`` and ``hi`` times line rate, at which ``at`` (epoch
    time in s with the outermost level at a fraction of line rate) is ``target_epoch_s`` (12 bisection steps on
    a log scale); None when the target is outside that range. ``at`` must not grow with the fraction."""
    if not at(hi) <= target_epoch_s <= at(lo):
        return None
    for _ in range(12):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if at(mid) > target_epoch_s else (lo, mid)
    return cluster.levels[-1][1] * math.sqrt(lo * hi)


def _options(dataset: int) -> SimOptions:
    """How every row simulates: an epoch of ``dataset`` samples, the paper's DDP allreduce (:data:`ALLREDUCE`)."""
    return SimOptions(dataset_size=dataset, allreduce=ALLREDUCE)


def dp_epoch_at(graph: LayerGraph, cluster: Cluster, fraction: float, dataset: int) -> float:
    """Simulated DP epoch time (s) with the outermost level of ``cluster`` at ``fraction`` x its bandwidth (the
    paper's DDP baseline, :data:`ALLREDUCE`; :func:`pipedream.sim.simulate_dp`)."""
    return simulate_dp(graph, _outer_scaled(cluster, fraction), _options(dataset)).epoch_time_s


def dp_bandwidth_for(graph: LayerGraph, cluster: Cluster, target_epoch_s: float, dataset: int) -> float | None:
    """Outermost-level bandwidth (bytes/s) at which simulated DP takes ``target_epoch_s`` (bisection, log scale)."""
    return _bandwidth_for(lambda f: dp_epoch_at(graph, cluster, f, dataset), cluster, target_epoch_s, 1e-3, 1e2)


def pipedream_bandwidth_for(graph: LayerGraph, plan: Plan, cluster: Cluster, target_epoch_s: float,
                            dataset: int) -> float | None:
    """Outermost-level bandwidth (bytes/s), at most line rate, at which ``plan`` simulates in ``target_epoch_s``
    (bisection, log scale): how slow PipeDream's links must be for a measured epoch, with DP untouched."""
    return _bandwidth_for(lambda f: simulate_plan(graph, plan, _outer_scaled(cluster, f), _options(dataset)).epoch_time_s,
                          cluster, target_epoch_s, 1e-3, 1.0)


def tokens_scale_for(graph: LayerGraph, plan: Plan, cluster: Cluster, speedup: float, dataset: int) -> float | None:
    """How many times the profile's work per minibatch (compute and activations, not weights: e.g. longer
    sentences) makes ``plan`` only ``speedup`` times faster than DP, links at line rate (bisection over
    whole samples, up to 16x); None if the profile itself is slower or 16x is still faster."""
    def ratio(batch: int) -> float:
        g = graph.scaled(batch)
        return (simulate_dp(g, cluster, _options(dataset)).epoch_time_s
                / simulate_plan(g, plan, cluster, _options(dataset)).epoch_time_s)

    lo, hi = graph.minibatch_size, 16 * graph.minibatch_size
    if not ratio(hi) <= speedup <= ratio(lo):
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ratio(mid) > speedup else (lo, mid)
    return hi / graph.minibatch_size


def predict(model: str, prof: Profile, cluster: Cluster, dataset: int, *, paper_config: str | None = None,
            paper_speedup: float | None = None, plans_dir: Path | None = None) -> dict[str, Any]:
    """One predicted row: plan, simulate PipeDream and DP, the paper's config, and diagnostics."""
    g = prof.graph
    plan, plan_source = get_plan(model, prof, cluster, plans_dir)
    pd_res = simulate_plan(g, plan, cluster, _options(dataset))
    dp = simulate_dp(g, cluster, _options(dataset))
    dp_serial = simulate_dp(g, cluster, replace(_options(dataset), overlap=False, allreduce="ring"))
    dp_hier = simulate_dp(g, cluster, replace(_options(dataset), allreduce="hierarchical"))
    replicated = any(s.replicas > 1 for s in plan.stages) and len(plan.stages) > 1
    pd_release = simulate_plan(g, plan, cluster, replace(_options(dataset), warmup="release")) if replicated else pd_res
    pd_ind = simulate_plan(g, plan, cluster, replace(_options(dataset), sync="independent")) if replicated else pd_res
    solver_est = plan.extra.get("solver_estimate") or {}
    row: dict[str, Any] = {
        "predicted_config": plan.config, "plan_source": plan_source,
        "predicted_speedup": dp.epoch_time_s / pd_res.epoch_time_s,
        "planner_estimate_speedup": plan.predicted_speedup,
        "dp_cost_model_config": solver_est.get("config", plan.config),
        "dp_cost_model_speedup": (solver_est["dp_time_per_sample_s"] / solver_est["time_per_sample_s"]) if solver_est
        else plan.predicted_speedup,
        "release_warmup_speedup": dp.epoch_time_s / pd_release.epoch_time_s,
        "independent_replicas_speedup": dp.epoch_time_s / pd_ind.epoch_time_s,
        "dp_hierarchical_speedup_of_dp": dp.epoch_time_s / dp_hier.epoch_time_s,
        "dp_hierarchical_comm_stall": dp_hier.comm_stall_fraction,
        "pipedream_epoch_time_s": pd_res.epoch_time_s, "dp_epoch_time_s": dp.epoch_time_s,
        "pipedream_steady_bubble": pd_res.steady_bubble_fraction,
        "dp_comm_stall_fraction": dp.comm_stall_fraction,
        "dp_no_overlap_flat_ring_stall": dp_serial.comm_stall_fraction,
        "pipedream_p2p_bytes_per_sample": pd_res.p2p_bytes_per_sample,
        "pipedream_allreduce_bytes_per_sample": pd_res.allreduce_bytes_per_sample,
        "dp_bytes_per_sample": dp.allreduce_bytes_per_sample,
    }
    if paper_config is None:
        best = plan.config if row["predicted_speedup"] > 1.0 else str(cluster.workers)
        row.update(simulator_best_config=best, simulator_best_speedup=max(row["predicted_speedup"], 1.0))
        return row
    ref_plan = _config_plan(g, cluster, paper_config, plan)
    ref = dp if ref_plan is None else pd_res if ref_plan is plan else simulate_plan(g, ref_plan, cluster,
                                                                                     _options(dataset))
    row["paper_config_predicted_speedup"] = dp.epoch_time_s / ref.epoch_time_s
    row["paper_config_period_s"] = ref.time_per_minibatch_s if ref.schedule != "dp" else math.nan
    params = g.param_bytes_of(g.nodes)  # a tied tensor once
    row["param_bytes"] = params
    row["compute_s_per_minibatch"] = sum(n.fwd_s + n.bwd_s for n in g.nodes.values() if not n.is_input)
    # DP's weight sync as the simulator times it: one allreduce per DDP bucket, latency included
    dp_buckets = stage_costs(g, [list(g.nodes)], g.minibatch_size)[0].buckets
    net, dp_ranks = Network(cluster, ALLREDUCE), list(range(cluster.workers))
    row["dp_buckets"] = len(dp_buckets)
    row["dp_allreduce_s"] = sum(net.allreduce_time(dp_ranks, nbytes) for _, nbytes in dp_buckets)
    # bytes each rank sends in that ring (its link's share): the ring's total over its ranks
    row["dp_link_bytes"] = costmodel.ring_allreduce_bytes(params, cluster.workers) / cluster.workers
    row["dp_iteration_s"] = dp.time_per_minibatch_s * cluster.workers  # one minibatch per worker per iteration
    run = release_run_of(model, prof, cluster)
    run_plan = release_run_plan(run, cluster) if run is not None else None
    if run is not None and run_plan is not None:  # every such row alike: the release's modules on its ranks
        run_res = simulate_plan(g, run_plan, cluster, _options(dataset))
        row.update(release_planned_config=run.planned if run.planned is not None else math.nan,
                   release_run_source=run.source, release_run_config=run.describe(cluster.workers),
                   release_run_speedup=dp.epoch_time_s / run_res.epoch_time_s,
                   release_run_period_s=run_res.time_per_minibatch_s)
    row["paper_config_bubble"] = ref.steady_bubble_fraction if ref.schedule != "dp" else math.nan
    slowest = max((n for n in g.nodes.values() if not n.is_input), key=lambda n: n.fwd_s + n.bwd_s)
    row["slowest_layer"] = f"{slowest.node_id} {slowest.desc.split('(')[0]}"
    row["slowest_layer_s"] = slowest.fwd_s + slowest.bwd_s
    twins = sorted(n.fwd_s + n.bwd_s for n in g.nodes.values() if n.desc == slowest.desc and n is not slowest)
    row["slowest_layer_twins_median_s"] = twins[len(twins) // 2] if twins else math.nan
    row["balanced_stage_s"] = sum(n.fwd_s + n.bwd_s for n in g.nodes.values() if not n.is_input) / cluster.workers
    row["paper_config_speedup_if_dp_not_overlapped"] = dp_serial.epoch_time_s / ref.epoch_time_s
    choices = {str(cluster.workers): 1.0, paper_config: row["paper_config_predicted_speedup"],
               plan.config: row["predicted_speedup"]}
    row["simulator_best_config"] = max(choices, key=choices.__getitem__)
    row["simulator_best_speedup"] = choices[row["simulator_best_config"]]
    if paper_speedup is not None and not math.isnan(paper_speedup):
        row["rel_error"] = row["predicted_speedup"] / paper_speedup - 1
        row["paper_config_rel_error"] = row["paper_config_predicted_speedup"] / paper_speedup - 1
        short = row["paper_config_rel_error"] < -THRESHOLD and ref.schedule != "dp"
        bw = dp_bandwidth_for(g, cluster, paper_speedup * ref.epoch_time_s, dataset) if short else None
        row["dp_outer_Bps_matching_paper"] = bw if bw is not None else math.nan
        slow = row["paper_config_rel_error"] > THRESHOLD and ref_plan is not None
        target = run_plan if run_plan is not None else ref_plan  # what the paper's number was measured on
        bw = pipedream_bandwidth_for(g, target, cluster, dp.epoch_time_s / paper_speedup, dataset) \
            if slow and target is not None else None
        row["pipedream_outer_Bps_matching_paper"] = bw if bw is not None else math.nan
        k = tokens_scale_for(g, target, cluster, paper_speedup, dataset) if slow and target is not None else None
        row["tokens_scale_matching_paper"] = k if k is not None else math.nan
    return row


def release_run_of(model: str, prof: Profile, cluster: Cluster) -> ReleaseRun | None:
    """What the release ran for the row ``(model, cluster)`` (:func:`pipedream.table1.release_runs.load_release_runs`)
    if it has a run there and ``prof`` is the release profile the run's node ids refer to, else None.

    Raises:
        PipeDreamError: a malformed ``experiments/release_runs.yaml``, or a run whose batch is not the profile's.
    """
    run = load_release_runs().get((model, cluster.name))
    if run is None or Path(prof.path).resolve() != (RELEASE_PROFILES / run.profile / "graph.txt").resolve():
        return None
    if run.batch_size != prof.batch:
        raise PipeDreamError(f"release run of {model} {cluster.name} has batch {run.batch_size} per GPU but the "
                             f"profile is simulated at {prof.batch}; fix {RELEASE_RUNS_FILE} or PAPER_MODELS")
    return run


def _config_plan(g: LayerGraph, cluster: Cluster, config: str, plan: Plan) -> Plan | None:
    """The plan a paper config string runs on ``cluster``: None for data parallelism (``"16"``-style), ``plan``
    itself if it has the same replica counts, else our split of the config."""
    reps = replicas_of(config, cluster.workers)
    if len(reps) == 1:
        return None
    if reps == [s.replicas for s in plan.stages]:
        return plan
    ref = _split_plan(g, cluster, reps, plan.model, g.minibatch_size)  # as `pipedream simulate` would run it
    if ref is None:
        raise PipeDreamError(f"config {config!r} has more stages than {plan.model} has layers")
    return ref


def _hardware(p: Mapping[str, Any]) -> str:
    """A row's cluster and shape as the paper's table gives them, e.g. ``"A 4x4"``."""
    return f"{p['cluster']} {p['servers']}x{p['gpus_per_server']}"


def _row_label(model: str, p: Mapping[str, Any]) -> str:
    return f"{model} {_hardware(p)}"


def _cluster_of(p: Mapping[str, Any], clusters_path: Path) -> Cluster:
    """The cluster of a row of the paper's table (``A_4x4``-style names in the clusters file)."""
    return get_cluster(_hardware(p).replace(" ", "_"), clusters_path)


def _unpredicted(profiles_dir: Path, model: str, prof: Profile | None) -> dict[str, Any]:
    """The columns of a row without a V100-scale profile: status, which profile there is (if any), no numbers."""
    if prof is None:
        where = f"none ({profiles_dir / model / 'graph.txt'} absent)"
        return {"predicted_config": NO_PROFILE, "prediction_status": NO_PROFILE, "profile": where,
                "predicted_speedup": math.nan, "rel_error": math.nan}
    why = (f"{prof.path} is a {prof.hardware} profile at {prof.profiled_batch} samples per minibatch, and its "
           f"meta.json does not say it was brought to V100 scale ({V100_SCALE_KEY})")
    return {"predicted_config": NO_PROFILE, "prediction_status": NO_PROFILE, "profile": why,
            "profile_hardware": prof.hardware, "profiled_batch": prof.profiled_batch,
            "predicted_speedup": math.nan, "rel_error": math.nan}


def _predicted_row(p: dict[str, Any], clusters_path: Path, profiles_dir: Path,
                   plans_dir: Path | None) -> dict[str, Any]:
    """One row of the paper's Table 1 (``p``, its columns) predicted (:func:`predict`) where a V100-scale profile
    exists: plan, re-ranking and simulation of the row's model on the row's cluster, independent of every other
    row (rows run in parallel in :func:`build_tables`)."""
    model = str(p["model"])
    cluster = _cluster_of(p, clusters_path)
    row: dict[str, Any] = {"row": _row_label(model, p), "model": model,
                           "hardware": _hardware(p),
                           "cluster": cluster.name, "paper_config": str(p["pipedream_config"]),
                           "paper_speedup": float(p["speedup_epoch_time"])}
    prof = find_profile(model, profiles_dir)
    if prof is None or not prof.v100_scale:
        row.update(_unpredicted(profiles_dir, model, prof))
        return row
    dataset = DATASET_SAMPLES.get(str(p["dataset"]), IMAGENET_TRAIN_SAMPLES)
    row.update(prediction_status="predicted", profile=prof.path, profile_hardware=prof.hardware,
               profiled_batch=prof.profiled_batch, batch_per_gpu=prof.batch, dataset_samples=dataset)
    row.update(predict(model, prof, cluster, dataset, paper_config=row["paper_config"],
                       paper_speedup=row["paper_speedup"], plans_dir=plans_dir))
    bw = None if calibration.is_dp_config(row["predicted_config"]) else dp_bandwidth_for(
        prof.graph, cluster, row["paper_speedup"] * row["pipedream_epoch_time_s"], dataset)
    row["dp_fraction_matching_paper"] = math.nan if bw is None else bw / cluster.levels[-1][1]
    return row


def build_tables(paper_table: Path, clusters_path: Path, profiles_dir: Path, plans_dir: Path | None,
                 models: list[str] | None = None, jobs: int = 1) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every row of the paper's Table 1 (``models`` only, if given), predicted where a V100-scale profile exists,
    with the leave-one-out calibration of DP's link speed (:mod:`pipedream.table1.calibration`); and that
    calibration's per-cluster summary (:func:`pipedream.table1.calibration.group_summary`). ``jobs`` processes
    predict the rows (forked from this one; 1: here, one after another); the table is the same either way."""
    paper = read_paper_table(paper_table)
    todo = [p.to_dict() for _, p in paper.iterrows() if not models or str(p["model"]) in models]
    if not todo:
        raise PipeDreamError(f"no rows of {paper_table} match models {models}")
    row_of = functools.partial(_predicted_row, clusters_path=clusters_path, profiles_dir=profiles_dir,
                               plans_dir=plans_dir)
    if jobs > 1 and len(todo) > 1:
        with ProcessPoolExecutor(min(jobs, len(todo)), mp_context=mp.get_context("fork")) as pool:
            rows = list(pool.map(row_of, todo))
    else:
        rows = [row_of(p) for p in todo]
    speedup_at, graphs = {}, {}  # each predicted model's profile read once here (the rows read it in their process)
    for i, row in enumerate(rows):
        if row.get("prediction_status") == "predicted":
            if row["model"] not in graphs:
                prof = find_profile(row["model"], profiles_dir)
                assert prof is not None
                graphs[row["model"]] = prof.graph
            speedup_at[i] = calibration.cached(functools.partial(
                _speedup_at, graphs[row["model"]], _cluster_of(todo[i], clusters_path), row["dataset_samples"],
                row["pipedream_epoch_time_s"]))
    df = pd.DataFrame(rows)
    cal_rows = calibration.rows_of(df, speedup_at)
    loo = calibration.loo_columns(cal_rows)
    return pd.concat([df, loo], axis=1), calibration.group_summary(cal_rows, loo)


def _speedup_at(graph: LayerGraph, cluster: Cluster, dataset: int, pipedream_epoch_s: float, fraction: float) -> float:
    """Predicted speedup (DP epoch / PipeDream epoch) with DP's outermost level at ``fraction`` x line rate and
    PipeDream's simulation (``pipedream_epoch_s``, s) at line rate (:func:`dp_epoch_at`)."""
    return dp_epoch_at(graph, cluster, fraction, dataset) / pipedream_epoch_s


def build_table(paper_table: Path, clusters_path: Path, profiles_dir: Path, plans_dir: Path | None,
                models: list[str] | None = None) -> pd.DataFrame:
    """The predicted Table 1 of :func:`build_tables`, without the calibration summary."""
    return build_tables(paper_table, clusters_path, profiles_dir, plans_dir, models)[0]
