"""The prediction of a ``pipedream train`` run, made before it starts (docs/simulator.md, "The prediction check").

:func:`predict_run` puts together what the simulator's :func:`pipedream.sim.predict.predict_epoch` needs from the
run: the epoch its workers will train (:func:`epoch_shape`, from the functions the workers call), its profile's
measured costs (:mod:`pipedream.sim.profiled`), its plan and cluster, and the host its workers share. This
module sits above both the simulator and the runtime, so that neither imports the other.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pipedream import memory
from pipedream.baselines import ddp
from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph, profiled_batch, read_meta
from pipedream.paths import shipped
from pipedream.placement import ranks_per_host
from pipedream.plan import Plan
from pipedream.runtime import worker
from pipedream.runtime.config import TrainConfig
from pipedream.runtime.distributed import uses_cuda
from pipedream.runtime.task import load_datasets
from pipedream.sim.cores import Host, host_cores
from pipedream.sim.predict import EpochShape, Prediction, RunCosts, checkpoint_flush_s, emulated_cluster, predict_epoch
from pipedream.sim.profiled import missing_step_rate, profiled_composition, profiled_data_s, step_rates
from pipedream.sim.simulate import MICROBATCHED
from pipedream.topology import get_cluster


def epoch_shape(cfg: TrainConfig, mode: str, num_samples: int, workers: int, replicas: list[int]) -> EpochShape:
    """The epoch the run's workers train, from the same functions the workers call.

    PipeDream: :func:`pipedream.runtime.worker.minibatches_per_epoch` minibatches of ``cfg.batch_size``
    (GPipe, 2BW and PipeDream-Flush: ``cfg.microbatches`` microbatches of ``batch_size / microbatches`` each; on
    torch's runtime, :mod:`pipedream.runtime.torch_worker`, one of the ``w = replicas[0]`` pipelines, which takes
    ``batch_size / w`` samples of each minibatch in ``cfg.microbatches`` microbatches). DP
    (:func:`pipedream.baselines.ddp.minibatches_per_epoch`): ``per_worker``, each worker takes whole
    minibatches of ``cfg.batch_size`` in turn; ``global``, every minibatch is split over the workers, so the
    simulator's round robin deals ``workers`` shares of ``batch_size / workers`` per minibatch.

    Raises:
        PipeDreamError: an unknown mode, or the workers' own checks (too few samples).
    """
    if mode == "dp":
        nb, _ = ddp.minibatches_per_epoch(cfg, num_samples, workers)
        per_action = cfg.batch_size if cfg.dp_batch == "per_worker" else cfg.batch_size // workers
        return EpochShape("dp", per_action, 1, nb, nb * cfg.batch_size)
    if mode != "pipedream":
        raise PipeDreamError(f"unknown mode {mode!r}; use pipedream or dp")
    nb = worker.minibatches_per_epoch(cfg, num_samples, replicas)
    if cfg.runtime == "torch":  # w pipelines share each minibatch; one pipeline's epoch is simulated
        w = replicas[0]
        return EpochShape(cfg.schedule, cfg.batch_size // (w * cfg.microbatches), cfg.microbatches, nb,
                          nb * cfg.batch_size // w)
    m = cfg.microbatches if cfg.schedule in MICROBATCHED else 1
    return EpochShape(cfg.schedule, cfg.batch_size // m, m, nb, nb * cfg.batch_size, cfg.recompute)


def predict_run(cfg: TrainConfig, mode: str, plan: Plan, profile: Path, clusters_file: Path | str, *,
                num_samples: int, host: Host | None) -> Prediction:
    """Predict the epoch time of a ``pipedream train`` run before it starts.

    Args:
        cfg: the run's training config (schedule, batch size, optimizer, link throttle, ...).
        mode: ``pipedream`` (the plan's stages and ranks) or ``dp`` (the whole model on the plan's workers).
        plan: the run's plan (DP runs use its cluster and worker count).
        profile: the ``graph.txt`` the plan came from (its ``meta.json`` beside it).
        clusters_file: the clusters YAML the plan's cluster is read from (a relative path not found here is
            looked up in the checkout).
        num_samples: training samples of the run (:func:`training_samples`).
        host: the CPU hosts the workers share (:class:`pipedream.sim.cores.Host`); None: one GPU per worker.
    Raises:
        PipeDreamError: unknown cluster, a profile without its minibatch size, or the simulator's checks.
    """
    graph = LayerGraph.read(profile, profiled_batch(profile))
    cluster = emulated_cluster(get_cluster(plan.cluster, shipped(clusters_file)), cfg.emulate_bandwidth_Bps)
    if plan.workers > cluster.workers:
        raise PipeDreamError(f"plan {plan.config!r} uses {plan.workers} workers but cluster {cluster.name!r} "
                             f"has {cluster.workers}")
    shape = epoch_shape(cfg, mode, num_samples, plan.workers, [s.replicas for s in plan.stages])
    if mode == "dp":
        stage_nodes, stage_ranks = [list(graph.nodes)], [list(range(plan.workers))]
    else:
        plan.validate()
        stage_nodes, stage_ranks = [s.nodes for s in plan.stages], [list(s.ranks) for s in plan.stages]
        if cfg.runtime == "torch":  # the first of the w parallel pipelines (their gradient average is not timed)
            stage_ranks = [ranks[:1] for ranks in stage_ranks]
    meta = read_meta(profile)
    costs = RunCosts(host=host, step=step_rates(meta, cfg.optimizer), bucket_bytes=cfg.bucket_bytes,
                     warmup=cfg.warmup if mode == "pipedream" else None, data_s=profiled_data_s(meta),
                     composition=profiled_composition(meta, graph))
    pred = predict_epoch(graph, stage_nodes, stage_ranks, cluster, shape, costs)
    pred.memory = predict_memory(cfg, mode, graph, stage_nodes, [len(r) for r in stage_ranks], shape)
    if cfg.checkpoint_every is not None:  # what a checkpoint's flush adds (docs/checkpoints.md)
        pred.checkpoint_flush_s = checkpoint_flush_s(graph, stage_nodes, stage_ranks, cluster, pred, costs)
    return pred


def predict_memory(cfg: TrainConfig, mode: str, graph: LayerGraph, stage_nodes: list[list[str]], replicas: list[int],
                   shape: EpochShape) -> list[dict[str, float]]:
    """Per stage, the bytes one replica of the run holds at its peak (:func:`pipedream.memory.plan_memory`
    on the profile scaled to the run's (micro)batch, the run's schedule, optimizer and momentum), as dicts
    of the kinds and ``total``; ``shape.recompute`` counts one (micro)batch's activations, the one being
    recomputed. DP is one stage on every worker, one minibatch in flight."""
    scaled = graph.scaled(shape.batch_size)
    vertical = cfg.schedule == "1f1b" and cfg.weight_sync == "vertical"
    schedule = "dp" if mode == "dp" else "vertical" if vertical else cfg.schedule
    need = memory.plan_memory(scaled, stage_nodes, replicas, schedule=schedule, microbatches=shape.microbatches,
                              warmup=cfg.warmup, optimizer=cfg.optimizer, momentum=cfg.momentum,
                              recompute=shape.recompute)
    return [m.as_dict() for m in need]


def training_samples(cfg: TrainConfig) -> int:
    """Training samples of the run: the length of the training set its workers load
    (:func:`pipedream.runtime.task.load_datasets`: the subset of ``cfg.train_subset``, real or synthetic), read
    without building the model."""
    return len(load_datasets(cfg)[0])


def run_host(workers: int, nnodes: int) -> Host | None:
    """The hosts a run's ``workers`` share: this host's cores (:func:`pipedream.sim.cores.host_cores`), the workers
    spread evenly over ``nnodes`` nodes (:func:`pipedream.placement.ranks_per_host`); None on GPUs (the workers do
    not share the CPU's cores)."""
    if uses_cuda():
        return None
    return Host(cores=host_cores(), ranks_per_host=ranks_per_host(workers, nnodes))


def predict(args: argparse.Namespace, cfg: TrainConfig, plan: Plan | None) -> tuple[dict[str, Any], str | None]:
    """The run's prediction (:func:`predict_run`) as a dict, or ``({}, why not)``: a failure to predict is reported
    in one line, never raised (the run goes on). ``args``: ``pipedream train``'s (``mode``, ``profile``,
    ``clusters``, ``nnodes``)."""
    if plan is None or args.profile is None:
        return {}, "no --plan and --profile to predict the epoch time from"
    try:
        pred = predict_run(cfg, args.mode, plan, Path(args.profile), args.clusters, num_samples=training_samples(cfg),
                           host=run_host(plan.workers, args.nnodes))
    except Exception as e:  # any failure of the model must leave the run itself alone
        why = (str(e).splitlines() or [""])[0] or type(e).__name__
        print(f"warning: no predicted epoch time: {why}", file=sys.stderr)
        return {}, why
    if missing_step_rate(Path(args.profile), cfg.optimizer):
        print(f"warning: the profile timed no {cfg.optimizer} step (meta.json optimizer_step_s_per_param_byte): the "
              f"prediction leaves the optimizer step out; profile again with --optimizers {cfg.optimizer}",
              file=sys.stderr)
    if args.mode == "pipedream" and plan.optimizer and plan.optimizer != cfg.optimizer:
        print(f"warning: the plan charged {plan.optimizer}'s optimizer step, this run trains with {cfg.optimizer}: plan "
              f"again with `pipedream plan --optimizer {cfg.optimizer}` for a split balanced for its step",
              file=sys.stderr)
    compute = "/".join(f"{c:.1f}" for c in pred.compute_s)
    wait = "/".join(f"{w:.1f}" for w in pred.wait_s)
    print(f"predicted epoch {pred.epoch_s:.2f} s (per stage: compute {compute} s, wait {wait} s; "
          f"{pred.cores or 'no'} shared cores a host)", file=sys.stderr)
    return pred.to_dict(), None
