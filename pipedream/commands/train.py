"""Train a model with PipeDream (a plan's pipeline) or data parallelism on local worker processes.

A thin layer over :func:`pipedream.train` (:mod:`pipedream.api`): check the options (before anything is written),
prepare the staging folder ``<out-dir>.partial`` (:mod:`pipedream.rundir`), predict the epoch time, open the MLflow
run, then train with ``launcher="torchrun"`` (the PipeDream worker or the DDP baseline, supervised: progress to
stderr and ``<out-dir>/train.log``), logging each epoch as the workers append it to ``metrics.json``. Then the
saved epochs are scored, the final metrics logged and ``run.json`` written last, as the completion marker, before
the staging folder replaces ``<out-dir>``. A failed or killed worker ends the whole job with one ``error:`` line
and a non-zero exit, and its MLflow run is marked FAILED with the epochs it finished.

Time-to-accuracy is the first epoch's ``wall_time_s`` whose validation metric meets ``--threshold``. BLEU
(``bleu``, ``bleu4``) needs whole decoded sequences, so with a threshold on it (or ``--score-epochs``) the workers
save the model at the end of every epoch and after training this process scores each one
(:func:`pipedream.runtime.assemble.epoch_metrics`) into its row of ``metrics.json`` and MLflow; neither the saving
nor the scoring counts towards time-to-accuracy.

The predicted epoch time (:func:`pipedream.run_prediction.predict`) is logged as ``predicted_epoch_time_s``, and
``prediction_ratio`` = the measured mean epoch time after the first (:func:`steady_epochs`) / predicted, beside the
measured and predicted compute and wait seconds per stage; a prediction that cannot be made never fails the run
(tag ``prediction_error``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipedream.errors import PipeDreamError
from pipedream.io import atomic_write_json
from pipedream.paths import CLUSTERS
from pipedream.tracking import STORE_HELP

HELP = "train with PipeDream (a plan's pipeline) or data parallelism on local processes; log to MLflow"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``pipedream train``: the launcher's own, then one per :class:`TrainConfig` field."""
    from pipedream.runtime.config import CLI_HIDDEN
    from pipedream.runtime.config import add_arguments as add_train_arguments

    run = parser.add_argument_group("the run")
    run.add_argument("--mode", choices=("pipedream", "dp"), required=True,
                     help="pipedream: the plan's pipeline; dp: data parallelism (DistributedDataParallel)")
    run.add_argument("--workers", type=int, default=4,
                     help="worker processes in all, split evenly over --nnodes (one per GPU on CUDA)")
    run.add_argument("--experiment",
                     help=f"MLflow experiment (default: <model>/<cluster of the plan or cpuW>); the store: {STORE_HELP}")
    run.add_argument("--timeout-s", type=float, default=1800.0, help="limit for the whole run, s")
    run.add_argument("--max-restarts", type=int, default=0,
                     help="when a worker fails, restart the job up to this many times (torchrun's elastic agent); "
                          "it resumes from the newest complete checkpoint (implies --checkpoint; see "
                          "--checkpoint-every), each restart logged to MLflow")
    run.add_argument("--profile", type=Path,
                     help="the profile the plan came from (attached to the MLflow run; the epoch time is predicted "
                          "from it)")
    run.add_argument("--clusters", default=CLUSTERS,
                     help="clusters YAML the plan's cluster is read from, for the predicted epoch time")
    run.add_argument("--threshold", type=float,
                     help="target of time-to-accuracy and epochs-to-accuracy (logged as final metrics)")
    from pipedream.experiment import THRESHOLD_METRICS

    run.add_argument("--threshold-metric", choices=("accuracy", *THRESHOLD_METRICS), default="accuracy",
                     help="what --threshold is: validation accuracy 0-1, top-1 or token accuracy (padding excluded) "
                          "in percent, perplexity (lower is better), or the model's own BLEU (bleu, bleu4: 0-100, "
                          "scored after training on every epoch's saved model; implies --score-epochs)")
    run.add_argument("--keep-epoch-models", action="store_true",
                     help="keep the per-epoch models of --score-epochs in <out-dir>/epochs (default: deleted once "
                          "scored; each is a whole model)")
    nodes = parser.add_argument_group("several nodes")
    nodes.add_argument("--nnodes", type=int, default=1,
                       help="nodes of a multi-node run (start this same command on every node, e.g. with srun)")
    nodes.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="c10d rendezvous of a multi-node run")
    nodes.add_argument("--node-rank", type=int, default=0,
                       help="this node's index; only node 0 logs to MLflow (out-dir on a shared file system)")
    add_train_arguments(parser.add_argument_group("training (the same options as the workers')"), hide=CLI_HIDDEN)


