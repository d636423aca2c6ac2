"""PipeDream-2BW's planner: equal parallel pipelines of width ``w`` and depth ``d`` over a model of repeated
blocks (PipeDream-2BW, ICML 2021, §4 "Planner"; facts taken from a transcription of its text).

For every ``(w, d)`` with ``w d = n``, microbatch ``b`` and recomputation off or on, the paper's throughput model
(every time from the one cost model) ranks the configurations whose stages fit the device (:func:`search`,
:func:`best`); the best configuration of each of the three best shapes is then simulated and the fastest is the
plan (:func:`choose`); :func:`pipeline_ranks` places the replicas. The search, the throughput and memory terms and
the placement rule: docs/pipedream-2bw.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from pipedream import costmodel, memory
from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph
from pipedream.placement import server_size
from pipedream.plan import Plan, Stage
from pipedream.sim import SCHEDULES as SIMULATED
from pipedream.sim import SimOptions, SimResult, simulate_dp, simulate_stages
from pipedream.sim.costs import StageCost, recomputed, stage_costs
from pipedream.sim.network import Network
from pipedream.topology import Cluster

# Schedules the planner can cost: 2BW, and for comparison GPipe and PipeDream-Flush (1F1B with a flush every
# batch; present once pipedream.memory knows it, :func:`available_schedules`).
SCHEDULES = ("2bw", "gpipe", "pipedream_flush")
FLUSHING = ("gpipe", "pipedream_flush")  # a bubble of d - 1 microbatches per batch
DEFAULT_MAX_MICROBATCH = 64


def available_schedules() -> list[str]:
    """:data:`SCHEDULES` that this checkout's memory model and simulator both know."""
    return [s for s in SCHEDULES if s in memory.SCHEDULES and s in SIMULATED]


@dataclass
class Candidate:
    """One configuration the planner costed.

    Attributes:
        width, depth: parallel pipelines ``w`` and stages per pipeline ``d``.
        microbatch: samples per microbatch ``b``.
        recompute: activation recomputation on.
        microbatches: microbatches per pipeline per update ``m = B / (b w)``.
        stage_time_s: per stage, seconds per microbatch: compute (recomputation included) and transfers sent.
        compute_s, comm_s: the two parts of ``stage_time_s``, per stage.
        update_s: per stage, seconds per update: its replicas' allreduce and its optimizer step.
        time_per_batch_s: ``T`` (module docstring), s.
        samples_per_s: ``B / T``.
        memory_bytes: per stage, bytes one replica holds at its peak.
        fits: every stage fits the device memory.
    """

    width: int
    depth: int
    microbatch: int
    recompute: bool
    microbatches: int
    stage_time_s: list[float]
    compute_s: list[float]
    comm_s: list[float]
    update_s: list[float]
    time_per_batch_s: float
    samples_per_s: float
    memory_bytes: list[float]
    fits: bool

    @property
    def key(self) -> tuple[int, int, int, bool]:
        """``(w, d, b, recompute)``."""
        return (self.width, self.depth, self.microbatch, self.recompute)

    def rank_key(self) -> tuple[float, int, int, bool]:
        """Sort key, best first: highest throughput, then the shallower pipeline, the smaller microbatch, no
        recomputation."""
        return (-self.samples_per_s, self.depth, self.microbatch, self.recompute)

    def summary(self) -> dict[str, Any]:
        """The configuration and its numbers (no per-stage lists), JSON-ready."""
        d = asdict(self)
        for k in ("stage_time_s", "compute_s", "comm_s", "update_s", "memory_bytes"):
            d.pop(k)
        d["memory_bytes_max_stage"] = max(self.memory_bytes)
        return d


@dataclass(frozen=True)
class Blocks:
    """A chain profile seen as ``prefix + blocks + suffix``: its node ids in order (the input first) and the
    blocks' span."""

    layers: list[str]
    start: int  # first block's index in ``layers``
    stop: int  # one past the last block

    @property
    def count(self) -> int:
        return self.stop - self.start


