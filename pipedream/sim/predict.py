"""Predict a training run's epoch time with the simulator, from what is known before the run starts.

Every ``pipedream train`` run logs this prediction beside its measured epoch time (DESIGN.md, "Checks": a
disagreement is a bug in the model or in the runtime). The prediction is the run's own: its profile
(``graph.txt`` and ``meta.json``), its plan, its cluster (the plan's, from the clusters file), its link
throttle, schedule, minibatch size and epoch length, and the host it runs on. Nothing is fitted to the run
it is checked against.

What is modelled, term by term:

* compute: the profile's per-layer forward and backward seconds, scaled linearly to the samples of an
  action (:func:`pipedream.sim.costs.stage_costs`), times the host-sharing factor below;
* links: with ``--emulate-bandwidth-Bps B`` every link of the cluster is ``B`` bytes/s (the runtime throttles
  every transfer and allreduce to that bandwidth, :mod:`pipedream.runtime.comm`); otherwise the cluster's;
* allreduce: a ring over the stage's replicas; DP's overlaps the backward in DDP's gradient buckets
  (:data:`pipedream.costmodel.DDP_BUCKET_CAP_BYTES`), a PipeDream stage's is one flat allreduce after its
  backward (:meth:`pipedream.runtime.executor.StageExecutor._do_allreduce`), so ``overlap=False`` there;
* the optimizer step: the profile's measured seconds per parameter byte of the run's optimizer
  (``optimizer_step_s_per_param_byte`` in ``meta.json``, :func:`pipedream.profiler.optimizer_step_rates`),
  times the host-sharing factor;
* the epoch: exactly the minibatches the run trains (:func:`pipedream.runtime.worker.minibatches_per_epoch`,
  :func:`pipedream.baselines.ddp.minibatches_per_epoch`), filled and drained once, as the workers do.

The host (processor sharing). Workers run ``threads`` threads each (``pipedream train`` sets
``OMP_NUM_THREADS``) on a host of ``cores`` cores. When more threads want a core than there are cores, the
operating system shares the cores among them fairly (Linux CFS), and each computes ``runnable threads /
cores`` times slower than the profile (taken with the workers' thread count on an otherwise idle core). A
rank blocked in a receive or an allreduce (gloo waits in a blocking call; the link throttle sleeps) uses no
core. So the slowdown depends on how many ranks compute at once, which depends on the slowdown. The
simulator times every action at a fixed speed, so the model scales every compute time by one factor ``f``:

    ``f = max(1, C * threads / cores)``,  ``C = integral of n(t)^2 dt / integral of n(t) dt``,

where ``n(t)`` is the number of ranks computing at time ``t`` in the simulated run (its forward and backward
spans). ``C`` is the concurrency an average unit of compute sees: a compute-weighted mean of ``n``, not the
time average ``sum_r(u_r)`` of the ranks' utilisations (:attr:`SimResult.utilisation`), which
underestimates the sharing whenever compute bunches up: data parallelism in lockstep computes on all ``W``
ranks at once and then waits for the allreduce on all, so ``C = W`` while ``sum(u)`` may be 1. For a
steady pipeline whose ranks compute at independent times the two agree. ``f`` is solved by fixed-point
iteration from ``f_0 = max(1, workers * threads / cores)`` (every rank runnable at once, the upper bound):
simulate with compute times ``x f``, measure ``C``, recompute ``f``, until it changes by less than
:data:`SCALE_RTOL` (averaging successive iterates after :data:`UNDAMPED_ITERATIONS` in case it oscillates).

Assumptions: one factor for the whole epoch (the compute-weighted mean; in reality a span computing alone
runs at full speed and one among ``n`` at ``cores / n``); a blocked rank uses no core (the launcher, MLflow
logging, gloo's own threads and other processes on the host use none either); compute of an action scales
linearly with its samples; the profile was taken with the workers' thread count (``meta.json`` ``threads``,
:mod:`pipedream.commands.profile`); the runtime's own per-action costs (Python, gloo messages, weight
stashing, loading the minibatch) are not in the profile; mid-epoch checkpoints (``--checkpoint-every``) and
the end-of-epoch loss reduction are not modelled. An exact model needs processor sharing inside the
simulator's event loop (each compute action's progress rate ``min(1, cores / (n(t) threads))``).
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipedream.baselines import ddp
from pipedream.costmodel import DDP_BUCKET_CAP_BYTES
from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph, profiled_batch, read_meta
from pipedream.paths import shipped
from pipedream.plan import Plan
from pipedream.runtime import worker
from pipedream.runtime.config import TrainConfig
from pipedream.runtime.task import load_task
from pipedream.sim.costs import StageCost, stage_costs
from pipedream.sim.simulate import SimResult, simulate_stages
from pipedream.sim.simulate import plan_ranks as _plan_ranks
from pipedream.topology import Cluster, get_cluster

MAX_ITERATIONS = 50
UNDAMPED_ITERATIONS = 10
SCALE_RTOL = 1e-3  # relative change of the host-sharing factor that counts as settled


@dataclass
class EpochShape:
    """What one epoch of a run is, in the simulator's terms.

    Attributes:
        schedule: the simulator's schedule: ``1f1b``, ``gpipe``, ``2bw`` or ``dp``.
        batch_size: samples one forward/backward action processes on one worker.
        microbatches: microbatches per minibatch (GPipe, 2BW; else 1).
        minibatches: the run's minibatches per epoch (``cfg.batch_size`` samples each).
        dataset_size: samples the epoch trains, ``minibatches * cfg.batch_size``.
    """

    schedule: str
    batch_size: int
    microbatches: int
    minibatches: int
    dataset_size: int


@dataclass
class Prediction:
    """A run's predicted epoch time.

    Attributes:
        epoch_s: predicted epoch time, s.
        compute_scale: the settled host-sharing factor ``f`` the compute times were multiplied by.
        concurrency: ``C`` at that factor: ranks computing at once, as an average unit of compute sees it.
        busy_ranks: ``sum(utilisation)`` at that factor: ranks computing at once, time-averaged (steady state).
        iterations: simulations run to settle the factor.
        cores: cores per host assumed (None: no sharing, ranks on GPUs); threads: threads per worker assumed.
        shape: the epoch simulated.
        cluster: the cluster simulated (emulated bandwidth applied).
        sim_kwargs: the keyword parameters passed to the simulator (costs excluded).
        sim: the simulator's result at the settled factor.
    """

    epoch_s: float
    compute_scale: float
    concurrency: float
    busy_ranks: float
    iterations: int
    cores: int | None
    threads: int
    shape: EpochShape
    cluster: Cluster
    sim_kwargs: dict[str, Any] = field(default_factory=dict)
    sim: SimResult | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (without the simulator's result)."""
        return {"predicted_epoch_time_s": self.epoch_s, "compute_scale": self.compute_scale,
                "concurrency": self.concurrency, "busy_ranks": self.busy_ranks, "iterations": self.iterations,
                "cores": self.cores,
                "threads": self.threads, "shape": dataclasses.asdict(self.shape), "cluster": self.cluster.describe(),
                "sim_kwargs": {k: v for k, v in self.sim_kwargs.items() if k != "costs"}}


