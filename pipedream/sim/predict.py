"""Predict a training run's epoch time with the simulator, from what is known before the run starts.

Every ``pipedream train`` run logs this prediction beside its measured epoch time (DESIGN.md, "Checks": a
disagreement is a bug in the model or in the runtime). The prediction is the run's own: its profile
(``graph.txt`` and ``meta.json``), its plan, its cluster (the plan's, from the clusters file), its link
throttle, schedule, minibatch size and epoch length, and the host it runs on. Nothing is fitted to the run
it is checked against.

What is modelled, term by term:

* compute: the profile's per-layer forward and backward seconds (on the CPU each layer's share of whole
  training steps, :mod:`pipedream.in_situ`), scaled linearly to the samples of an action
  (:func:`pipedream.sim.costs.stage_costs`), times the profile's composition factor (a training step over the
  layers' sum, :func:`pipedream.sim.profiled.profiled_composition`: the mean step of the fresh copies the host
  probe timed alone over all its rounds, ``host.copy_step_s``, else the profiling process's ``whole_step_s``) and the host-sharing
  factor below; with ``--recompute`` every backward also runs its stage's forward again
  (:func:`pipedream.sim.costs.recomputed`);
* links: with ``--emulate-bandwidth-Bps B`` every link of the cluster is ``B`` bytes/s (the runtime throttles
  every transfer and allreduce to that bandwidth, :mod:`pipedream.runtime.comm`); otherwise the cluster's;
* allreduce: a ring over the stage's replicas in gradient buckets of ``cfg.bucket_bytes``
  (:func:`pipedream.costmodel.bucket_layers`), each launched when its last gradient is ready, overlapping the
  backward, in both modes (DDP in ``dp``, :mod:`pipedream.runtime.buckets` in ``pipedream``);
* loading the data: the first stage's forward (every DP worker's) includes the profile's seconds to collate
  one minibatch (``meta.json`` ``data_s``), scaled to the action's samples;
* the transport's CPU (CPU hosts): every activation or gradient a rank sends or receives costs it the
  profile's measured ``host.message_s + host.message_s_per_byte * bytes`` of CPU
  (:mod:`pipedream.sim.transport_cpu`, :mod:`pipedream.runtime.message_cost`), added to the forward or
  backward that sends or receives it; each member of a gradient allreduce spends what the profile measured one
  gloo allreduce of the bucket to cost a member of that many (``host.allreduce_s``,
  :mod:`pipedream.runtime.allreduce_cost`; a profile without it: ``4 (n - 1)`` message ends of ``1/n`` of the
  bucket, :func:`pipedream.sim.transport_cpu.allreduce_cpu_s`): in its backward for the buckets
  launched while the backward goes on, beside its actions from the bucket's start for the last bucket, sharing
  the cores with them (:func:`pipedream.sim.transport_cpu.with_transport_cpu`, :mod:`pipedream.sim.cores`);
* the optimizer step: the profile's measured seconds per call, per parameter tensor and per parameter byte of
  the run's optimizer (``optimizer_step_overheads`` and ``optimizer_step_s_per_param_byte`` in ``meta.json``,
  :mod:`pipedream.step_rates`; :func:`pipedream.costmodel.optimizer_step_s`), with the copy of the weights
  first where the schedule stashes versions (:func:`pipedream.memory.copies_on_write`), shared like any
  compute;
* the epoch: exactly the minibatches the run trains (:func:`pipedream.runtime.worker.minibatches_per_epoch`,
  :func:`pipedream.baselines.ddp.minibatches_per_epoch`), filled and drained once, as the workers do.

The host (processor sharing). Workers run ``threads`` threads each (``pipedream train`` sets
``OMP_NUM_THREADS``) on a host of ``cores`` cores. When more threads want a core than there are cores, the
operating system shares the cores among them fairly (Linux CFS): each of ``n`` computing ranks gets ``cores /
(n threads)`` of a core. A rank blocked in a receive or an allreduce (gloo waits in a blocking call; the link
throttle sleeps) uses no core. The simulator models exactly that (:mod:`pipedream.sim.cores`): every forward,
backward and optimizer step is an amount of work, and the ``n`` ranks computing at once on a host each
progress at ``1 / host_scale(n)`` of full speed, re-timed whenever one starts or ends; ranks are spread over
``hosts`` hosts in blocks, as torchrun numbers them. With one thread per worker and the host's scheduler tick
known (``tick_s``; ``pipedream train`` reads its kernel's), each core is a run queue of its own instead
(:mod:`pipedream.sim.run_queues`): a rank waking from a wait takes an idle core or its previous one, one that goes
on computing keeps its core, and a core left idle while another queues two ranks takes one only at the next tick,
as Linux does; the fluid model never idles a core while more ranks compute than there are cores. What the
prediction reports per stage: ``f_s`` (wall seconds of the stage's forwards and backwards per second of their
work) and ``C_s`` (the compute-weighted number of ranks computing at once, ``integral k_s(t) n(t) dt / integral
k_s(t) dt`` with ``n(t)`` the ranks computing at ``t`` and ``k_s(t)`` those of stage ``s``).

Contention. Threads on different cores still share the host's memory bandwidth and caches, so compute is
slower with every core busy even without sharing a core. The profiler measures it on the profiling host: the
mean step of single-threaded copies of the model, one per core at once, over each copy's step alone
(``meta.json`` ``host.contention``, :func:`pipedream.host_timing.host_contention`; 1.02-1.12 for the seven
reduced models on the 2-core CI machine). :func:`host_scale` multiplies the sharing factor by it, taken linearly from
1 with one thread computing to its full value with every core busy; a profile taken on a host with another
core count has none (1.0).

Memory layout. A copy's step time depends on where its tensors land in memory (the reduced S2VT took 49-65 ms
and GNMT-8 82-106 ms in fresh processes on the CI machine, :mod:`pipedream.host_timing`); every rank is a copy of its own,
and replicas wait for their slowest (:mod:`pipedream.sim.layout`).

Assumptions: the fluid model of each run queue (time slices are short against an action; replicas that share
the cores evenly finish together, where a run's replicas stagger a little before each allreduce); a blocked rank
uses no core (the launcher, MLflow logging, gloo's own threads and other processes on the host use none
either); compute of an action scales linearly with its samples; the profile was taken with the workers' thread
count (``meta.json`` ``threads``, :mod:`pipedream.commands.profile`); the runtime's own per-action costs
other than its messages (Python bookkeeping, weight stashing) are not in the profile; mid-epoch checkpoints
(``--checkpoint-every``) and the end-of-epoch loss reduction are not modelled.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipedream import memory
from pipedream.baselines import ddp
from pipedream.costmodel import DDP_BUCKET_CAP_BYTES, StepRates
from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph, profiled_batch, read_meta
from pipedream.paths import shipped
from pipedream.plan import Plan
from pipedream.runtime import worker
from pipedream.runtime.config import TrainConfig
from pipedream.runtime.task import load_datasets
from pipedream.schedules import DEFAULT_WARMUP
from pipedream.sim import layout
from pipedream.sim.cores import host_scale
from pipedream.sim.costs import StageCost, recomputed, stage_costs
from pipedream.sim.engine import Span
from pipedream.sim.profiled import (
    profiled_composition,
    profiled_data_s,
    profiled_host,
    step_rates,
)
from pipedream.sim.run_queues import RunQueues
from pipedream.sim.simulate import MICROBATCHED, SimResult, simulate_stages
from pipedream.sim.transport_cpu import allreduce_cpu_of, with_transport_cpu
from pipedream.topology import Cluster, get_cluster


@dataclass
class EpochShape:
    """What one epoch of a run is, in the simulator's terms.

    Attributes:
        schedule: the simulator's schedule: ``1f1b``, ``gpipe``, ``2bw``, ``pipedream_flush`` or ``dp``.
        batch_size: samples one forward/backward action processes on one worker.
        microbatches: microbatches per minibatch (GPipe, 2BW, PipeDream-Flush; else 1).
        minibatches: the run's minibatches per epoch (``cfg.batch_size`` samples each).
        dataset_size: samples the epoch trains, ``minibatches * cfg.batch_size``.
        recompute: the stages recompute their forwards in their backwards (``cfg.recompute``, PipeDream only).
    """

    schedule: str
    batch_size: int
    microbatches: int
    minibatches: int
    dataset_size: int
    recompute: bool = False


@dataclass
class Prediction:
    """A run's predicted epoch time.

    Attributes:
        epoch_s: predicted epoch time, s.
        compute_scale: per stage, ``f_s``: wall seconds of its forwards and backwards per second of their work
            in the simulated run (1: no sharing).
        concurrency: per stage, ``C_s``: ranks computing at once, as an average unit of the stage's compute sees it.
        busy_ranks: ``sum(utilisation)``: ranks computing at once, time-averaged between the simulator's last two
            runs (``steady_figures=False``: for a short epoch, runs of ``2 n0`` and ``3 n0`` minibatches that need
            not have settled; :func:`pipedream.sim.simulate.simulate_stages`).
        cores: cores per host assumed (None: no sharing, ranks on GPUs); threads: threads per worker assumed;
            contention: the host's measured slowdown with every core computing (:func:`host_scale`);
            oversubscribed: with two threads per core, over their fair share (None: not measured).
        composition: the factor on the layers' times (:func:`~pipedream.sim.profiled.profiled_composition`,
            times the mean memory layout of :mod:`pipedream.sim.layout`).
        stage_factors: per stage, the factor on its layers' share (:mod:`pipedream.stage_probe`); None: none.
        shape: the epoch simulated.
        cluster: the cluster simulated (emulated bandwidth applied).
        sim_kwargs: the keyword parameters passed to the simulator (costs excluded).
        sim: the simulated run (its trace kept).
        compute_s: per stage, the seconds of compute one of its ranks spends in the epoch: the forward and
            backward of each (micro)batch it takes (the epoch's, dealt round robin over the stage's ranks) at
            its ``f_s``; what the runtime logs as ``compute_s_stage<s>``.
        work_s: per stage, the seconds of work at full speed one of its ranks does in the simulated epoch
            (forwards, backwards, optimizer steps and its share of the allreduces' CPU, mean over the stage's
            ranks): the CPU seconds it would spend if nothing else cost any, against which the runtime's
            ``cpu_s_stage<s>`` is compared.
        step_work_s: per stage, the part of ``work_s`` in its optimizer steps (copy on write, the step, zeroing
            the gradients), against which the runtime's ``step_cpu_s_stage<s>`` is compared.
        memory: per stage, the bytes one replica holds at its peak by kind and in total
            (:func:`pipedream.memory.plan_memory`, as dicts); empty when not predicted.
    """

    epoch_s: float
    compute_scale: list[float]
    concurrency: list[float]
    busy_ranks: float
    cores: int | None
    threads: int
    shape: EpochShape
    cluster: Cluster
    contention: float = 1.0
    oversubscribed: float | None = None
    composition: float = 1.0
    stage_factors: list[float] | None = None
    sim_kwargs: dict[str, Any] = field(default_factory=dict)
    sim: SimResult | None = field(default=None, repr=False)
    memory: list[dict[str, float]] = field(default_factory=list)
    compute_s: list[float] = field(default_factory=list)
    work_s: list[float] = field(default_factory=list)
    step_work_s: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (without the simulator's result)."""
        return {"predicted_epoch_time_s": self.epoch_s, "compute_scale": self.compute_scale,
                "concurrency": self.concurrency, "busy_ranks": self.busy_ranks,
                "cores": self.cores, "contention": self.contention,
                "oversubscribed": self.oversubscribed, "composition": self.composition,
                "stage_factors": self.stage_factors,
                "threads": self.threads, "shape": dataclasses.asdict(self.shape), "cluster": self.cluster.describe(),
                "sim_kwargs": {k: v for k, v in self.sim_kwargs.items() if k != "costs"}, "memory_bytes": self.memory,
                "compute_s": self.compute_s, "work_s": self.work_s, "step_work_s": self.step_work_s}