def _config(args: argparse.Namespace, plan):  # type: ignore[no-untyped-def]
    """The run's TrainConfig from the options; ``plan`` (None: none) gives --runtime torch its schedule by default."""
    from pipedream.runtime.config import from_args

    if args.mode != "pipedream":  # DP runs take neither a plan's stages nor a pipeline runtime
        args.plan, args.runtime = None, "pipedream"
    if args.checkpoint_every is not None or args.max_restarts:  # a restart resumes from a checkpoint
        args.checkpoint = True
    cfg = from_args(args, plan.extra if plan is not None and args.runtime == "torch" else None)
    args.schedule, args.microbatches = cfg.schedule, cfg.microbatches  # --runtime torch: the plan's by default
    return cfg


def _params_and_tags(args: argparse.Namespace, cfg, config: str, cluster: str) -> tuple[dict, dict]:  # type: ignore[no-untyped-def,type-arg]
    """MLflow parameters and tags of the run; PipeDream-only settings only on PipeDream runs."""
    from pipedream.runtime.launch import WORKER_THREADS
    from pipedream.sim.cores import host_cores

    params = {"model": args.model, "preset": args.preset, "mode": args.mode, "config": config, "cluster": cluster,
              "workers": args.workers, "batch_size": args.batch_size, "lr": args.lr, "momentum": args.momentum,
              "weight_decay": args.weight_decay, "optimizer": args.optimizer, "seed": args.seed,
              "epochs": args.epochs, "data": args.data, "train_subset": args.train_subset or "all",
              "val_subset": args.val_subset or "all",
              "emulate_bandwidth_Bps": args.emulate_bandwidth_Bps or "none",
              "threshold": f"{args.threshold} {args.threshold_metric}" if args.threshold is not None else "none",
              "threads_per_worker": WORKER_THREADS, "host_cores": host_cores()}
    params.update(lr_policy=args.lr_policy, lr_warmup_epochs=args.lr_warmup_epochs, clip_norm=args.clip_norm,
                  checkpoint_every=args.checkpoint_every or ("epoch" if args.checkpoint else "none"),
                  max_restarts=args.max_restarts)
    if args.mode == "pipedream":
        from pipedream.runtime.lr import stage_lr_applies

        params.update(runtime=args.runtime, schedule=args.schedule, microbatches=args.microbatches,
                      weight_sync=args.weight_sync,
                      compat=args.compat, recompute=args.recompute,
                      stage_lr="x replicas(s) / replicas(0)" if stage_lr_applies(cfg) else "uniform")
    else:  # the DP semantics in force (pipedream.baselines.ddp)
        per_worker = args.dp_batch == "per_worker"
        params.update(dp_batch=args.dp_batch,
                      dp_global_minibatch=args.batch_size * (args.workers if per_worker else 1),
                      dp_lr_scaling=f"linear x{args.workers}, warm-up {args.lr_warmup_epochs:g} epochs"
                      if per_worker and args.optimizer == "sgd" else "none")
    tags = {"model": args.model, "mode": args.mode, "config": config, "cluster": cluster, "scale": args.preset}
    return params, tags


