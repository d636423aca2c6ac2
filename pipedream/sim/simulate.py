"""Cluster simulator: time PipeDream, GPipe, 2BW, PipeDream-Flush and data parallelism on a modelled cluster.

The simulator times the per-rank action lists of :mod:`pipedream.schedules` (the lists the runtime
executes) with compute from a layer-graph profile, DDP gradient buckets and the optimizer step
(:mod:`pipedream.sim.costs`) and links with per-level bandwidth, latency and contention
(:mod:`pipedream.sim.network`), event by event (:mod:`pipedream.sim.engine`); every formula is
:mod:`pipedream.costmodel`'s.

An epoch is ``ceil(dataset_size / samples per minibatch)`` minibatches. Rather than simulating all of
them (ImageNet: 20,000 minibatches of 64), short runs of ``n``, ``2n`` and ``3n`` minibatches are
simulated (``n`` a multiple of every stage's replica count, doubled until ``T(2n) - T(n)`` equals
``T(3n) - T(2n)``, i.e. the transient is over) and the epoch is extrapolated in closed form:
``T(N) = T(n_b) + (N - n_b) * P`` with ``n_a = 2n``, ``n_b = 3n`` and the steady-state period
``P = (T(n_b) - T(n_a)) / (n_b - n_a)``. The schedules are periodic once the pipeline is full, so this
equals the event simulation of all ``N`` minibatches (tests and the benchmark check it).

Outputs (:class:`SimResult`): steady time per minibatch and per sample, epoch time, per-worker
utilisation (fraction of time in forward/backward), bubble fraction (1 - mean utilisation), bytes
sent per sample by point-to-point transfers (activations and their gradients) and by allreduces
(weights), and the fraction of worker time stalled in allreduce (the paper's Figure 1 "communication
overhead" of data parallelism, §2.1) or in receives.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from pipedream import costmodel, memory, schedules, tied, torch_schedules
from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph
from pipedream.plan import Plan, config_string
from pipedream.schedules import DEFAULT_WARMUP
from pipedream.sim.cores import Cores, Host
from pipedream.sim.costs import StageCost, recomputed, stage_costs
from pipedream.sim.engine import Trace, run
from pipedream.sim.network import Network
from pipedream.topology import Cluster

# command-line name -> pipedream.schedules name ("pipedream" is the old name of 1f1b, still accepted)
SCHEDULES = {"pipedream": "1f1b", "1f1b": "1f1b", "gpipe": "gpipe", "2bw": "2bw", "pipedream_flush": "pipedream_flush",
             "dp": "dp", **{name: name for name in memory.TORCH_FLUSH}}
# schedules whose minibatches are split into microbatches
MICROBATCHED = ("gpipe", "2bw", "pipedream_flush", *memory.TORCH_FLUSH)
# flush schedules with one weight copy: each rank's peak memory walks its action list (pipedream.memory.rank_memory)
FLUSH = ("gpipe", "pipedream_flush", *memory.TORCH_FLUSH)
# The allreduce `pipedream simulate`, the planner's re-ranking and the predicted Table 1 assume unless told:
# a flat ring through all ranks, as NCCL 2.4 (PyTorch 1.1, the paper's DDP) ran it (see
# pipedream.table1.predicted); "hierarchical" is the alternative.
DEFAULT_ALLREDUCE = "ring"
IMAGENET_TRAIN_SAMPLES = 1_281_167
MAX_DOUBLINGS = 6
STEADY_RTOL = 1e-4  # relative agreement of successive periods that counts as the steady state
# Without the steady-state figures (SimOptions(steady_figures=False)), an epoch of at most this many
# minibatches gets one look for the steady state (runs of n0, 2 n0, 3 n0) and, unsettled, is simulated exactly
# instead of searched: a short epoch costs less to simulate whole than the search's runs.
EXACT_EPOCH_MINIBATCHES = 1024


@dataclass(frozen=True)
class SimOptions:
    """How :func:`simulate_stages` runs a schedule; every field has the default `pipedream simulate` uses.

    Attributes:
        schedule: ``1f1b`` (1F1B-RR, also ``pipedream``), ``gpipe``, ``2bw``, ``pipedream_flush`` or ``dp``.
        batch_size: samples per forward/backward action on a worker (None: the profiled minibatch).
        microbatches: microbatches per minibatch for GPipe, 2BW and PipeDream-Flush (ignored by the others).
        dataset_size: samples in an epoch.
        overlap: wait-free backpropagation for allreduces.
        allreduce: ``ring`` (:data:`DEFAULT_ALLREDUCE`) or ``hierarchical``.
        contention: ``lanes`` (collectives and point-to-point transfers on separate lanes of a port) or
            ``exclusive`` (see :mod:`pipedream.sim.network`).
        sync: ``lockstep`` (DDP, the release) or ``independent`` replicas (the planner's assumption), see
            :mod:`pipedream.sim.engine`.
        warmup: 1F1B warm-up counts, ``consistent`` (:func:`pipedream.schedules.warmup_count_consistent`,
            what our runtime runs by default) or ``release`` (the release runtime's formula, ``--compat``).
        bucket_bytes: DDP gradient bucket cap, bytes (default DDP's 25 MiB); one allreduce per bucket.
        step: how a replica's optimizer step is priced (:class:`pipedream.costmodel.StepRates`, e.g.
            :func:`pipedream.sim.profiled.step_rates` of the profile; None: its defaults, SGD with momentum memory
            bound at a V100's 900e9 bytes/s). ``bucket_bytes`` and ``step`` build the stage costs; they are
            ignored where the costs are given.
        host: the CPU hosts the ranks share (processor sharing, :mod:`pipedream.sim.cores`); None: every rank
            computes on its own device.
        recompute: activation recomputation: every backward also runs its forward again
            (:func:`pipedream.sim.costs.recomputed`, applied to given costs too).
        steady_figures: search for the steady state (the steady-state figures: ``time_per_minibatch_s``,
            ``utilisation``, ...; :func:`_steady_state`) whatever the epoch's length. False (what a prediction
            asks, :func:`pipedream.sim.predict.predict_epoch`): for an epoch of at most
            :data:`EXACT_EPOCH_MINIBATCHES` minibatches, one look (runs of ``n0``, ``2 n0``, ``3 n0``); if those
            have not settled, the epoch is simulated once, exactly, and the figures are those of the runs tried
            (``steady_state_converged`` False). Longer epochs are searched as with True.
        keep_trace: keep the spans of the first short run (for timelines).
    """

    schedule: str = "1f1b"
    batch_size: int | None = None
    microbatches: int = 1
    dataset_size: int = IMAGENET_TRAIN_SAMPLES
    overlap: bool = True
    allreduce: str = DEFAULT_ALLREDUCE
    contention: str = "lanes"
    sync: str = "lockstep"
    warmup: str = DEFAULT_WARMUP
    bucket_bytes: float = costmodel.DDP_BUCKET_CAP_BYTES
    step: costmodel.StepRates | None = None
    host: Host | None = None
    recompute: bool = False
    steady_figures: bool = True
    keep_trace: bool = False

    @property
    def microbatches_run(self) -> int:
        """Microbatches per minibatch the schedule runs: ``microbatches`` for the microbatched schedules, else 1."""
        return self.microbatches if SCHEDULES.get(self.schedule) in MICROBATCHED else 1


@dataclass
class SimResult:
    """What one simulation predicts (times in seconds, sizes in bytes).

    Attributes:
        schedule: ``1f1b``, ``gpipe``, ``2bw``, ``pipedream_flush`` or ``dp``.
        config: replica counts in the paper's form (``"15-1"``, ``"16"``, ``"straight"``).
        workers: ranks that run the schedule.
        batch_size: samples one forward/backward action processes (per worker).
        microbatches: microbatches per minibatch (GPipe, 2BW, PipeDream-Flush; else 1).
        samples_per_minibatch: samples in one schedule minibatch (``batch_size * microbatches``).
        time_per_minibatch_s: steady-state period per schedule minibatch.
        time_per_sample_s: steady-state time per sample.
        dataset_size: samples in an epoch.
        epoch_minibatches: minibatches in an epoch.
        epoch_time_s: predicted epoch time, fill and drain included.
        utilisation: per rank (sorted), steady-state fraction of time in forward/backward.
        bubble_fraction: 1 - busy / (workers * epoch time) over the epoch.
        steady_bubble_fraction: the same in the steady state.
        p2p_bytes_per_sample: activation + gradient bytes sent between stages per sample.
        allreduce_bytes_per_sample: bytes sent by weight-gradient allreduces per sample.
        comm_stall_fraction: steady-state share of worker time blocked in allreduce.
        recv_stall_fraction: steady-state share of worker time blocked waiting for a receive.
        overlap: wait-free backpropagation used for allreduces.
        allreduce: ``hierarchical`` or ``ring``.
        cluster: cluster name.
        steady_state_converged: whether the short runs reached a periodic steady state (else the epoch
            time extrapolates from the longest runs tried).
        peak_memory_bytes: per rank (sorted), the bytes it holds at its peak (:func:`pipedream.memory.rank_memory`),
            for the flush schedules (:data:`FLUSH`); empty for the others (:func:`pipedream.memory.plan_memory`
            counts theirs per stage).
    """

    schedule: str
    config: str
    workers: int
    batch_size: int
    microbatches: int
    samples_per_minibatch: int
    time_per_minibatch_s: float
    time_per_sample_s: float
    dataset_size: int
    epoch_minibatches: int
    epoch_time_s: float
    utilisation: list[float]
    bubble_fraction: float
    steady_bubble_fraction: float
    p2p_bytes_per_sample: float
    allreduce_bytes_per_sample: float
    comm_stall_fraction: float
    recv_stall_fraction: float
    overlap: bool
    allreduce: str
    cluster: str
    steady_state_converged: bool = True
    peak_memory_bytes: list[float] = field(default_factory=list)
    trace: Trace | None = field(default=None, repr=False, compare=False)

    @property
    def bytes_per_sample(self) -> float:
        """All bytes sent per sample (point-to-point plus allreduce)."""
        return self.p2p_bytes_per_sample + self.allreduce_bytes_per_sample

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (without the trace), plus ``bytes_per_sample``."""
        d = asdict(self)
        d.pop("trace")
        d["bytes_per_sample"] = self.bytes_per_sample
        return d


def build_schedule(kind: str, stage_ranks: list[list[int]], minibatches: int, microbatches: int = 1,
                   warmup: str = DEFAULT_WARMUP) -> schedules.Schedule:
    """The :mod:`pipedream.schedules` action lists for ``kind`` (a key or value of :data:`SCHEDULES`), built by
    :func:`pipedream.schedules.build` as the runtime builds them; ``warmup`` picks 1F1B's warm-up counts
    (``consistent``, the runtime's default, or ``release``). torch's schedules (:data:`pipedream.memory.TORCH_FLUSH`)
    come from torch's lists (:func:`pipedream.torch_schedules.from_torch`), on the ranks ``stage_ranks`` gives each
    stage: one rank a stage, the same ``len(stage_ranks) / ranks`` stages on every rank, where torch places them
    (:func:`torch_stage_ranks`).

    Raises:
        PipeDreamError: an unknown schedule, or the checks of the builder.
    """
    name = SCHEDULES.get(kind)
    if name is None:
        raise PipeDreamError(f"unknown schedule {kind!r}; use one of {', '.join(SCHEDULES)}")
    if name not in memory.TORCH_FLUSH:
        return schedules.build(name, stage_ranks, minibatches, microbatches, warmup)
    if any(len(rs) != 1 for rs in stage_ranks):
        raise PipeDreamError(f"schedule {name} runs a straight pipeline (one rank a stage), not stages on {stage_ranks}")
    ranks = sorted({rs[0] for rs in stage_ranks})
    p = len(ranks)
    if len(stage_ranks) % p:
        raise PipeDreamError(f"schedule {name}: {len(stage_ranks)} stages do not divide evenly over {p} ranks")
    v = len(stage_ranks) // p
    where = torch_schedules.positions(name, p, v)
    position_rank: dict[int, int] = {}
    for s, rs in enumerate(stage_ranks):
        if position_rank.setdefault(where[s], rs[0]) != rs[0]:
            raise PipeDreamError(f"schedule {name} runs stage {s} on the rank of stage {where.index(where[s])} "
                                 "(torch's placement); place the stages as pipedream.sim.torch_stage_ranks does")
    return torch_schedules.from_torch(name, p, microbatches, v, minibatches=minibatches,
                                      ranks=[position_rank[q] for q in range(p)])


def torch_stage_ranks(kind: str, ranks: list[int], chunks: int | None = None) -> list[list[int]]:
    """Per stage its rank, for torch's schedule ``kind`` of ``chunks`` stages per rank on ``ranks`` (pipeline
    positions in order): loop placement (stage ``s`` on ``ranks[s % p]``) or V placement (ZBV, DualPipeV).

    Raises:
        PipeDreamError: not one of torch's schedules, or a chunk count it does not take.
    """
    name = torch_schedules.schedule_name(kind)
    p, v = len(ranks), torch_schedules.chunks_of(name, chunks)
    return [[ranks[q]] for q in torch_schedules.positions(name, p, v)]


def run_minibatches(stage_ranks: list[list[int]], costs: list[StageCost], cluster: Cluster, minibatches: int,
                    options: SimOptions | None = None, *, record: bool = False) -> Trace:
    """Event-simulate ``minibatches`` minibatches of ``options.schedule`` on a fresh network
    (``options.contention``: :mod:`pipedream.sim.network`; ``options.sync``: :mod:`pipedream.sim.engine`) and fresh
    cores (``options.host``: :mod:`pipedream.sim.cores`); ``record`` keeps every span."""
    o = options or SimOptions()
    sched = build_schedule(o.schedule, stage_ranks, minibatches, o.microbatches_run, o.warmup)
    return run(sched, costs, Network(cluster, o.allreduce, o.contention), overlap=o.overlap, record=record, sync=o.sync,
               cores=Cores(o.host))


def _unit(kind: str, stage_ranks: list[list[int]], microbatches: int) -> tuple[int, int]:
    """(multiple every run length must be, a first run length covering the warm-up a few times)."""
    depth = len(stage_ranks)
    if SCHEDULES[kind] in MICROBATCHED:
        return 1, max(2, math.ceil((2 * depth + 2) / microbatches))
    unit = math.lcm(*(len(rs) for rs in stage_ranks))
    return unit, unit * max(2, math.ceil((2 * depth + 2) / unit))


def extrapolate(t_a: float, t_b: float, n_a: int, n_b: int, n: float) -> float:
    """Closed form of the steady state: ``T(n) = T(n_b) + (n - n_b) (T(n_b) - T(n_a)) / (n_b - n_a)``."""
    return t_b + (n - n_b) * (t_b - t_a) / (n_b - n_a)


def simulate_stages(graph: LayerGraph, stage_nodes: list[list[str]], stage_ranks: list[list[int]],
                    cluster: Cluster, options: SimOptions | None = None, *,
                    costs: list[StageCost] | None = None) -> SimResult:
    """Simulate one schedule for stages (node lists) placed on ranks, and predict an epoch.

    Args:
        graph: the profile (``graph.minibatch_size`` set).
        stage_nodes: node ids per stage, pipeline order (for ``dp`` pass one stage with all nodes).
        stage_ranks: ranks per stage (replicas), e.g. ``[s.ranks for s in plan.stages]``.
        cluster: the topology.
        options: the schedule, epoch and what prices it (:class:`SimOptions`; None: its defaults).
        costs: precomputed stage costs (else computed from ``graph``).
    Raises:
        PipeDreamError: bad schedule name, counts, plan/profile mismatch, ranks outside the cluster, or a tied
            parameter on stages the runtime refuses for the schedule (:func:`pipedream.tied.replica_conflict`).
    """
    o = options or SimOptions()
    if o.schedule not in SCHEDULES:
        raise PipeDreamError(f"unknown schedule {o.schedule!r}; use 1f1b, gpipe, 2bw, pipedream_flush or dp")
    if len(stage_nodes) != len(stage_ranks):
        raise PipeDreamError(f"{len(stage_nodes)} stage node lists but {len(stage_ranks)} rank lists")
    if o.dataset_size < 1 or o.microbatches < 1:
        raise PipeDreamError(f"dataset size and microbatches must be positive (got {o.dataset_size}, {o.microbatches})")
    batch = o.batch_size or graph.minibatch_size
    kind = SCHEDULES[o.schedule]
    why = tied.plan_conflict(graph.tied, stage_nodes, [len(rs) for rs in stage_ranks], kind)
    if why is not None:  # the runtime refuses it (pipedream.runtime.shared.check): its tied sums would deadlock
        raise PipeDreamError(why)
    m = o.microbatches_run
    if costs is None:
        replicas = [len(rs) for rs in stage_ranks] if kind != "dp" else [sum(len(rs) for rs in stage_ranks)]
        costs = stage_costs(graph, stage_nodes, batch, bucket_bytes=o.bucket_bytes, step=o.step,
                            copies_on_write=memory.copies_on_write(kind, replicas, m, o.warmup))
    if o.recompute:
        costs = recomputed(costs)
    unit, n0 = _unit(kind, stage_ranks, m)
    run_costs = costs

    def sim(n: int, record: bool = False) -> Trace:
        return run_minibatches(stage_ranks, run_costs, cluster, n, o, record=record)

    per_mb = batch * m
    n_epoch = math.ceil(o.dataset_size / per_mb)
    n_exact = unit * math.ceil(n_epoch / unit)  # the epoch in whole rounds of the replicas
    first = sim(n0, record=o.keep_trace)
    short = not o.steady_figures and n_exact <= EXACT_EPOCH_MINIBATCHES
    if short:  # one look for the steady state, in runs of n0, 2 n0 and 3 n0
        t2, t3 = sim(2 * n0), sim(3 * n0)
        n_a, n_b, tr_a, tr_b, converged = 2 * n0, 3 * n0, t2, t3, _settled(first, t2, t3)
    else:
        n_a, n_b, tr_a, tr_b, converged = _steady_state(sim, n0, first)
    if n_epoch <= n_b or (short and not converged):  # simulate the epoch exactly
        tr_e = sim(n_exact)
        epoch_s, busy_epoch = tr_e.makespan_s, sum(tr_e.busy_s.values())
    else:
        epoch_s = extrapolate(tr_a.makespan_s, tr_b.makespan_s, n_a, n_b, n_epoch)
        busy_epoch = extrapolate(sum(tr_a.busy_s.values()), sum(tr_b.busy_s.values()), n_a, n_b, n_epoch)
    ranks = sorted(tr_b.busy_s)
    dt = tr_b.makespan_s - tr_a.makespan_s
    dn = n_b - n_a
    util = [(tr_b.busy_s[r] - tr_a.busy_s[r]) / dt if dt > 0 else 0.0 for r in ranks]
    workers = len(ranks)

    def steady_share(attr: str) -> float:
        a, b = getattr(tr_a, attr), getattr(tr_b, attr)
        return sum(b[r] - a[r] for r in ranks) / (workers * dt) if dt > 0 else 0.0

    replicas = [len(rs) for rs in stage_ranks] if kind != "dp" else [workers]
    return SimResult(
        schedule=kind,
        config=config_string(replicas),
        workers=workers,
        batch_size=int(batch),
        microbatches=m,
        samples_per_minibatch=int(per_mb),
        time_per_minibatch_s=dt / dn,
        time_per_sample_s=dt / (dn * per_mb),
        dataset_size=o.dataset_size,
        epoch_minibatches=n_epoch,
        epoch_time_s=epoch_s,
        utilisation=util,
        bubble_fraction=1 - busy_epoch / (workers * epoch_s) if epoch_s > 0 else 0.0,
        steady_bubble_fraction=1 - sum(util) / workers,
        p2p_bytes_per_sample=(tr_b.p2p_bytes - tr_a.p2p_bytes) / (dn * per_mb),
        allreduce_bytes_per_sample=(tr_b.allreduce_bytes - tr_a.allreduce_bytes) / (dn * per_mb),
        comm_stall_fraction=steady_share("allreduce_wait_s"),
        recv_stall_fraction=steady_share("recv_wait_s"),
        overlap=o.overlap,
        allreduce=o.allreduce,
        cluster=cluster.name,
        steady_state_converged=converged,
        peak_memory_bytes=rank_peak_bytes(graph, stage_nodes, stage_ranks, o) if kind in FLUSH else [],
        trace=first if o.keep_trace else None,
    )


def rank_peak_bytes(graph: LayerGraph, stage_nodes: list[list[str]], stage_ranks: list[list[int]],
                    options: SimOptions) -> list[float]:
    """Per rank (sorted), the bytes it holds at its peak in one minibatch of the flush schedule ``options.schedule``
    (:func:`pipedream.memory.rank_memory` over its action list; the optimizer's state as ``options.step`` names it,
    SGD with momentum by default), activations at ``options.batch_size`` samples a (micro)batch.

    Raises:
        PipeDreamError: a schedule outside :data:`FLUSH`, or those of :func:`pipedream.memory.chunk_bytes`.
    """
    kind = SCHEDULES.get(options.schedule)
    if kind not in FLUSH:
        raise PipeDreamError(f"peak memory per rank walks the action lists of {', '.join(FLUSH)}, not {kind!r}")
    batch = options.batch_size or graph.minibatch_size
    at_batch = graph if batch == graph.minibatch_size else graph.scaled(int(batch))
    chunks = memory.chunk_bytes(at_batch, stage_nodes, optimizer=options.step.optimizer if options.step else "sgd")
    sched = build_schedule(kind, stage_ranks, 1, options.microbatches_run)
    return [memory.rank_memory(sched.order[r], dict(enumerate(chunks))).total for r in sorted(sched.order)]


def _steady_state(sim: Callable[[int], Trace], n0: int, first: Trace) -> tuple[int, int, Trace, Trace, bool]:
    """Find run lengths past the transient: ``T(2n) - T(n) == T(3n) - T(2n)`` (relative :data:`STEADY_RTOL`), doubling ``n``
    from ``n0`` (at most :data:`MAX_DOUBLINGS` times); returns ``(2n, 3n, trace(2n), trace(3n), converged)``."""
    n, t1, t2 = n0, first, sim(2 * n0)
    for _ in range(MAX_DOUBLINGS + 1):
        t3 = sim(3 * n)
        if _settled(t1, t2, t3):
            return 2 * n, 3 * n, t2, t3, True
        n, t1, t2 = 2 * n, t2, sim(4 * n)
    return n, 2 * n, t1, t2, False


def _settled(t1: Trace, t2: Trace, t3: Trace) -> bool:
    """Runs of ``n``, ``2n`` and ``3n`` minibatches are in the steady state: ``T(2n) - T(n)`` and ``T(3n) - T(2n)``
    agree to :data:`STEADY_RTOL` (relative)."""
    s1, s2 = t2.makespan_s - t1.makespan_s, t3.makespan_s - t2.makespan_s
    return abs(s1 - s2) <= STEADY_RTOL * abs(s2)


def simulate_plan(graph: LayerGraph, plan: Plan, cluster: Cluster, options: SimOptions | None = None) -> SimResult:
    """Simulate ``plan`` (its stages, replicas and ranks) on ``cluster`` as ``options`` says (:class:`SimOptions`).

    The stages run exactly on their ``Stage.ranks``, in that round-robin order (the order the runtime
    builds its schedule from); nothing is re-placed here.

    ``schedule="dp"`` ignores the plan's split and runs data parallelism on the plan's ranks.
    Raises:
        PipeDreamError: the plan needs more workers than the cluster has, or the checks of
            :func:`simulate_stages`.
    """
    plan.validate()
    if plan.workers > cluster.workers:
        raise PipeDreamError(f"plan {plan.config!r} uses {plan.workers} workers but cluster {cluster.name!r} "
                             f"has {cluster.workers}")
    o = options or SimOptions()
    if SCHEDULES.get(o.schedule) == "dp":
        return simulate_dp(graph, cluster, o, workers=plan.workers)
    return simulate_stages(graph, [s.nodes for s in plan.stages], [s.ranks for s in plan.stages], cluster, o)


def simulate_dp(graph: LayerGraph, cluster: Cluster, options: SimOptions | None = None, *,
                workers: int | None = None) -> SimResult:
    """Data parallelism of the whole model on ranks ``0 .. workers - 1`` (default: the whole cluster): bucketed
    DDP (gradient buckets of ``options.bucket_bytes``, one allreduce each with its latency, overlapped with the
    backward) and an optimizer step, as :func:`simulate_stages` times them; ``options.schedule`` is ignored."""
    n = workers or cluster.workers
    if not 1 <= n <= cluster.workers:
        raise PipeDreamError(f"data parallelism on {n} workers does not fit cluster {cluster.name!r} ({cluster.workers})")
    o = replace(options or SimOptions(), schedule="dp")
    return simulate_stages(graph, [list(graph.nodes)], [list(range(n))], cluster, o)