def compute_concurrency(spans: list[tuple[float, float]], mine: list[bool] | None = None) -> float:
    """Compute-weighted concurrency of ``(start_s, end_s)`` compute spans: ``integral k(t) n(t) dt / integral
    k(t) dt`` with ``n(t)`` the spans open at ``t`` and ``k(t)`` those of them flagged in ``mine`` (default: all,
    giving ``integral n^2 / integral n``); 0 without any (flagged) span of positive length.

    Two ranks computing ``[0, 2)`` and ``[1, 3)``: ``n`` is 1, 2, 1 over three seconds, so
    ``(1 + 4 + 1) / (1 + 2 + 1) = 1.5``; only the first flagged: ``(1 + 2) / (1 + 1) = 1.5``.
    """
    flags = mine if mine is not None else [True] * len(spans)
    events = sorted([(a, 1, int(f)) for (a, b), f in zip(spans, flags, strict=True) if b > a]
                    + [(b, -1, -int(f)) for (a, b), f in zip(spans, flags, strict=True) if b > a])
    n = k = 0
    last, first_moment, cross_moment = 0.0, 0.0, 0.0
    for t, step, own in events:
        first_moment += k * (t - last)
        cross_moment += k * n * (t - last)
        n, k, last = n + step, k + own, t
    return cross_moment / first_moment if first_moment > 0 else 0.0