def find_blocks(graph: LayerGraph) -> Blocks:
    """The longest run of consecutive identical layers (same module description and parameter bytes) of a
    chain profile: the repeated blocks (a transformer's).

    Raises:
        PipeDreamError: the profile is not a chain, or has no two identical consecutive layers.
    """
    if not graph.is_chain():
        raise PipeDreamError("the 2BW planner needs a chain of layers (a model of repeated blocks); this profile "
                             "branches: profile it at layer granularity, or use --planner pipedream")
    layers = graph.topological_order()  # the input node first: it goes with the first stage
    best = (0, 0)
    start = 0
    for i in range(1, len(layers) + 1):
        same = i < len(layers) and _same_layer(graph, layers[i], layers[start])
        if not same:
            if i - start > best[1] - best[0]:
                best = (start, i)
            start = i
    if best[1] - best[0] < 2:
        raise PipeDreamError("the 2BW planner needs a model of repeated blocks (two or more identical consecutive "
                             "layers, e.g. transformer blocks); this profile has none: use --planner pipedream")
    return Blocks(layers, *best)


def _same_layer(graph: LayerGraph, a: str, b: str) -> bool:
    na, nb = graph.nodes[a], graph.nodes[b]
    return na.desc == nb.desc and na.param_bytes == nb.param_bytes and not na.is_input


def stage_nodes(blocks: Blocks, depth: int) -> list[list[str]]:
    """Node ids of each of ``depth`` stages: the blocks split as evenly as possible (the first
    ``count % depth`` stages one more), the layers before them with the first stage, after them with the last.

    Raises:
        PipeDreamError: more stages than blocks.
    """
    if not 1 <= depth <= blocks.count:
        raise PipeDreamError(f"depth {depth} needs between 1 and {blocks.count} stages (one block at least each)")
    per, extra = divmod(blocks.count, depth)
    out, at = [], blocks.start
    for s in range(depth):
        end = at + per + (1 if s < extra else 0)
        out.append(blocks.layers[at:end])
        at = end
    out[0] = blocks.layers[:blocks.start] + out[0]
    out[-1] = out[-1] + blocks.layers[blocks.stop:]
    return out


def pipeline_ranks(width: int, depth: int, cluster: Cluster) -> list[list[int]]:
    """Ranks of each stage's ``width`` replicas in round-robin order (replica ``k`` of every stage forms
    pipeline ``k``): a stage's replicas on one server when ``width`` fits a server (stage ``s`` on ranks
    ``s w .. s w + w - 1``), else each pipeline on consecutive ranks (stage ``s`` on ``k d + s``)."""
    if width <= server_size(cluster):
        return [[s * width + k for k in range(width)] for s in range(depth)]
    return [[k * depth + s for k in range(width)] for s in range(depth)]


@dataclass
class Settings:
    """What the search holds fixed.

    Attributes:
        batch_size: samples per update ``B`` over all pipelines.
        schedule: one of :data:`SCHEDULES` (default ``2bw``).
        step: the optimizer and how its step is priced (:class:`pipedream.costmodel.StepRates`; default Adam,
            memory bound on a V100, :data:`pipedream.costmodel.V100_MEMORY_BPS`; the profile's measured rates:
            :func:`pipedream.sim.profiled.step_rates`). Its optimizer also sets the optimizer state held
            (:func:`pipedream.memory.optimizer_state_bytes`).
        max_microbatch: largest ``b`` tried (powers of two from 1).
        depths, microbatch_sizes, recompute: restrict the search to these values (None: all).
    """

    batch_size: int
    schedule: str = "2bw"
    step: costmodel.StepRates = costmodel.StepRates("adam")
    max_microbatch: int = DEFAULT_MAX_MICROBATCH
    depths: Sequence[int] | None = None
    microbatch_sizes: Sequence[int] | None = None
    recompute: Sequence[bool] | None = None

    @property
    def optimizer(self) -> str:
        """The optimizer of :attr:`step`."""
        return self.step.optimizer


