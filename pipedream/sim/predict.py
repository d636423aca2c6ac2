"""Predict a training run's epoch time with the simulator, from what is known before the run starts: its profile,
plan, cluster, link throttle, schedule, minibatch size and epoch length (passed in by :mod:`pipedream.run_prediction`)
and the host it runs on; nothing is fitted to the run it is checked against. Compute (the profile's layers, scaled
to an action's samples and by the profile's composition factor), the host (processor sharing on a CPU), the links,
the bucketed allreduce overlapping the backward, the data loading, the optimizer step and the epoch's exact
minibatches are modelled; each term, and the assumptions: docs/simulator.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from pipedream import memory
from pipedream.costmodel import DDP_BUCKET_CAP_BYTES, StepRates
from pipedream.graph import LayerGraph
from pipedream.schedules import DEFAULT_WARMUP
from pipedream.sim.cores import Host
from pipedream.sim.costs import StageCost, recomputed, stage_costs
from pipedream.sim.simulate import SimOptions, SimResult, simulate_stages
from pipedream.topology import Cluster


@dataclass
class EpochShape:
    """What one epoch of a run is, in the simulator's terms.

    Attributes:
        schedule: the simulator's schedule: ``1f1b``, ``gpipe``, ``2bw``, ``pipedream_flush`` or ``dp``.
        batch_size: samples one forward/backward action processes on one worker.
        microbatches: microbatches per minibatch (GPipe, 2BW, PipeDream-Flush; else 1).
        minibatches: the run's minibatches per epoch.
        dataset_size: samples the epoch trains.
        recompute: the stages recompute their forwards in their backwards (PipeDream only).
    """

    schedule: str
    batch_size: int
    microbatches: int
    minibatches: int
    dataset_size: int
    recompute: bool = False


@dataclass(frozen=True)
class RunCosts:
    """What a run pays besides its layers' compute and its links, as measured by its profile.

    Attributes:
        host: the CPU hosts the ranks share (:class:`pipedream.sim.cores.Host`); None: one GPU per rank.
        step: the run's optimizer and its step's measured seconds per call, per tensor and per parameter byte
            (:func:`pipedream.sim.profiled.step_rates`); without a measured rate per byte the step takes no time
            (the memory-bound estimate is a V100's, never a CPU's). None: SGD, untimed.
        bucket_bytes: the run's gradient bucket cap, bytes.
        warmup: 1F1B's warm-up counts (``consistent`` or ``release``); None: the simulator's default.
        data_s: seconds to load one profiled minibatch (``meta.json`` ``data_s``); the first stage's forward (every
            DP worker's) pays it scaled to its samples.
        composition: factor on every layer's forward and backward: a whole step over the layers' sum
            (:func:`pipedream.sim.profiled.profiled_composition`); 1: the layers as profiled.
    """

    host: Host | None = None
    step: StepRates | None = None
    bucket_bytes: float = DDP_BUCKET_CAP_BYTES
    warmup: str | None = None
    data_s: float = 0.0
    composition: float = 1.0


@dataclass
class Prediction:
    """A run's predicted epoch time.

    Attributes:
        epoch_s: predicted epoch time, s.
        shape: the epoch simulated.
        cluster: the cluster simulated (emulated bandwidth applied).
        cores: cores per host assumed (None: ranks on GPUs, no sharing).
        compute_s: per stage, the seconds one of its ranks spends computing forwards and backwards in the epoch
            (wall time, sharing included): what the runtime logs as ``compute_s_stage<s>``.
        wait_s: per stage, the seconds one of its ranks is blocked in receives and allreduces in the epoch: what
            the runtime logs as ``wait_s_stage<s>``.
        sim_kwargs: the keyword parameters passed to the simulator (costs excluded).
        sim: the simulated run (its trace kept).
        memory: per stage, the bytes one replica holds at its peak by kind and in total
            (:func:`pipedream.memory.plan_memory`, as dicts); empty when not predicted.
        checkpoint_flush_s: the seconds a checkpoint's flush adds (:func:`checkpoint_flush_s`); None when the run
            does not checkpoint inside its epochs.
    """

    epoch_s: float
    shape: EpochShape
    cluster: Cluster
    cores: int | None
    compute_s: list[float] = field(default_factory=list)
    wait_s: list[float] = field(default_factory=list)
    sim_kwargs: dict[str, Any] = field(default_factory=dict)
    sim: SimResult | None = field(default=None, repr=False)
    memory: list[dict[str, float]] = field(default_factory=list)
    checkpoint_flush_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (without the simulator's result)."""
        return {"predicted_epoch_time_s": self.epoch_s, "cores": self.cores, "shape": dataclasses.asdict(self.shape),
                "cluster": self.cluster.describe(), "sim_kwargs": self.sim_kwargs, "memory_bytes": self.memory,
                "compute_s": self.compute_s, "wait_s": self.wait_s, "checkpoint_flush_s": self.checkpoint_flush_s}


def emulated_cluster(cluster: Cluster, bandwidth_Bps: float | None) -> Cluster:
    """``cluster`` with every level's bandwidth set to ``bandwidth_Bps`` (the runtime's link throttle,
    ``--emulate-bandwidth-Bps``); the cluster itself when None."""
    if not bandwidth_Bps:
        return cluster
    return dataclasses.replace(cluster, levels=[(w, float(bandwidth_Bps)) for w, _ in cluster.levels])