def _check_scoring(args: argparse.Namespace, spec) -> None:  # type: ignore[no-untyped-def]
    """Turn on ``--score-epochs`` for a threshold on the model's own metric (real data); refuse a metric
    that is not the model's, and scoring that cannot happen."""
    from pipedream.experiment import SCORED_METRICS

    m = args.threshold_metric
    if args.threshold is not None and m in SCORED_METRICS:
        if spec.metric != m:
            raise PipeDreamError(f"--threshold-metric {m}: model {args.model!r} is scored with {spec.metric!r}, "
                                 f"not {m!r}; use a threshold on its metric or on token_accuracy")
        if args.data != "synthetic":  # synthetic data has no accuracy to reach
            args.score_epochs = True
    if args.score_epochs and args.data == "synthetic":
        raise PipeDreamError("--score-epochs scores the model on real validation data; leave it out with --data synthetic")
    if args.score_epochs and (spec.evaluate is None or spec.make_datasets is None):
        raise PipeDreamError(f"--score-epochs: model {args.model!r} has no evaluate and make_datasets hooks to score "
                             "epochs with")


def _score_epochs(out_dir: Path, args: argparse.Namespace, cfg, epochs: list[dict]) -> str:  # type: ignore[no-untyped-def,type-arg]
    """Score every epoch's saved model with the model's metric, add it to the epochs' rows (and to
    ``metrics.json``) and delete the models unless ``--keep-epoch-models``; returns the metric's name."""
    from pipedream.runtime.assemble import epoch_metrics, remove_epoch_models

    scored = epoch_metrics(out_dir, args.model, args.preset, args.seed, cfg.train_subset, cfg.val_subset,
                           args.batch_size, [int(e["epoch"]) for e in epochs])
    if scored is None:
        raise PipeDreamError(f"model {args.model!r} has no metric hook to score epochs with")
    name, values = scored
    for e, v in zip(epochs, values, strict=True):
        e[name] = v
        print(f"epoch {e['epoch']}: {name} {v:.2f} (scored after training)", file=sys.stderr)
    atomic_write_json(out_dir / "metrics.json", epochs)
    if not args.keep_epoch_models:
        remove_epoch_models(out_dir)
    return name