@dataclass(frozen=True)
class Config:
    """One configuration of the search.

    Attributes:
        width: parallel pipelines ``w`` (replicas of each stage).
        depth: stages per pipeline ``d``.
        microbatch: samples per microbatch ``b``.
        recompute: activation recomputation on.
    """

    width: int
    depth: int
    microbatch: int
    recompute: bool


def evaluate(graph: LayerGraph, cluster: Cluster, blocks: Blocks, config: Config, settings: Settings,
             network: Network | None = None) -> Candidate:
    """Cost one configuration (module docstring); ``graph.minibatch_size`` is the profiled minibatch.

    Raises:
        PipeDreamError: ``B`` is not a multiple of ``b w d``, or a schedule or optimizer this checkout lacks.
    """
    width, depth, microbatch, recompute = config.width, config.depth, config.microbatch, config.recompute
    workers = width * depth
    if settings.batch_size % (microbatch * workers):
        raise PipeDreamError(f"batch {settings.batch_size} is not a multiple of microbatch {microbatch} x {workers} "
                             "workers (B = b w d g)")
    m = settings.batch_size // (microbatch * width)
    nodes = stage_nodes(blocks, depth)
    ranks = pipeline_ranks(width, depth, cluster)
    costs = _costs(graph, nodes, microbatch, recompute, settings)
    net = network or Network(cluster, "ring")
    comm = []
    for s, c in enumerate(costs):
        fwd = net.transfer_time(ranks[s][0], ranks[s + 1][0], c.send_fwd_bytes) if s + 1 < depth else 0.0
        bwd = net.transfer_time(ranks[s][0], ranks[s - 1][0], c.send_bwd_bytes) if s > 0 else 0.0
        comm.append(fwd + bwd)
    compute = [c.fwd_s + c.bwd_s for c in costs]
    t = [a + b for a, b in zip(compute, comm, strict=True)]
    update = [net.allreduce_time(ranks[s], c.param_bytes) + c.step_s for s, c in enumerate(costs)]
    bubble = depth - 1 if settings.schedule in FLUSHING else 0
    period = max(m * ts + us for ts, us in zip(t, update, strict=True)) + bubble * max(t)
    mem = stage_memory(graph, nodes, width, microbatch, m, recompute, settings)
    return Candidate(width, depth, microbatch, recompute, m, t, compute, comm, update, period,
                     settings.batch_size / period, mem, max(mem) <= cluster.device_memory_bytes)


def _costs(graph: LayerGraph, nodes: list[list[str]], microbatch: int, recompute: bool,
           settings: Settings) -> list[StageCost]:
    costs = stage_costs(graph, nodes, microbatch, step=settings.step)
    return recomputed(costs) if recompute else costs


def stage_memory(graph: LayerGraph, nodes: list[list[str]], width: int, microbatch: int, microbatches: int,
                 recompute: bool, settings: Settings) -> list[float]:
    """Bytes one replica of each stage holds at its peak (:func:`pipedream.memory.plan_memory` at ``b`` samples
    per microbatch; with recomputation one microbatch's activations instead of one per microbatch in flight).

    Raises:
        PipeDreamError: a schedule or optimizer :mod:`pipedream.memory` does not know.
    """
    if settings.schedule not in memory.SCHEDULES:
        raise PipeDreamError(f"schedule {settings.schedule!r} is not in this checkout's memory model "
                             f"(pipedream.memory knows {', '.join(memory.SCHEDULES)})")
    replicas = [width] * len(nodes)
    per_mb = graph.scaled(microbatch)
    held = memory.plan_memory(per_mb, nodes, replicas, schedule=settings.schedule,
                              microbatches=width * microbatches, optimizer=settings.optimizer)
    if recompute:
        counts = [memory.in_flight(settings.schedule, replicas, s, width * microbatches) for s in range(len(nodes))]
        held = [replace(h, activations=h.activations / n) for h, n in zip(held, counts, strict=True)]
    return [h.total for h in held]