def host_scale(busy_ranks: float, threads: int, cores: int) -> float:
    """Processor-sharing slowdown of compute: ``max(1, busy_ranks * threads / cores)``.

    ``busy_ranks`` ranks computing at once with ``threads`` threads each share ``cores`` cores; each thread
    gets ``cores / (busy_ranks * threads)`` of a core when that is below 1 (a fair-share scheduler such as
    Linux CFS). Raises PipeDreamError for non-positive ``threads`` or ``cores``.
    """
    if threads < 1 or cores < 1:
        raise PipeDreamError(f"threads per worker and host cores must be positive, got {threads} and {cores}")
    return max(1.0, busy_ranks * threads / cores)


def compute_concurrency(spans: list[tuple[float, float]]) -> float:
    """Compute-weighted concurrency ``integral n^2 dt / integral n dt`` of ``(start_s, end_s)`` compute spans,
    ``n(t)`` the spans open at ``t`` (0 without any span of positive length).

    Two ranks computing ``[0, 2)`` and ``[1, 3)``: ``n`` is 1, 2, 1 over three seconds, so
    ``(1 + 4 + 1) / (1 + 2 + 1) = 1.5``.
    """
    events = sorted([(a, 1) for a, b in spans if b > a] + [(b, -1) for a, b in spans if b > a])
    n, last, first_moment, second_moment = 0, 0.0, 0.0, 0.0
    for t, step in events:
        first_moment += n * (t - last)
        second_moment += n * n * (t - last)
        n, last = n + step, t
    return second_moment / first_moment if first_moment > 0 else 0.0