def _check_plan_covers_model(plan, cfg) -> None:  # type: ignore[no-untyped-def]
    """Refuse, before any worker starts, a plan whose stages do not cover the model's graph exactly once in
    graph order (a layer in no stage or in two, a node the model does not have), or whose stages share a
    parameter in a way the run cannot keep equal (:func:`pipedream.runtime.shared.check`): the checks the
    workers would make after seconds of start-up (:func:`pipedream.runtime.split.assign`).

    Raises:
        PipeDreamError: naming the node and the fix.
    """
    import torch

    from pipedream.models import build_model
    from pipedream.runtime import split
    from pipedream.runtime.stage import granularity_of

    try:
        with torch.device("meta"):  # the graph only: no weights allocated (a full-size GNMT-8 is 775 MB)
            model = build_model(cfg.model, cfg.preset, cfg.seed)
    except (NotImplementedError, RuntimeError):  # a user's model that reads its weights while it is built
        model = build_model(cfg.model, cfg.preset, cfg.seed)
    example = None
    if not isinstance(model, torch.nn.Sequential):  # captured on a microbatch of its data, as the workers do
        from pipedream.runtime.task import load_task

        task = load_task(cfg)
        model, example = task.model, task.input_batch(cfg.batch_size // cfg.microbatches)
    gm = split.trace(model, granularity_of(plan), example)
    split.assign(gm, [s.nodes for s in plan.stages])
    if example is not None:  # parameters that several stages read: what 1F1B and --clip-norm allow
        from pipedream.runtime import shared

        modules = split.split(gm, [s.nodes for s in plan.stages], example).modules
        shared.check(shared.find(modules), [s.replicas for s in plan.stages], cfg.schedule, cfg.clip_norm)


def run(args: argparse.Namespace) -> int:
    """``pipedream train``: check the options, stage the run's folder, then train with :func:`pipedream.train`
    (torchrun) while logging each epoch to MLflow; then score, log the final metrics and write ``run.json``."""
    from pipedream.allocator import worker_env
    from pipedream.plan import Plan
    from pipedream.runtime.launch import check_nodes

    plan_file = Path(args.plan) if args.plan else None  # DP runs read only the cluster's name from it
    if args.workers < 1 or args.nnodes < 1 or args.timeout_s <= 0 or args.max_restarts < 0:
        raise PipeDreamError("--workers, --nnodes and --timeout-s must be positive, --max-restarts at least 0")
    check_nodes(args.workers, args.nnodes, args.rdzv_endpoint)
    worker_env()  # what the launcher will preload; a $PIPEDREAM_JEMALLOC that names no file: one line, before any worker
    if args.mode == "dp" and args.recompute:
        raise PipeDreamError("--recompute is a PipeDream option (each stage's forward is recomputed in its "
                             "backward); the data-parallel baseline does not recompute: leave it out of --mode dp")
    from pipedream.models import get_spec

    # an unknown model or a user's function that does not import: one line, before any worker
    _check_scoring(args, get_spec(args.model))
    plan = Plan.load(plan_file) if plan_file else None
    cfg = _config(args, plan)
    if plan is not None and plan.workers != args.workers:
        raise PipeDreamError(f"plan {plan_file} is for {plan.workers} workers, not --workers {args.workers}; "
                             f"pass --workers {plan.workers} or plan for a cluster of {args.workers} workers")
    if plan is not None and ":" not in args.model and plan.model != args.model:
        raise PipeDreamError(f"plan {plan_file} is for model {plan.model!r}, not --model {args.model!r}")
    if plan is not None and args.mode == "pipedream":  # a DP run reads only the plan's cluster: no stages to check
        _check_plan_covers_model(plan, cfg)
    from pipedream import rundir

    final_dir = cfg.run_dir(args.mode)  # replaced by this run's folder only if it succeeds
    if args.node_rank == 0:
        out_dir, note = rundir.prepare(final_dir, args.resume)
        if note:
            print(note, file=sys.stderr)
    else:  # node 0 prepares the shared folder
        out_dir = rundir.staging(final_dir)
    args.out_dir = cfg.out_dir = str(out_dir)
    config = str(args.workers) if args.mode == "dp" else plan.config if plan is not None else "straight"
    cluster = plan.cluster if plan is not None else f"cpu{args.workers}"
    if args.node_rank != 0:
        _train(args, cfg, plan_file)
        print(f"node {args.node_rank}: workers finished; node 0 logs the run")
        return 0
    from pipedream.runtime.supervise import signals_raise

    with signals_raise():  # SIGINT/SIGTERM: the workers are stopped, the MLflow run ends KILLED
        return _train_and_log(args, cfg, plan, plan_file, out_dir, final_dir, config, cluster)


def _train(args: argparse.Namespace, cfg, plan_file: Path | None,  # type: ignore[no-untyped-def]
           on_epochs: Callable[[list[dict[str, float]]], None] | None = None) -> list[dict[str, float]]:
    """The run itself: :func:`pipedream.train` on the parsed config under the supervised torchrun launcher
    (the workers write into ``cfg.out_dir``, the staging folder); its errors are already one line."""
    from pipedream import api

    return api.train(args.model, plan_file, None, cfg, mode=args.mode, launcher="torchrun", workers=args.workers,
                     nnodes=args.nnodes, rdzv_endpoint=args.rdzv_endpoint, timeout_s=args.timeout_s,
                     on_epochs=on_epochs, max_restarts=args.max_restarts)


def run_name(args: argparse.Namespace) -> str:
    """The MLflow run's name: the mode, and a PipeDream schedule other than 1F1B after it (``pipedream-2bw``; on
    torch's runtime ``pipedream-torch-<schedule>``), so
    that runs of several schedules share an experiment without one retiring another (a rerun retires the earlier
    runs of the same experiment and name, :class:`pipedream.tracking.LiveRun`)."""
    if args.runtime == "torch":
        return f"{args.mode}-torch-{args.schedule}"
    return args.mode if args.mode == "dp" or args.schedule == "1f1b" else f"{args.mode}-{args.schedule}"


def _train_and_log(args: argparse.Namespace, cfg, plan, plan_file: Path | None, out_dir: Path,  # type: ignore[no-untyped-def]
                   final_dir: Path, config: str, cluster: str) -> int:
    """Node 0's part of :func:`run`: predict and start the MLflow run (:func:`_start_run`) while the workers start,
    train (:func:`_train`) while logging each epoch to MLflow, score, write ``run.json`` and put ``out_dir`` (the
    staging folder) in place of ``final_dir``; any failure ends the MLflow run FAILED (KILLED for an interrupt)
    with ``train.log`` attached.

    The prediction and the MLflow run are made in a thread: the launcher's imports and the store take seconds of
    one core, which the workers' own start-up (each imports torch) would otherwise wait for. Where that thread
    fails (an MLflow store that cannot be opened), it stops the workers as an interrupt would and its error is
    raised in the interrupt's place."""
    import _thread
    from concurrent.futures import Future, ThreadPoolExecutor

    def log_epochs(rows: list[dict[str, float]]) -> None:  # from the follower thread; a failed start logs nothing
        if started.exception() is None:
            started.result()[0].log_epochs(rows)

    def stop_if_failed(future: Future) -> None:  # type: ignore[type-arg]
        if future.exception() is not None:
            _thread.interrupt_main()

    t0 = time.time()
    with ThreadPoolExecutor(1) as pool:
        started = pool.submit(_start_run, args, cfg, plan, out_dir, cluster, config, t0)
        try:
            started.add_done_callback(stop_if_failed)
            _train(args, cfg, plan_file, on_epochs=log_epochs)  # each epoch logged as the workers write it
            live, prediction, why_not = started.result()
            return _finish(args, cfg, live, t0, prediction, why_not, plan_file, out_dir, final_dir, config, cluster)
        except BaseException as e:
            failed = started.exception()
            if failed is not None:
                raise failed from None
            live = started.result()[0]
            if not live.ended:
                _log_restarts(live, out_dir)
                live.finish(status="KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED",
                            artifacts=[out_dir / "train.log"])
            raise


def _log_restarts(live, out_dir: Path) -> None:  # type: ignore[no-untyped-def]
    """Log the job's restarts (``restarts.json``, written by the restarted workers) to its MLflow run, if any."""
    path = out_dir / "restarts.json"
    if path.is_file():
        live.log_restarts(json.loads(path.read_text()))


def _start_run(args: argparse.Namespace, cfg, plan, out_dir: Path, cluster: str, config: str,  # type: ignore[no-untyped-def]
               t0: float) -> tuple[Any, dict[str, Any], str | None]:
    """The run's predicted epoch (``out_dir/prediction.json``, printed) and its MLflow run, started at ``t0``:
    ``(LiveRun, prediction, why there is none or None)``."""
    from pipedream import run_prediction
    from pipedream.tracking import LiveRun

    params, tags = _params_and_tags(args, cfg, config, cluster)
    prediction, why_not = run_prediction.predict(args, cfg, plan)
    predicted = prediction.get("predicted_epoch_time_s")
    if predicted is not None:
        params.update(predicted_epoch_time_s=predicted)
        atomic_write_json(out_dir / "prediction.json", prediction)
    else:
        tags["prediction_error"] = why_not or "unknown"
    live = LiveRun(args.experiment or f"{args.model}/{cluster}", run_name(args), params, tags, start_time_s=t0)
    return live, prediction, why_not


def profile_age_s(profile: str | Path | None, at_unix_s: float) -> float | None:
    """Seconds from the end of the profile a run's prediction stands on (``meta.json`` ``profiled_at_unix_s``,
    written by ``pipedream profile``) to ``at_unix_s`` (the run's launch, ``time.time()``); None where the profile
    does not say (older profiles, the release's). On a CPU host whose speed drifts, a run long after its profile
    is predicted at the host's speed back then (``results/prediction_check.csv`` shows it beside the ratio)."""
    from pipedream.graph import read_meta

    if profile is None:
        return None
    try:
        at = read_meta(profile).get("profiled_at_unix_s")
    except PipeDreamError:
        return None
    return at_unix_s - at if isinstance(at, int | float) and not isinstance(at, bool) else None


def steady_epochs(epochs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The epochs a prediction is checked against: all but the first when there are several. The simulator
    predicts an epoch of a warmed-up run; the first also pays one-time costs (the allocator's first touch of
    every page, lazy initialisation), logged apart as ``first_epoch_time_s``."""
    return epochs[1:] if len(epochs) > 1 else epochs


def checkpoint_check(args: argparse.Namespace, prediction: dict[str, Any],
                     steady: list[dict[str, Any]]) -> dict[str, float]:
    """The check of the checkpoints' cost (docs/checkpoints.md): the overhead measured in the run
    (``checkpoint_overhead``, mean of ``steady``) beside the one predicted for its interval
    (``predicted_checkpoint_overhead``): :func:`pipedream.costmodel.checkpoint_overhead` of the predicted
    minibatch and flush seconds and the snapshot and persist seconds the run measured. Empty unless the run chose
    its interval with ``--checkpoint-every auto`` and was predicted."""
    from pipedream.costmodel import CheckpointCost, checkpoint_overhead

    last = steady[-1]
    flush, shape = prediction.get("checkpoint_flush_s"), prediction.get("shape")
    if flush is None or shape is None or "checkpoint_overhead" not in last:
        return {}
    units = shape["minibatches"]  # the runtime's minibatches; DP's are its optimizer steps
    if args.mode == "dp" and args.dp_batch == "per_worker":
        units //= args.workers
    cost = CheckpointCost(prediction["predicted_epoch_time_s"] / units, last["checkpoint_snapshot_s"],
                          last["checkpoint_persist_s"], flush)
    return {"checkpoint_overhead": sum(e["checkpoint_overhead"] for e in steady) / len(steady),
            "predicted_checkpoint_overhead": checkpoint_overhead(cost, int(last["checkpoint_every"]))}


def _finish(args: argparse.Namespace, cfg, live, t0: float, prediction: dict, why_not: str | None,  # type: ignore[no-untyped-def,type-arg]
            plan_file: Path | None, out_dir: Path, final_dir: Path, config: str, cluster: str) -> int:
    """After the workers succeeded: score, log the final metrics, write ``run.json``, commit ``out_dir``."""
    from pipedream import rundir

    metrics_path = out_dir / "metrics.json"
    predicted = prediction.get("predicted_epoch_time_s")
    total_s = time.time() - t0
    if not metrics_path.is_file():
        raise PipeDreamError(f"workers finished but wrote no {metrics_path}; see {out_dir / 'train.log'}")
    epochs = json.loads(metrics_path.read_text())
    live.log_epochs(epochs)
    scored = None  # the model's metric, scored on every epoch's model now that training is over
    if cfg.score_epochs:
        scored = _score_epochs(out_dir, args, cfg, epochs)
        live.log_scores(scored, epochs)
    steady = steady_epochs(epochs)
    final = {"final_val_accuracy": epochs[-1]["val_accuracy"], "final_train_loss": epochs[-1]["train_loss"],
             "mean_epoch_time_s": sum(e["epoch_time_s"] for e in epochs) / len(epochs),
             "steady_epoch_time_s": sum(e["epoch_time_s"] for e in steady) / len(steady),
             "first_epoch_time_s": epochs[0]["epoch_time_s"], "launch_to_finish_s": total_s}
    if predicted is not None:  # the check of the simulator (docs/simulator.md, "The prediction check"), on the warmed-up epochs
        final.update(predicted_epoch_time_s=predicted, prediction_ratio=final["steady_epoch_time_s"] / predicted)
    age = profile_age_s(args.profile, t0)
    if age is not None:
        final["profile_age_s"] = age
    final.update(checkpoint_check(args, prediction, steady))
    predicted_wait = prediction.get("wait_s") or []
    for k, busy in enumerate(prediction.get("compute_s") or []):  # where the time goes, per stage
        measured = [e[f"compute_s_stage{k}"] for e in steady if f"compute_s_stage{k}" in e]
        final[f"predicted_compute_s_stage{k}"] = busy
        if k < len(predicted_wait):
            final[f"predicted_wait_s_stage{k}"] = predicted_wait[k]
        if measured:
            final[f"measured_compute_s_stage{k}"] = sum(measured) / len(measured)
            final[f"wait_s_stage{k}"] = sum(e[f"wait_s_stage{k}"] for e in steady if f"wait_s_stage{k}" in e) / len(measured)
    for k, need in enumerate(prediction.get("memory_bytes") or []):  # the check of the memory model
        final[f"predicted_memory_bytes_stage{k}"] = need["total"]
        measured = max((e.get(f"peak_memory_bytes_stage{k}", 0.0) for e in epochs), default=0.0)
        if measured:
            final[f"measured_memory_bytes_stage{k}"] = measured
            final[f"memory_ratio_stage{k}"] = measured / need["total"]
    final_tags = {}
    if args.threshold is not None and args.data == "synthetic":  # accuracy on random labels: no target to reach
        final_tags["time_to_accuracy"] = "synthetic data"
    elif args.threshold is not None:
        from pipedream.table1.measured import epochs_to_accuracy, time_to_accuracy

        tta = time_to_accuracy(epochs, args.threshold, args.threshold_metric)
        if math.isnan(tta):  # never crossed: say so, log no number
            final_tags["time_to_accuracy"] = "not reached"
        else:
            final["time_to_accuracy_s"] = tta
            final["epochs_to_accuracy"] = epochs_to_accuracy(epochs, args.threshold, args.threshold_metric)
    from pipedream.runtime.assemble import final_metric

    if scored is not None:  # the last epoch's model is the final model: the same weights, the same score
        metric: tuple[str, float] | None = (scored, epochs[-1][scored])
    elif args.data == "synthetic":
        metric = None
    else:
        metric = final_metric(out_dir, args.model, args.preset, args.seed, cfg.train_subset, cfg.val_subset,
                              args.batch_size)
    if metric is not None:  # the model's own quality metric on the reassembled model (top1, bleu, ...)
        final[f"final_{metric[0]}"] = metric[1]
    _log_restarts(live, out_dir)
    own = [plan_file, args.profile] if args.mode == "pipedream" else []
    extra = [out_dir / "prediction.json"] if predicted is not None else []
    live.finish(final, final_tags, artifacts=[p for p in (*own, metrics_path, *extra) if p is not None])
    atomic_write_json(out_dir / "run.json", {"run_id": live.run_id, "experiment_id": live.experiment_id,
                                              "mode": args.mode, "config": config, "cluster": cluster,
                                              "epochs": len(epochs), **final, **final_tags,
                                              **({} if why_not is None else {"prediction_error": why_not})})
    rundir.commit(out_dir, final_dir)
    checked = "" if predicted is None else (
        f" (steady {final['steady_epoch_time_s']:.2f} s: {final['prediction_ratio']:.2f}x the prediction)")
    print(f"{args.mode}: {len(epochs)} epochs, val accuracy {final['final_val_accuracy']:.3f}, "
          f"mean epoch {final['mean_epoch_time_s']:.1f} s{checked}, "
          + (f"MLflow run {live.run_id}" if live.enabled else "not logged to MLflow ($PIPEDREAM_TRACKING=off)"))
    return 0
