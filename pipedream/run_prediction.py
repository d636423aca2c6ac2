"""The prediction of a ``pipedream train`` run, made before it starts, and its resimulation after it ends
(issue 18's check of the simulator on every run).

:func:`predict` probes the plan's stages on CPUs (:mod:`pipedream.stage_probe`) and predicts the epoch with
:func:`pipedream.sim.predict.predict_run` on the run's profile, plan, clusters, training samples and host;
:func:`resimulated` predicts it again with each stage's compute as the run measured it
(:func:`resimulation_factors`): a diagnosis of the model, never a prediction.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pipedream.host_timing import host_cores


def resimulation_factors(final: dict[str, Any]) -> list[float] | None:
    """Per stage, the run's measured compute CPU over the work its prediction gave that compute
    (``measured_compute_cpu_s_stage<s>`` / ``predicted_compute_work_s_stage<s>`` of ``run.json``): the factors
    :func:`pipedream.sim.predict.predict_epoch` resimulates the run with. None unless every stage has both (a
    GPU run, or a run without a prediction) and every factor is positive."""
    factors, k = [], 0
    while f"predicted_compute_s_stage{k}" in final:
        cpu, work = final.get(f"measured_compute_cpu_s_stage{k}"), final.get(f"predicted_compute_work_s_stage{k}")
        if not (isinstance(cpu, float | int) and isinstance(work, float | int) and cpu > 0 and work > 0):
            return None
        factors.append(cpu / work)
        k += 1
    return factors or None


def _predict_run(args: argparse.Namespace, cfg, plan, stage_factors=None, compute_factors=None):  # type: ignore[no-untyped-def]
    """:func:`pipedream.sim.predict.predict_run` for this run: its profile, plan, clusters, training samples, the
    cores its workers share (none on GPUs), as run queues balanced at this host's scheduler tick
    (:mod:`pipedream.sim.run_queues`), and its hosts; ``stage_factors`` from :func:`_stage_probe`,
    ``compute_factors`` for a resimulation."""
    from pipedream.runtime.distributed import uses_cuda
    from pipedream.runtime.launch import WORKER_THREADS
    from pipedream.sim.predict import predict_run, training_samples
    from pipedream.sim.run_queues import scheduler_tick_s

    cores = None if uses_cuda() else host_cores()  # on GPUs the workers do not share the CPU's cores
    return predict_run(cfg, args.mode, plan, Path(args.profile), args.clusters, num_samples=training_samples(cfg),
                       cores=cores, threads=WORKER_THREADS, hosts=args.nnodes, stage_factors=stage_factors,
                       compute_factors=compute_factors, tick_s=None if cores is None else scheduler_tick_s())


def _stage_probe(args: argparse.Namespace, cfg, plan):  # type: ignore[no-untyped-def]
    """The plan's stages timed alone (:func:`pipedream.stage_probe.probe`) for a pipeline run on CPUs with
    ``--stage-probe-rounds`` above 0, at the run's (micro)batch; None otherwise (DP, one stage, GPUs)."""
    from pipedream.graph import LayerGraph, profiled_batch
    from pipedream.runtime.distributed import uses_cuda
    from pipedream.runtime.launch import WORKER_THREADS
    from pipedream.runtime.task import load_task
    from pipedream.stage_probe import probe

    if args.mode != "pipedream" or len(plan.stages) < 2 or args.stage_probe_rounds < 1 or uses_cuda():
        return None
    graph = LayerGraph.read(args.profile, profiled_batch(args.profile))
    task = load_task(cfg)
    batch = min(cfg.batch_size // max(cfg.microbatches, 1), len(task.train))
    result = probe(task, plan, graph, batch, rounds=args.stage_probe_rounds, threads=WORKER_THREADS)
    print("stages alone over their share of the whole step: "
          + " / ".join(f"{f:.2f}" for f in result.factors), file=sys.stderr)
    return result


def predict(args: argparse.Namespace, cfg, plan) -> tuple[dict, str | None]:  # type: ignore[no-untyped-def,type-arg]
    """The run's prediction (:func:`pipedream.sim.predict.predict_run`) as a dict, or ``({}, why not)``:
    a failure to predict is reported in one line, never raised (the run goes on)."""
    from pipedream.sim.profiled import missing_step_rate

    if plan is None or args.profile is None:
        return {}, "no --plan and --profile to predict the epoch time from"
    try:
        stages = _stage_probe(args, cfg, plan)
    except Exception as e:  # a failed probe leaves the prediction on the shares
        stages = None
        print(f"warning: no stage probe ({(str(e).splitlines() or [''])[0] or type(e).__name__}): each stage is "
              "predicted at its layers' share of the whole step", file=sys.stderr)
    try:
        pred = _predict_run(args, cfg, plan, stage_factors=stages.factors if stages else None)
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
    scales = "/".join(f"{f:.2f}" for f in pred.compute_scale)
    ranks = "/".join(f"{c:.2f}" for c in pred.concurrency)
    print(f"predicted epoch {pred.epoch_s:.2f} s (compute per stage x{scales}: {ranks} ranks compute at once on "
          f"{pred.cores or 'their own'} cores)", file=sys.stderr)
    out = pred.to_dict()
    if stages is not None:
        out["stage_probe"] = stages.as_dict()
    return out, None


def resimulated(args: argparse.Namespace, cfg, plan_file: Path | None, final: dict[str, Any],  # type: ignore[no-untyped-def]
                 stage_factors: list[float] | None = None) -> float | None:
    """The run's epoch resimulated with each stage's compute as measured
    (:func:`resimulation_factors`) and everything else as predicted: the part of the miss
    that the compute does not explain. None (a warning line when it failed) on GPUs (the main thread's CPU is not
    their compute), without factors, a plan or a profile; never raised (the run has finished). ``stage_factors``:
    the prediction's (:func:`_stage_probe`), so that the measured factors apply to the work they were taken over."""
    from pipedream.plan import Plan
    from pipedream.runtime.distributed import uses_cuda

    factors = resimulation_factors(final)
    if factors is None or plan_file is None or args.profile is None or uses_cuda():
        return None
    try:
        return _predict_run(args, cfg, Plan.load(plan_file), stage_factors, factors).epoch_s
    except Exception as e:  # a diagnosis: it must not fail the run
        print(f"warning: no resimulation with the measured compute: {(str(e).splitlines() or [''])[0]}",
              file=sys.stderr)
        return None