def emulated_cluster(cluster: Cluster, bandwidth_Bps: float | None) -> Cluster:
    """``cluster`` with every level's bandwidth set to ``bandwidth_Bps`` (the runtime's link throttle,
    ``--emulate-bandwidth-Bps``); the cluster itself when None."""
    if not bandwidth_Bps:
        return cluster
    return dataclasses.replace(cluster, levels=[(w, float(bandwidth_Bps)) for w, _ in cluster.levels])


def epoch_shape(cfg: TrainConfig, mode: str, num_samples: int, workers: int, replicas: list[int]) -> EpochShape:
    """The epoch the run's workers train, from the same functions the workers call.

    PipeDream: :func:`pipedream.runtime.worker.minibatches_per_epoch` minibatches of ``cfg.batch_size``
    (GPipe, 2BW and PipeDream-Flush: ``cfg.microbatches`` microbatches of ``batch_size / microbatches`` each). DP
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
    m = cfg.microbatches if cfg.schedule in MICROBATCHED else 1
    return EpochShape(cfg.schedule, cfg.batch_size // m, m, nb, nb * cfg.batch_size, cfg.recompute)


def predict_epoch(graph: LayerGraph, stage_nodes: list[list[str]], stage_ranks: list[list[int]], cluster: Cluster,
                  shape: EpochShape, *, cores: int | None, threads: int = 1, hosts: int = 1,
                  step: StepRates | None = None, bucket_bytes: float = DDP_BUCKET_CAP_BYTES, warmup: str | None = None,
                  contention: float = 1.0, oversubscribed: float | None = None, data_s: float = 0.0,
                  composition: float = 1.0, message_s: float = 0.0, message_s_per_byte: float = 0.0,
                  allreduce_s: Mapping[int, tuple[float, float]] | None = None,
                  layouts: tuple[float, ...] = (), stage_factors: Sequence[float] | None = None,
                  compute_factors: Sequence[float] | None = None, tick_s: float | None = None) -> Prediction:
    """Predict one epoch on a host of ``cores`` cores, its ranks sharing the cores (module docstring).

    Args:
        graph: the profile (``minibatch_size`` set).
        stage_nodes: node ids per stage (DP: one stage with all nodes).
        stage_ranks: ranks per stage in round-robin order (DP: one list of all ranks).
        cluster: links as the run pays them (:func:`emulated_cluster`).
        shape: the epoch (:func:`epoch_shape`).
        cores: cores of each host (:func:`pipedream.host_timing.host_cores`); None when the ranks do not compute on shared cores
            (one GPU each): no host sharing. threads: threads per worker.
        hosts: hosts the ranks are spread over evenly (``--nnodes``); each host's cores are shared by its
            ranks, so the concurrency per host is ``C / hosts``.
        step: the run's optimizer and its step's measured seconds per call, per parameter tensor and per byte
            on the host (:func:`pipedream.sim.profiled.step_rates`); without a measured rate per byte (a profile
            that did not time the optimizer) the step takes no time: the host is no V100, so the memory-bound
            estimate (``memory_Bps``) is never taken. None: SGD, untimed.
        bucket_bytes: the run's gradient bucket cap, bytes (``cfg.bucket_bytes``).
        warmup: 1F1B's warm-up counts (``cfg.warmup``); None: the simulator's default.
        contention: the host's slowdown with every core computing (:func:`host_scale`); 1: none.
        oversubscribed: the host's slowdown with two threads per core over their fair share
            (:func:`host_scale`); None: not measured (``contention`` above ``cores`` threads too).
        data_s: seconds to load one profiled minibatch (``meta.json`` ``data_s``); the first stage's forward
            (every DP worker's) pays it scaled to its samples.
        composition: factor on every layer's forward and backward time: a whole step over the layers' sum
            (:func:`~pipedream.sim.profiled.profiled_composition`); 1: the layers' times as profiled.
        message_s, message_s_per_byte: CPU one message end costs a rank on this host, s and s/byte
            (:mod:`pipedream.runtime.message_cost`); with ``cores`` set, charged to the forwards and backwards
            that send and receive (:func:`pipedream.sim.transport_cpu.with_transport_cpu`).
        allreduce_s: CPU one gloo allreduce costs each member on this host, member count -> ``(fixed_s,
            per_byte_s)`` (:mod:`pipedream.runtime.allreduce_cost`, the profile's ``host.allreduce_s``;
            :func:`pipedream.sim.transport_cpu.measured_allreduce_cpu_s`); None or empty: estimated from the
            message cost (:func:`pipedream.sim.transport_cpu.allreduce_cpu_s`).
        layouts: fresh copies' step over the profiled one's on this host (``host.layouts``,
            :mod:`pipedream.sim.layout`): their mean scales the layers like ``composition``; with two or more,
            the epoch is the mean over :data:`pipedream.sim.layout.SAMPLES` simulations, each stage at its
            slowest replica's draw (the per-stage figures are the mean copy's); (): none.
        stage_factors: one factor per stage on its layers' forwards and backwards after ``composition``: the
            stage's step alone over its layers' share of the whole step, measured before the run
            (:func:`pipedream.stage_probe.probe`); None: the shares.
        compute_factors: one factor per stage on its forwards and backwards, data loading included; None: the
            prediction. After a run, its measured compute CPU over the prediction's work per stage
            (``measured_compute_cpu_s_stage<s>`` / ``predicted_compute_work_s_stage<s>``) resimulates the run
            with its compute as measured and everything else as predicted: how much of a miss the compute
            explains. That is a diagnosis of the model, never a prediction (it reads the run). The measured CPU
            already holds what the host's sharing costs beyond a fair share of a core (caches refilled after a
            switch and memory stalls are spent on the thread's own CPU) and the ranks' own memory layouts, so a
            resimulation shares the cores fairly (``contention`` and ``oversubscribed`` 1) and draws no layouts;
            counted again, S2VT's four-replica runs resimulated at 0.81-0.82 of their measured epoch while their
            compute took exactly the fair share of the cores (wall over CPU 1.96-2.00 with 4 ranks on 2 cores).
            What is not measured (optimizer steps, the transport's CPU) then shares the cores fairly too, without
            the host's slowdown of at most ``oversubscribed``: in session 27's ``make run`` that work was 7-63% of
            a stage's predicted work (AlexNet's last stage the most) and ``oversubscribed`` at most 1.095, so at
            most about 6% of a stage's work is left out.
        tick_s: the host kernel's scheduler tick (:func:`pipedream.sim.run_queues.scheduler_tick_s`): with
            ``cores`` and one thread per worker, each core is a run queue of its own, balanced at the ticks
            (:mod:`pipedream.sim.run_queues`); None: the fluid model of :mod:`pipedream.sim.cores`.
    Raises:
        PipeDreamError: the simulator's checks, non-positive cores or threads, stage_factors or compute_factors
            not one positive factor per stage.
    """
    for name, given in (("stage_factors", stage_factors), ("compute_factors", compute_factors)):
        if given is not None and (len(given) != len(stage_nodes) or not all(f > 0 for f in given)):
            raise PipeDreamError(f"{name} must be one positive factor per stage ({len(stage_nodes)}), got {list(given)}")
    copies = memory.copies_on_write(shape.schedule, [len(rs) for rs in stage_ranks], shape.microbatches,
                                    warmup or DEFAULT_WARMUP)
    rates = dataclasses.replace(step or StepRates(), memory_Bps=None)
    base = stage_costs(graph, stage_nodes, shape.batch_size, bucket_bytes=bucket_bytes, step=rates,
                       copies_on_write=copies)
    typical, draws = layout.spread(layouts)
    if compute_factors is not None:  # the measured CPU holds the host's sharing costs and the ranks' layouts (above)
        contention, oversubscribed, draws = 1.0, 1.0, ()
    composition *= typical
    if stage_factors is not None:  # each stage's compute as it runs alone
        base = layout.scaled(base, stage_factors)
    if composition != 1.0:  # the layers' compute as a whole step runs it; the optimizer step is timed apart
        base = layout.scaled(base, [composition] * len(base))
    if shape.recompute:  # after the composition (a forward as a step runs it), before the data: not loaded again
        base = recomputed(base)

    def loaded(costs: list[StageCost]) -> list[StageCost]:  # the first stage loads its (micro)batch in its forward
        if not (data_s and graph.minibatch_size):
            return costs
        extra = data_s * shape.batch_size / graph.minibatch_size
        return [dataclasses.replace(costs[0], fwd_s=costs[0].fwd_s + extra), *costs[1:]]

    collective_cpu = allreduce_cpu_of(allreduce_s, message_s, message_s_per_byte)  # gloo's own CPU, per member

    def with_cpu(costs: list[StageCost]) -> list[StageCost]:  # the workers share the cores with the transport
        return costs if cores is None else with_transport_cpu(costs, message_s, message_s_per_byte,
                                                              [len(rs) for rs in stage_ranks], collective_cpu)

    def measured(costs: list[StageCost]) -> list[StageCost]:  # a resimulation: each stage's compute as measured
        return costs if compute_factors is None else layout.scaled(costs, compute_factors)

    # what the runtime times as compute (its compute_s_stage<s>): the transport's CPU is not in it
    compute = measured(loaded(base))
    kwargs: dict[str, Any] = {"schedule": shape.schedule, "batch_size": shape.batch_size,
                              "microbatches": shape.microbatches, "dataset_size": shape.dataset_size, "overlap": True}
    if warmup is not None:
        kwargs["warmup"] = warmup
    if hosts < 1:
        raise PipeDreamError(f"hosts must be positive, got {hosts}")

    workers = sum(len(rs) for rs in stage_ranks)
    per_host = math.ceil(workers / hosts)  # torchrun numbers ranks host by host

    queues = RunQueues(cores, tick_s) if cores is not None and threads == 1 and tick_s is not None else None

    def slowdown(n: int) -> float:
        return host_scale(n, threads, cores, contention, oversubscribed)  # type: ignore[arg-type]

    def simulated(costs: list[StageCost], trace: bool) -> SimResult:
        return simulate_stages(graph, stage_nodes, stage_ranks, cluster, costs=with_cpu(costs), keep_trace=trace,
                               sharing=None if cores is None else slowdown, host_of=lambda r: r // per_host,
                               collective_cpu=collective_cpu, queues=queues, steady_figures=False, **kwargs)

    res = simulated(compute, True)
    epoch_s = res.epoch_time_s
    if len(draws) > 1:  # each rank's copy is a draw: replicas wait for their slowest, a pipeline for its slowest stage
        epoch_s = statistics.fmean(simulated(measured(loaded(layout.scaled(base, f))), False).epoch_time_s
                                   for f in layout.stage_factor_samples(draws, [len(rs) for rs in stage_ranks]))
    assert res.trace is not None  # keep_trace
    stage_of = {r: s for s, rs in enumerate(stage_ranks) for r in rs}
    spans = [sp for ranked in res.trace.compute.values() for sp in ranked] + list(res.trace.steps)
    bounds = [(sp.start, sp.end) for sp in spans]
    conc = [compute_concurrency(bounds, [stage_of[sp.rank] == s for sp in spans]) for s in range(len(stage_ranks))]
    scale = []  # per stage: wall seconds of its forwards and backwards per second of their work
    for rs in stage_ranks:
        mine = [sp for r in rs for sp in res.trace.compute[r]]
        work = sum(sp.work_s for sp in mine)
        scale.append(sum(sp.end - sp.start for sp in mine) / work if work > 0 else 1.0)
    units = res.epoch_minibatches * shape.microbatches  # (micro)batches of the epoch, dealt round robin
    compute_s = [(c.fwd_s + c.bwd_s) * f * units / len(rs) for c, f, rs in zip(compute, scale, stage_ranks, strict=True)]
    # the trace covers a few minibatches: scale its work to the epoch's (micro)batches, which stage 0's ranks
    # each run one forward and one backward of
    traced = sum(len(res.trace.compute[r]) for r in stage_ranks[0]) / 2
    per_unit = units / traced if traced else 0.0

    def epoch_work(traced_spans: list[Span]) -> list[float]:  # per stage, one rank's work in them over the epoch
        return [sum(sp.work_s for sp in traced_spans if stage_of[sp.rank] == s) * per_unit / len(rs)
                for s, rs in enumerate(stage_ranks)]

    work_s, step_work_s = epoch_work(spans + res.trace.background), epoch_work(res.trace.steps)
    return Prediction(epoch_s=epoch_s, compute_scale=scale, concurrency=conc, compute_s=compute_s,
                      work_s=work_s, step_work_s=step_work_s,
                      busy_ranks=sum(res.utilisation),
                      cores=cores, threads=threads, contention=contention, oversubscribed=oversubscribed,
                      composition=composition, shape=shape,
                      stage_factors=None if stage_factors is None else list(stage_factors),
                      cluster=cluster,
                      sim_kwargs={**kwargs, "bucket_bytes": bucket_bytes, **rates.record(), "message_s": message_s,
                                  "message_s_per_byte": message_s_per_byte, "tick_s": tick_s if queues is not None else None,
                                  "allreduce_s": {str(n): list(c) for n, c in (allreduce_s or {}).items()}}, sim=res)


def predict_run(cfg: TrainConfig, mode: str, plan: Plan, profile: Path, clusters_file: Path | str, *,
                num_samples: int, cores: int | None, threads: int, hosts: int = 1,
                stage_factors: Sequence[float] | None = None,
                compute_factors: Sequence[float] | None = None, tick_s: float | None = None) -> Prediction:
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
        stage_factors: per stage, its step alone over its share of the whole step (:mod:`pipedream.stage_probe`,
            measured before the run; ``mode`` ``pipedream`` only); None: the shares.
        compute_factors: per stage, for a resimulation after the run (:func:`predict_epoch`); None: the prediction.
        tick_s: the host kernel's scheduler tick, for run queues per core (:func:`predict_epoch`); None: fluid.
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
        stage_nodes, stage_ranks = [s.nodes for s in plan.stages], [list(s.ranks) for s in plan.stages]
    meta = read_meta(profile)
    pred = predict_epoch(graph, stage_nodes, stage_ranks, cluster, shape, cores=cores, threads=threads, hosts=hosts,
                         step=step_rates(meta, cfg.optimizer),
                         bucket_bytes=cfg.bucket_bytes, warmup=cfg.warmup if mode == "pipedream" else None,
                         data_s=profiled_data_s(meta), composition=profiled_composition(meta, graph),
                         stage_factors=stage_factors if mode != "dp" else None, compute_factors=compute_factors,
                         tick_s=tick_s,
                         **profiled_host(meta, cores))
    pred.memory = predict_memory(cfg, mode, graph, stage_nodes, [len(r) for r in stage_ranks], shape)
    return pred


def predict_memory(cfg: TrainConfig, mode: str, graph: LayerGraph, stage_nodes: list[list[str]], replicas: list[int],
                   shape: EpochShape) -> list[dict[str, float]]:
    """Per stage, the bytes one replica of the run holds at its peak (:func:`pipedream.memory.plan_memory`
    on the profile scaled to the run's (micro)batch, the run's schedule, optimizer and momentum), as dicts
    of the kinds and ``total``; ``shape.recompute`` counts one (micro)batch's activations, the one being
    recomputed. DP is one stage on every worker, one minibatch in flight."""
    scaled = graph.scaled(shape.batch_size)
    if mode == "dp":
        schedule = "dp"
    else:
        schedule = "vertical" if cfg.schedule == "1f1b" and cfg.weight_sync == "vertical" else cfg.schedule
    need = memory.plan_memory(scaled, stage_nodes, replicas, schedule=schedule, microbatches=shape.microbatches,
                              warmup=cfg.warmup, optimizer=cfg.optimizer, momentum=cfg.momentum,
                              recompute=shape.recompute)
    return [m.as_dict() for m in need]


def training_samples(cfg: TrainConfig) -> int:
    """Training samples of the run: the length of the training set its workers load
    (:func:`pipedream.runtime.task.load_datasets`: the subset of ``cfg.train_subset``, real or synthetic), read
    without building the model."""
    return len(load_datasets(cfg)[0])