def search(graph: LayerGraph, cluster: Cluster, settings: Settings) -> list[Candidate]:
    """Every configuration of the search space (module docstring), costed, best first (fitting ones before the
    others, then :meth:`Candidate.rank_key`).

    Raises:
        PipeDreamError: no configuration: the batch allows no ``b`` (not a multiple of the workers), or the
            restrictions leave nothing.
    """
    blocks = find_blocks(graph)
    n = cluster.workers
    depths = [d for d in range(1, n + 1) if n % d == 0 and d <= blocks.count]
    if settings.depths is not None:
        depths = [d for d in depths if d in settings.depths]
    sizes = [2**k for k in range(int(math.log2(max(settings.max_microbatch, 1))) + 1)]
    if settings.microbatch_sizes is not None:
        sizes = sorted(settings.microbatch_sizes)
    tried, sizes = sizes, [b for b in sizes if settings.batch_size % (b * n) == 0]
    options = [False, True] if settings.recompute is None else list(settings.recompute)
    net = Network(cluster, "ring")
    out = [evaluate(graph, cluster, blocks, Config(n // d, d, b, r), settings, net) for d in depths for b in sizes
           for r in options]
    if not out:
        raise PipeDreamError(f"no configuration to try: batch {settings.batch_size} must be a multiple of b x {n} "
                             f"workers for a microbatch b among {tried}, and a depth must divide {n} workers with at "
                             f"most {blocks.count} blocks (allowed: {depths or 'none'})")
    return sorted(out, key=lambda c: (not c.fits, c.rank_key()))


def best(candidates: Sequence[Candidate], cluster: Cluster) -> Candidate:
    """The first fitting candidate of :func:`search`'s list.

    Raises:
        PipeDreamError: none fits the device memory (names the least memory any needed).
    """
    for c in candidates:
        if c.fits:
            return c
    least = min(candidates, key=lambda c: max(c.memory_bytes))
    raise PipeDreamError(f"no configuration fits {memory.format_bytes(cluster.device_memory_bytes)} per device: the "
                         f"smallest need is {memory.format_bytes(max(least.memory_bytes))} (w={least.width}, "
                         f"d={least.depth}, b={least.microbatch}, recompute {'on' if least.recompute else 'off'}); "
                         "use a larger cluster or a smaller model")


def choose(graph: LayerGraph, cluster: Cluster, settings: Settings, rerank: int = 3,
           dataset_batches: int = 20) -> tuple[Candidate, SimResult | None, list[Candidate]]:
    """The configuration to run: the cost model's best fitting configuration of each of its ``rerank`` best shapes
    ``(w, d)`` simulated by the event simulator (:func:`simulate_candidate`) and the fastest simulated kept (the
    first of equals: the cost model's order); with ``rerank`` 0 the cost model's best (:func:`best`), unsimulated.
    Re-ranking is what ``pipedream plan``'s default mode does too: the cost model has no contention (the allreduces
    of the stages that share a server's network port, when ``w`` exceeds a server, queue there), the simulator does.

    Returns:
        ``(chosen, its SimResult or None, every candidate of the search)``.
    Raises:
        PipeDreamError: as :func:`search` and :func:`best`.
    """
    cands = search(graph, cluster, settings)
    first = best(cands, cluster)
    if rerank < 1:
        return first, None, cands
    shapes: dict[tuple[int, int], Candidate] = {}
    for c in cands:
        if c.fits and len(shapes) < rerank:
            shapes.setdefault((c.width, c.depth), c)
    timed = [(c, simulate_candidate(graph, cluster, c, settings, dataset_batches)) for c in shapes.values()]
    chosen, res = max(timed, key=lambda cr: -cr[1].time_per_sample_s)
    return chosen, res, cands


def plan_2bw(graph: LayerGraph, cluster: Cluster, settings: Settings, *, model: str, rerank: int = 3,
             dataset_batches: int = 20) -> Plan:
    """The chosen configuration (:func:`choose`) as a :class:`~pipedream.plan.Plan` (stages of contiguous blocks,
    ``replicas = w``, ranks by :func:`pipeline_ranks`).

    ``plan.extra`` holds ``schedule``, ``microbatches`` (per minibatch of the runtime: ``w m``, what
    ``pipedream train --microbatches`` takes), ``batch_size``, the chosen ``width``/``depth``/``microbatch``/
    ``recompute``, ``predicted_samples_per_s`` (the cost model), ``simulated_samples_per_s`` (the simulator, over
    ``dataset_batches`` batches; with ``rerank`` >= 1), ``cost_model_choice`` and the ten best ``candidates``.

    Raises:
        PipeDreamError: as :func:`search` and :func:`best`.
    """
    c, res, cands = choose(graph, cluster, settings, rerank, dataset_batches)
    nodes = stage_nodes(find_blocks(graph), c.depth)
    ranks = pipeline_ranks(c.width, c.depth, cluster)
    stages = [Stage(nodes=nodes[s], replicas=c.width, ranks=ranks[s], compute_s=c.compute_s[s], comm_s=c.comm_s[s],
                    memory_bytes=c.memory_bytes[s]) for s in range(c.depth)]
    extra: dict[str, Any] = {
        "planner": "2bw", "schedule": settings.schedule, "batch_size": settings.batch_size,
        "microbatches": c.width * c.microbatches, "microbatches_per_pipeline": c.microbatches,
        "width": c.width, "depth": c.depth, "microbatch": c.microbatch, "recompute": c.recompute,
        "optimizer": settings.optimizer, "predicted_samples_per_s": c.samples_per_s,
        "memory_bytes_max_stage": max(c.memory_bytes), "device_memory_bytes": cluster.device_memory_bytes,
        "reranked": rerank, "cost_model_choice": best(cands, cluster).summary(),
        "candidates": [x.summary() for x in cands[:10]],
    }
    sim_time = dp_time = math.nan
    if res is not None:
        sim_time = res.time_per_sample_s
        extra["simulated_samples_per_s"] = 1 / sim_time
        extra["simulated_bubble_fraction"] = res.steady_bubble_fraction
        dp_time = simulate_dp_time(graph, cluster, settings, dataset_batches)
    return Plan(model=model, cluster=cluster.name, workers=c.width * c.depth, stages=stages,
                minibatch_size=c.microbatch, time_per_sample_s=c.time_per_batch_s / settings.batch_size,
                dp_time_per_sample_s=dp_time, extra={**extra, "simulated_time_per_sample_s": sim_time})


def simulate_candidate(graph: LayerGraph, cluster: Cluster, c: Candidate, settings: Settings,
                       dataset_batches: int = 20) -> SimResult:
    """The event simulator's :class:`~pipedream.sim.SimResult` of a candidate: its stages on its ranks, schedule
    ``settings.schedule`` with ``w m`` microbatches of ``b`` per minibatch, recomputation in its stage costs.

    Raises:
        PipeDreamError: a schedule this checkout's simulator does not know.
    """
    if settings.schedule not in SIMULATED:
        raise PipeDreamError(f"schedule {settings.schedule!r} is not in this checkout's simulator")
    nodes = stage_nodes(find_blocks(graph), c.depth)
    ranks = pipeline_ranks(c.width, c.depth, cluster)
    costs = _costs(graph, nodes, c.microbatch, c.recompute, settings)
    options = SimOptions(schedule=settings.schedule, batch_size=c.microbatch, microbatches=c.width * c.microbatches,
                         dataset_size=dataset_batches * settings.batch_size)
    return simulate_stages(graph, nodes, ranks, cluster, options, costs=costs)


def simulate_dp_time(graph: LayerGraph, cluster: Cluster, settings: Settings, dataset_batches: int = 20) -> float:
    """Simulated seconds per sample of data parallelism on all workers at ``B / n`` samples each (memory not
    checked: at paper scale DP does not fit, the number is for comparison)."""
    per_worker = max(1, settings.batch_size // cluster.workers)
    options = SimOptions(batch_size=per_worker, dataset_size=dataset_batches * settings.batch_size, step=settings.step)
    res = simulate_dp(graph, cluster, options)
    return res.time_per_sample_s


def format_2bw(plan: Plan) -> str:
    """What ``pipedream plan --planner 2bw`` prints: the configuration, the stage table, both throughputs."""
    ex = plan.extra
    train = f"--schedule {ex['schedule']} --batch-size {ex['batch_size']} --microbatches {ex['microbatches']}"
    if ex["recompute"]:
        train += " --recompute"
    lines = [
        f"model {plan.model} on cluster {plan.cluster} ({plan.workers} workers), PipeDream-2BW planner, "
        f"schedule {ex['schedule']}, batch {ex['batch_size']}",
        f"width {ex['width']} x depth {ex['depth']}, microbatch {ex['microbatch']}, recomputation "
        f"{'on' if ex['recompute'] else 'off'}, {ex['microbatches_per_pipeline']} microbatches per pipeline per update "
        f"(train with {train})",
        "",
        f"{'stage':>5}  {'layers':<26} {'replicas':>8}  {'compute ms':>10} {'comm ms':>9} {'memory GB':>9}",
    ]
    for i, s in enumerate(plan.stages):
        layers = " ".join(s.nodes) if len(s.nodes) <= 3 else f"{s.nodes[0]} .. {s.nodes[-1]} ({len(s.nodes)})"
        lines.append(f"{i:>5}  {layers:<26} {s.replicas:>8}  {s.compute_s * 1e3:>10.3f} {s.comm_s * 1e3:>9.3f} "
                     f"{s.memory_bytes / 1e9:>9.3f}")
    lines += ["", f"device memory {ex['device_memory_bytes'] / 1e9:.3g} GB, largest stage "
              f"{ex['memory_bytes_max_stage'] / 1e9:.3g} GB",
              f"throughput, cost model      {ex['predicted_samples_per_s']:12.2f} samples/s"]
    if "simulated_samples_per_s" in ex:
        lines.append(f"throughput, simulator      {ex['simulated_samples_per_s']:12.2f} samples/s "
                     f"(steady bubble {ex['simulated_bubble_fraction']:.1%})")
        lines.append(f"data parallelism, simulated {1 / plan.dp_time_per_sample_s:12.2f} samples/s (memory not checked)")
    first = ex["cost_model_choice"]
    if (first["width"], first["depth"], first["microbatch"], first["recompute"]) != (
            ex["width"], ex["depth"], ex["microbatch"], ex["recompute"]):
        lines.append(f"(the cost model's best, w={first['width']} d={first['depth']} b={first['microbatch']}"
                     f"{' recompute' if first['recompute'] else ''}, simulates slower: re-ranked among its "
                     f"{ex['reranked']} best shapes)")
    lines += ["", "best configurations (cost model):",
              f"  {'w':>3} {'d':>3} {'b':>4} {'recompute':>9} {'samples/s':>11} {'max stage GB':>12} fits"]
    for c in ex["candidates"]:
        lines.append(f"  {c['width']:>3} {c['depth']:>3} {c['microbatch']:>4} {str(c['recompute']):>9} "
                     f"{c['samples_per_s']:>11.2f} {c['memory_bytes_max_stage'] / 1e9:>12.3f} {c['fits']}")
    return "\n".join(lines)