def scaled_costs(costs: list[StageCost], factor: float) -> list[StageCost]:
    """Stage costs with every compute time (forward, backward, gradient-ready times) multiplied by ``factor``;
    bytes unchanged."""
    return [dataclasses.replace(c, fwd_s=c.fwd_s * factor, bwd_s=c.bwd_s * factor,
                                grad_chunks=[(t * factor, b) for t, b in c.grad_chunks]) for c in costs]


def emulated_cluster(cluster: Cluster, bandwidth_Bps: float | None) -> Cluster:
    """``cluster`` with every level's bandwidth set to ``bandwidth_Bps`` (the runtime's link throttle,
    ``--emulate-bandwidth-Bps``); the cluster itself when None."""
    if not bandwidth_Bps:
        return cluster
    return dataclasses.replace(cluster, levels=[(w, float(bandwidth_Bps)) for w, _ in cluster.levels])


def epoch_shape(cfg: TrainConfig, mode: str, num_samples: int, workers: int, replicas: list[int]) -> EpochShape:
    """The epoch the run's workers train, from the same functions the workers call.

    PipeDream: :func:`pipedream.runtime.worker.minibatches_per_epoch` minibatches of ``cfg.batch_size``
    (GPipe and 2BW: ``cfg.microbatches`` microbatches of ``batch_size / microbatches`` each). DP
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
    m = cfg.microbatches if cfg.schedule in ("gpipe", "2bw") else 1
    return EpochShape(cfg.schedule, cfg.batch_size // m, m, nb, nb * cfg.batch_size)


def _simulator_supports(**kwargs: Any) -> dict[str, Any]:
    """The keyword parameters the simulator takes (and that are set).

    TODO(merge): remove this filter once simulate_stages has ``bucket_bytes``, ``optimizer`` and
    ``step_s_per_param_byte`` (the cost-model branch); until then they are dropped.
    """
    known = inspect.signature(simulate_stages).parameters
    return {k: v for k, v in kwargs.items() if k in known and v is not None}


def predict_epoch(graph: LayerGraph, stage_nodes: list[list[str]], stage_ranks: list[list[int]], cluster: Cluster,
                  shape: EpochShape, *, cores: int | None, threads: int = 1, hosts: int = 1,
                  optimizer: str | None = None,
                  step_s_per_param_byte: float | None = None, warmup: str | None = None) -> Prediction:
    """Predict one epoch on a host of ``cores`` cores, settling the host-sharing factor (module docstring).

    Args:
        graph: the profile (``minibatch_size`` set).
        stage_nodes: node ids per stage (DP: one stage with all nodes).
        stage_ranks: ranks per stage in round-robin order (DP: one list of all ranks).
        cluster: links as the run pays them (:func:`emulated_cluster`).
        shape: the epoch (:func:`epoch_shape`).
        cores: cores of each host (``os.cpu_count()``); None when the ranks do not compute on shared cores
            (one GPU each): no host sharing. threads: threads per worker.
        hosts: hosts the ranks are spread over evenly (``--nnodes``); each host's cores are shared by its
            ranks, so the concurrency per host is ``C / hosts``.
        optimizer: the run's optimizer (``sgd``, ``adam``); step_s_per_param_byte: its measured rate, s/byte.
        warmup: 1F1B's warm-up counts (``cfg.warmup``); None: the simulator's default.
    Raises:
        PipeDreamError: the simulator's checks, non-positive cores or threads.
    """
    dp = shape.schedule == "dp"
    base = stage_costs(graph, stage_nodes, shape.batch_size)
    fixed = {"schedule": shape.schedule, "batch_size": shape.batch_size, "microbatches": shape.microbatches,
             "dataset_size": shape.dataset_size, "overlap": dp}
    if warmup is not None:
        fixed["warmup"] = warmup

    def extra(scale: float) -> dict[str, Any]:
        rate = step_s_per_param_byte * scale if step_s_per_param_byte is not None else None
        return _simulator_supports(bucket_bytes=DDP_BUCKET_CAP_BYTES if dp else None, optimizer=optimizer,
                                   step_s_per_param_byte=rate)

    workers = sum(len(rs) for rs in stage_ranks)
    if hosts < 1:
        raise PipeDreamError(f"hosts must be positive, got {hosts}")

    def sharing(ranks: float) -> float:
        return 1.0 if cores is None else host_scale(ranks / hosts, threads, cores)

    scale = sharing(workers)  # every rank runnable: the upper bound
    iterations = 0
    while True:
        iterations += 1
        res = simulate_stages(graph, stage_nodes, stage_ranks, cluster, costs=scaled_costs(base, scale),
                              keep_trace=True, **fixed, **extra(scale))
        assert res.trace is not None  # keep_trace
        conc = compute_concurrency([(sp.start, sp.end) for spans in res.trace.compute.values() for sp in spans])
        new = sharing(conc)
        if abs(new - scale) <= SCALE_RTOL * scale or iterations >= MAX_ITERATIONS:
            break
        scale = new if iterations < UNDAMPED_ITERATIONS else (scale + new) / 2
    return Prediction(epoch_s=res.epoch_time_s, compute_scale=scale, concurrency=conc,
                      busy_ranks=sum(res.utilisation), iterations=iterations,
                      cores=cores, threads=threads, shape=shape, cluster=cluster,
                      sim_kwargs={**fixed, **extra(scale)}, sim=res)


def step_rate(profile: Path, optimizer: str) -> float | None:
    """The profile's measured optimizer-step seconds per parameter byte for ``optimizer`` (``meta.json``
    ``optimizer_step_s_per_param_byte``, :func:`pipedream.profiler.optimizer_step_rates`); None if absent."""
    rates = read_meta(profile).get("optimizer_step_s_per_param_byte") or {}
    value = rates.get(optimizer) if isinstance(rates, dict) else None
    return float(value) if isinstance(value, int | float) and value > 0 else None


def predict_run(cfg: TrainConfig, mode: str, plan: Plan, profile: Path, clusters_file: Path | str, *,
                num_samples: int, cores: int | None, threads: int, hosts: int = 1) -> Prediction:
    """Predict the epoch time of a ``pipedream train`` run before it starts.

    Args:
        cfg: the run's training config (schedule, batch size, optimizer, link throttle, ...).
        mode: ``pipedream`` (the plan's stages and ranks) or ``dp`` (the whole model on the plan's workers).
        plan: the run's plan (DP runs use its cluster and worker count).
        profile: the ``graph.txt`` the plan came from (its ``meta.json`` beside it).
        clusters_file: the clusters YAML the plan's cluster is read from (a relative path not found here is
            looked up in the checkout).
        num_samples: training samples of the run (``len(task.train)``).
        cores: cores per host (None: the workers compute on GPUs, no sharing); threads: threads per worker;
            hosts: hosts the workers are spread over.
    Raises:
        PipeDreamError: unknown cluster, a profile without its minibatch size, or the simulator's checks.
    """
    graph = LayerGraph.read(profile, profiled_batch(profile))
    cluster = emulated_cluster(get_cluster(plan.cluster, shipped(clusters_file)), cfg.emulate_bandwidth_Bps)
    if plan.workers > cluster.workers:
        raise PipeDreamError(f"plan {plan.config!r} uses {plan.workers} workers but cluster {cluster.name!r} "
                             f"has {cluster.workers}")
    replicas = [s.replicas for s in plan.stages]
    shape = epoch_shape(cfg, mode, num_samples, plan.workers, replicas)
    if mode == "dp":
        stage_nodes, stage_ranks = [list(graph.nodes)], [list(range(plan.workers))]
    else:
        plan.validate()
        stage_nodes, stage_ranks = [s.nodes for s in plan.stages], _plan_ranks(plan, cluster)
    return predict_epoch(graph, stage_nodes, stage_ranks, cluster, shape, cores=cores, threads=threads, hosts=hosts,
                         optimizer=cfg.optimizer, step_s_per_param_byte=step_rate(profile, cfg.optimizer),
                         warmup=cfg.warmup if mode == "pipedream" else None)


def training_samples(cfg: TrainConfig) -> int:
    """Training samples of the run: ``len(task.train)`` of the task its workers load
    (:func:`pipedream.runtime.task.load_task`: the subset of ``cfg.train_subset``, real or synthetic)."""
    return len(load_task(cfg).train)