def _loaded(costs: list[StageCost], data_s: float, batch_size: int, profiled_batch: int | None) -> list[StageCost]:
    """The first stage loads its (micro)batch in its forward: ``data_s`` scaled from the profiled minibatch."""
    if not (data_s and profiled_batch):
        return costs
    extra = data_s * batch_size / profiled_batch
    return [dataclasses.replace(costs[0], fwd_s=costs[0].fwd_s + extra), *costs[1:]]


def predict_epoch(graph: LayerGraph, stage_nodes: list[list[str]], stage_ranks: list[list[int]], cluster: Cluster,
                  shape: EpochShape, costs: RunCosts) -> Prediction:
    """Predict one epoch of a run (module docstring).

    Args:
        graph: the profile (``minibatch_size`` set).
        stage_nodes: node ids per stage (DP: one stage with all nodes).
        stage_ranks: ranks per stage in round-robin order (DP: one list of all ranks).
        cluster: links as the run pays them (:func:`emulated_cluster`).
        shape: the epoch.
        costs: the host, optimizer step, buckets, warm-up, data loading and composition (:class:`RunCosts`).
    Raises:
        PipeDreamError: the simulator's checks.
    """
    warmup = costs.warmup or DEFAULT_WARMUP
    copies = memory.copies_on_write(shape.schedule, [len(rs) for rs in stage_ranks], shape.microbatches, warmup)
    rates = dataclasses.replace(costs.step or StepRates(), memory_Bps=None)
    base = stage_costs(graph, stage_nodes, shape.batch_size, bucket_bytes=costs.bucket_bytes, step=rates,
                       copies_on_write=copies)
    if costs.composition != 1.0:  # the layers' compute as a whole step runs it; the optimizer step is timed apart
        base = [dataclasses.replace(c, fwd_s=c.fwd_s * costs.composition, bwd_s=c.bwd_s * costs.composition)
                for c in base]
    if shape.recompute:  # after the composition (a forward as a step runs it), before the data: not loaded again
        base = recomputed(base)
    compute = _loaded(base, costs.data_s, shape.batch_size, graph.minibatch_size)
    kwargs: dict[str, Any] = {"schedule": shape.schedule, "batch_size": shape.batch_size, "warmup": warmup,
                              "microbatches": shape.microbatches, "dataset_size": shape.dataset_size, "overlap": True}
    options = SimOptions(keep_trace=True, host=costs.host, steady_figures=False, **kwargs)
    res = simulate_stages(graph, stage_nodes, stage_ranks, cluster, options, costs=compute)
    assert res.trace is not None  # keep_trace
    tr = res.trace
    # the trace covers a few minibatches: scale it to the epoch's (micro)batches, which stage 0's ranks each run
    # one forward and one backward of
    units = res.epoch_minibatches * shape.microbatches
    traced = sum(len(tr.compute[r]) for r in stage_ranks[0]) / 2
    per_unit = units / traced if traced else 0.0
    compute_s = [sum(tr.busy_s[r] for r in rs) * per_unit / len(rs) for rs in stage_ranks]
    wait_s = [sum(tr.recv_wait_s[r] + tr.allreduce_wait_s[r] for r in rs) * per_unit / len(rs) for rs in stage_ranks]
    host = costs.host
    return Prediction(epoch_s=res.epoch_time_s, shape=shape, cluster=cluster,
                      cores=None if host is None else host.cores, compute_s=compute_s, wait_s=wait_s,
                      sim_kwargs={**kwargs, "bucket_bytes": costs.bucket_bytes, **rates.record(),
                                  "ranks_per_host": None if host is None else host.ranks_per_host},
                      sim=res)



def checkpoint_flush_s(graph: LayerGraph, stage_nodes: list[list[str]], stage_ranks: list[list[int]], cluster: Cluster,
                       pred: Prediction, costs: RunCosts) -> float:
    """The seconds a checkpoint adds to an epoch by flushing the pipeline (its drain and refill): a segment of ``n``
    minibatches (``2 x stages``, at least 4, in rounds of the replicas: the probe of ``--checkpoint-every auto``)
    simulated alone, less ``n`` minibatches at the epoch's steady rate (the epoch ``pred`` predicted, less that
    segment, over its other minibatches). 0 where the schedule drains at every minibatch anyway (GPipe,
    PipeDream-Flush) and for data parallelism, as the simulation finds; :func:`pipedream.costmodel.checkpoint_overhead`
    turns it into the overhead of an interval."""
    shape = pred.shape
    round_ = max(len(rs) for rs in stage_ranks)
    n = -(-max(4, 2 * len(stage_nodes)) // round_) * round_
    if n >= shape.minibatches:  # an epoch no longer than the segment: a checkpoint inside it would flush nothing new
        return 0.0
    segment = dataclasses.replace(shape, minibatches=n, dataset_size=n * shape.batch_size * shape.microbatches)
    alone = predict_epoch(graph, stage_nodes, stage_ranks, cluster, segment, costs).epoch_s
    steady_s = (pred.epoch_s - alone) / (shape.minibatches - n)
    return max(0.0, alone - n * steady_s)
