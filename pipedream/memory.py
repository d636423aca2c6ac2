"""The memory one replica of a stage holds, in one place (the planner, the re-ranking, ``explain`` and the
runtime's memory check all call :func:`stage_memory`).

A replica of a stage with ``P`` parameter bytes that holds ``n`` (micro)batches in flight at its peak holds

* weights: ``c * P``, ``c`` the weight copies of its schedule (:func:`weight_copies`): 1 for a flush schedule
  (GPipe, PipeDream-Flush, data parallelism), 2 for PipeDream-2BW (§3.1, "at most 2" versions), and under weight
  stashing one per version an in-flight minibatch still needs, so ``n`` (PipeDream §3.3: NOAM on the input stage);
* gradients: ``P`` (one buffer the backward accumulates into);
* optimizer state: ``k * P``, ``k`` = 1 for SGD with momentum, 0 without, 2 for Adam (its two moments); for Muon
  ``H + 2 (P - H)``, ``H`` the bytes of the stage's hidden matrices (one momentum buffer each) and Adam's two
  moments for the rest (:func:`optimizer_state_bytes`; Adam's 4-byte ``step`` scalars are not counted);
* activations: ``n * A``, ``A`` the activation bytes its forward stashes for one (micro)batch; with
  activation recomputation only ``A'``, the activations of the one (micro)batch being recomputed in its
  backward (``A`` plus its sent output, saved again by the recomputation; :func:`plan_memory`), since the
  forward keeps only the stage's inputs (Chen et al. 2016);
* buffers: ``n * I + I_in``, ``I`` what the runtime keeps per (micro)batch outside autograd: the received input
  (or the data) and, on a stage that sends, its output and the buffer posted for that output's gradient
  (posted with the send, :func:`pipedream.runtime.actions.issue_plan`), all held until the backward; ``I_in``
  the next input, posted one ahead on a stage that receives.

Allocator slack, workspace and the transient copies of an update are not counted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph
from pipedream.schedules import DEFAULT_WARMUP, WARMUPS, Action, Kind, warmup_count

if TYPE_CHECKING:  # numpy only for annotations: stashing_total takes the planner's arrays, this module needs no numpy
    import numpy as np

# state tensors of the weights' size per optimizer, (per hidden matrix, per other parameter): SGD its momentum, Adam
# its two moments, Muon a momentum buffer per hidden matrix and Adam's two moments for the rest
OPTIMIZER_STATES = {"sgd": (1, 1), "adam": (2, 2), "muon": (1, 2)}
# torch.distributed.pipelining's flush schedules with several chunks or a split backward (pipedream.torch_schedules):
# one weight copy; what they hold in flight is counted by walking their action lists (rank_memory)
TORCH_FLUSH = ("interleaved_1f1b", "looped_bfs", "interleaved_zb", "zbv", "dualpipev")
SCHEDULES = ("1f1b", "vertical", "gpipe", "2bw", "pipedream_flush", "dp", *TORCH_FLUSH)


@dataclass(frozen=True)
class StageMemory:
    """Bytes one replica of a stage holds at its peak, by kind (see the module docstring)."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    buffers: float

    @property
    def total(self) -> float:
        """All of it, bytes."""
        return self.weights + self.gradients + self.optimizer + self.activations + self.buffers

    def as_dict(self) -> dict[str, float]:
        """The kinds and ``total``, bytes."""
        return {**asdict(self), "total": self.total}


def optimizer_states(optimizer: str, momentum: float = 0.9, hidden: bool = False) -> int:
    """Optimizer state tensors of a parameter's size: SGD 1 with momentum (0 without), Adam 2, Muon 1 for a hidden
    matrix (``hidden``) and 2 for another parameter (Adam's).

    Raises:
        PipeDreamError: an unknown optimizer.
    """
    if optimizer not in OPTIMIZER_STATES:
        raise PipeDreamError(f"unknown optimizer {optimizer!r}; use one of {sorted(OPTIMIZER_STATES)}")
    return 0 if optimizer == "sgd" and momentum == 0 else OPTIMIZER_STATES[optimizer][0 if hidden else 1]


def optimizer_state_bytes(optimizer: str, param_bytes: float, hidden_bytes: float | None = None,
                          momentum: float = 0.9) -> float:
    """Bytes of optimizer state a stage holds: :func:`optimizer_states` of a hidden matrix times ``hidden_bytes``
    plus that of another parameter times the rest, ``k_h H + k (P - H)`` (Muon ``H + 2 (P - H)``, SGD and Adam
    ``k P``). The one place the memory model, the planners and ``pipedream check`` count it.

    Args:
        optimizer: ``sgd``, ``adam`` or ``muon``.
        param_bytes: the stage's parameters, bytes (``P``).
        hidden_bytes: those of them that are hidden matrices, bytes (``H``, :meth:`LayerGraph.hidden_bytes_of`);
            None when the profile does not say (needed only where the two kinds differ: Muon).
        momentum: SGD's (0: no state).
    Raises:
        PipeDreamError: an unknown optimizer, or Muon without ``hidden_bytes`` (a profile taken before they were
            recorded: profile again).
    """
    per_hidden, per_other = optimizer_states(optimizer, momentum, True), optimizer_states(optimizer, momentum)
    if per_hidden == per_other:
        return per_other * param_bytes
    if hidden_bytes is None:
        raise PipeDreamError(f"--optimizer {optimizer} keeps less state for hidden weight matrices, but the profile "
                             "does not say which bytes are hidden matrices (graph.json has no 'hidden_bytes'; "
                             "profiles taken before they were recorded, and the release's, lack them): re-run "
                             "`pipedream profile` for this model")
    return per_hidden * hidden_bytes + per_other * (param_bytes - hidden_bytes)


def in_flight(schedule: str, replicas: Sequence[int], stage: int, microbatches: int = 1,
              warmup: str = DEFAULT_WARMUP) -> int:
    """(Micro)batches whose activations one replica of ``stage`` holds at its peak.

    1F1B (stashing or vertical sync): its warm-up count (:data:`pipedream.schedules.WARMUPS`, NOAM on the
    input stage, §3.2); GPipe: every microbatch the replica runs (``ceil(m / r)``, all forwards before
    any backward); 2BW: 1F1B over microbatches, ``min(m, warm-up)``; PipeDream-Flush: 1F1B over each
    minibatch's microbatches, ``min(ceil(m / r), warmup_count)`` (``min(m, d - s)`` on stage ``s`` of a straight
    pipeline of depth ``d``, :func:`pipedream.schedules.pipedream_flush`); data parallelism: 1.

    Raises:
        PipeDreamError: an unknown schedule.
    """
    if schedule in ("1f1b", "vertical"):
        return WARMUPS[warmup](replicas, stage)
    if schedule == "gpipe":
        return math.ceil(microbatches / replicas[stage])
    if schedule == "2bw":
        return min(math.ceil(microbatches / replicas[stage]), WARMUPS[warmup](replicas, stage))
    if schedule == "pipedream_flush":
        return min(math.ceil(microbatches / replicas[stage]), warmup_count(replicas, stage))
    if schedule == "dp":
        return 1
    if schedule in TORCH_FLUSH:  # at most every microbatch; the exact count: rank_memory over the action list
        return microbatches
    raise PipeDreamError(f"unknown schedule {schedule!r}; use one of {', '.join(SCHEDULES)}")


def weight_copies(schedule: str, in_flight_count: int) -> int:
    """Copies of a stage's weights its schedule holds (module docstring): GPipe, PipeDream-Flush and DP 1, 2BW
    2, weight stashing and vertical sync one per in-flight minibatch's version (at most ``in_flight_count``).

    Raises:
        PipeDreamError: an unknown schedule.
    """
    if schedule in ("gpipe", "pipedream_flush", "dp", *TORCH_FLUSH):
        return 1
    if schedule == "2bw":
        return 2
    if schedule in ("1f1b", "vertical"):
        return max(1, in_flight_count)
    raise PipeDreamError(f"unknown schedule {schedule!r}; use one of {', '.join(SCHEDULES)}")


def copies_on_write(schedule: str, replicas: Sequence[int], microbatches: int = 1,
                    warmup: str = DEFAULT_WARMUP) -> list[bool]:
    """Per stage, whether its optimizer step first copies the weights it changes: where its schedule holds more
    than one copy of them (:func:`weight_copies` > 1), an in-flight (micro)batch still needs the version the step
    replaces (:meth:`pipedream.runtime.versions.WeightVersions.stepping`).

    Raises:
        PipeDreamError: an unknown schedule.
    """
    return [weight_copies(schedule, in_flight(schedule, replicas, s, microbatches, warmup)) > 1
            for s in range(len(replicas))]


def stage_memory(param_bytes: float, activation_bytes: float, input_bytes: float, *, schedule: str,
                 in_flight_count: int, optimizer: str = "sgd", momentum: float = 0.9,
                 recompute: bool = False, posted_bytes: float = 0.0, hidden_bytes: float | None = None) -> StageMemory:
    """Bytes one replica of a stage holds at its peak.

    Args:
        param_bytes: the stage's parameters, bytes (``P``).
        activation_bytes: what its forward stashes for one (micro)batch, bytes (``A``); with ``recompute``
            what the recomputation of one saves (``A'``).
        input_bytes: what the runtime keeps per (micro)batch outside autograd, bytes (``I``: the received
            input or the data, the output it sent and its gradient's buffer; see :func:`plan_memory`).
        schedule: one of :data:`SCHEDULES`.
        in_flight_count: (micro)batches held at the peak (:func:`in_flight`).
        optimizer, momentum: the optimizer (:func:`optimizer_states`).
        recompute: activation recomputation: the activations of one (micro)batch, not of ``in_flight_count``.
        posted_bytes: receive buffers posted ahead of any (micro)batch in flight, bytes (``I_in``).
        hidden_bytes: the stage's hidden matrices, bytes (``H``, :func:`optimizer_state_bytes`; Muon needs it).
    Raises:
        PipeDreamError: an unknown schedule or optimizer, or Muon without ``hidden_bytes``.
    """
    return StageMemory(weights=weight_copies(schedule, in_flight_count) * param_bytes, gradients=param_bytes,
                       optimizer=optimizer_state_bytes(optimizer, param_bytes, hidden_bytes, momentum),
                       activations=(1 if recompute else in_flight_count) * activation_bytes,
                       buffers=in_flight_count * input_bytes + posted_bytes)


def plan_memory(graph: LayerGraph, stages: Sequence[Sequence[str]], replicas: Sequence[int], *,
                schedule: str = "1f1b", microbatches: int = 1, warmup: str = DEFAULT_WARMUP, optimizer: str = "sgd",
                momentum: float = 0.9, recompute: bool = False) -> list[StageMemory]:
    """:func:`stage_memory` of one replica of each stage of a plan, from a profile.

    ``A``, ``A'`` and ``I`` per (micro)batch as :func:`_activation_and_buffer_bytes` defines them: ``graph`` must
    be at the (micro)batch size the stage runs. ``stages`` are node ids per stage, ``replicas`` per stage;
    ``recompute``: activation recomputation (:func:`stage_memory`). ``P`` counts a tensor that several of a
    stage's layers use once (:meth:`pipedream.graph.LayerGraph.param_bytes_of`); every stage holding one of its
    users keeps a copy, so each of them counts it. ``H`` (Muon's hidden matrices) from the profile's
    :meth:`pipedream.graph.LayerGraph.hidden_bytes_of`.

    Raises:
        PipeDreamError: an unknown schedule or optimizer, or Muon on a profile without hidden-matrix bytes.
    """
    where = {n: s for s, nodes in enumerate(stages) for n in nodes}
    consumers: dict[str, list[str]] = {}
    for a, b in graph.edges:
        consumers.setdefault(a, []).append(b)
    out = []
    for s, nodes in enumerate(stages):
        params = graph.param_bytes_of(nodes)  # a tied tensor once per stage; each holding stage keeps a copy
        acts, recomputed, inputs, posted = _activation_and_buffer_bytes(graph, s, nodes, where, consumers,
                                                                        last=s == len(stages) - 1)
        n = in_flight(schedule, replicas, s, microbatches, warmup)
        out.append(stage_memory(params, recomputed if recompute else acts, inputs, schedule=schedule,
                                in_flight_count=n, optimizer=optimizer, momentum=momentum, recompute=recompute,
                                posted_bytes=posted, hidden_bytes=graph.hidden_bytes_of(nodes)))
    return out


def _activation_and_buffer_bytes(graph: LayerGraph, s: int, nodes: Sequence[str], where: dict[str, int],
                                 consumers: dict[str, list[str]], last: bool) -> tuple[float, float, float, float]:
    """``(A, A', I, I_in)`` of stage ``s`` per (micro)batch, bytes.

    ``I``: what the runtime keeps per in-flight (micro)batch outside autograd: the received input (or the
    data: the model's input nodes in the stage, or outside every stage and feeding it, as a plan leaves them)
    and, on a stage that sends, its output (kept for the backward) and the buffer posted for its gradient.
    ``I_in``: the received input once more (the next one, posted ahead); 0 on a stage that receives nothing.
    ``A``: with our profiler's record of what each layer saves (``graph.saved``), those bytes plus the
    output of every layer of the stage that it or a consumer in the stage saves (sent outputs are in ``I``;
    the model's final output is saved by the loss); without it (the release's profiles), every layer's output.
    ``A'``: what a recomputation of the stage's forward saves (``torch.utils.checkpoint``): ``A`` plus the sent
    outputs a layer of the stage saves (the recomputation makes them again; the originals stay in ``I``).
    """
    inside = set(nodes)
    received = {a for a, b in graph.edges if where.get(b) == s and where.get(a, s) != s}
    data = {n for n in nodes if graph.nodes[n].is_input} | {
        a for a, b in graph.edges if where.get(b) == s and a not in where and graph.nodes[a].is_input}
    posted = sum(graph.nodes[a].output_bytes for a in received)
    kept = posted + sum(graph.nodes[a].output_bytes for a in data)
    layers = [n for n in nodes if not graph.nodes[n].is_input]
    sent = set() if last else {n for n in nodes if any(where.get(c, s) != s for c in consumers.get(n, []))}
    sent_bytes = sum(graph.nodes[n].output_bytes for n in sent)
    if not all(n in graph.saved for n in layers):  # sent outputs are among every layer's; their gradients are not
        every = sum(graph.nodes[n].output_bytes for n in layers)
        return every, every, kept + sent_bytes, posted
    acts = resaved = 0.0
    for n in layers:
        own, _, saves_output = graph.saved[n]
        inside_consumers = [c for c in consumers.get(n, []) if c in inside]
        held = saves_output or not consumers.get(n) or any(graph.saved[c][1] for c in inside_consumers)
        acts += own + (graph.nodes[n].output_bytes if held and n not in sent else 0.0)
        resaved += graph.nodes[n].output_bytes if held and n in sent else 0.0
    return acts, acts + resaved, kept + 2 * sent_bytes, posted


@dataclass(frozen=True)
class ChunkBytes:
    """What one stage (a chunk) holds on its rank under a flush schedule, bytes: ``fixed``, its weights (one copy),
    gradients, optimizer state and posted receive buffers (a :class:`StageMemory` without activations), and per
    (micro)batch in flight its activations ``A``, buffers ``I`` and, between its ``I`` and ``W``, the stash ``S``."""

    fixed: StageMemory
    activation_bytes: float
    buffer_bytes: float
    stash_bytes: float


def chunk_bytes(graph: LayerGraph, stages: Sequence[Sequence[str]], *, optimizer: str = "sgd",
                momentum: float = 0.9) -> list[ChunkBytes]:
    """:class:`ChunkBytes` of each stage of a pipeline (node ids per stage), ``graph`` at the (micro)batch size.

    ``A``, ``I`` and the posted buffers as :func:`plan_memory` counts them. ``S``, what a split backward keeps from
    its ``I`` to its ``W`` (the inputs of every layer with weights and the gradients of their outputs, which the
    weight gradient multiplies; the rest of ``A`` is freed by ``I``, as torch's ``stage_backward_input`` frees it):
    per layer with parameters its input bytes plus its output bytes.

    Raises:
        PipeDreamError: an unknown optimizer, or Muon on a profile without hidden-matrix bytes.
    """
    where = {n: s for s, nodes in enumerate(stages) for n in nodes}
    consumers: dict[str, list[str]] = {}
    producers: dict[str, list[str]] = {}
    for a, b in graph.edges:
        consumers.setdefault(a, []).append(b)
        producers.setdefault(b, []).append(a)
    out = []
    for s, nodes in enumerate(stages):
        acts, _, inputs, posted = _activation_and_buffer_bytes(graph, s, nodes, where, consumers, last=s == len(stages) - 1)
        fixed = stage_memory(graph.param_bytes_of(nodes), 0.0, 0.0, schedule="gpipe", in_flight_count=0,
                             optimizer=optimizer, momentum=momentum, posted_bytes=posted,
                             hidden_bytes=graph.hidden_bytes_of(nodes))
        stash = sum(graph.nodes[n].output_bytes + sum(graph.nodes[p].output_bytes for p in producers.get(n, []))
                    for n in nodes if graph.nodes[n].param_bytes > 0)
        out.append(ChunkBytes(fixed, acts, inputs, stash))
    return out


def rank_memory(actions: Sequence[Action], chunks: Mapping[int, ChunkBytes]) -> StageMemory:
    """Bytes one rank holds at its peak while it runs ``actions`` (its list of a flush schedule, one weight copy) for
    the stages ``chunks`` describes (stage index -> :class:`ChunkBytes`): the ``fixed`` bytes of every stage it runs,
    plus the most that its (micro)batches in flight hold at once, walking the list: ``F`` adds ``A + I``; ``B``
    frees them; ``I`` frees them and keeps ``S`` until the ``W`` of the same (micro)batch frees it.

    Raises:
        KeyError: an action of a stage ``chunks`` lacks.
    """
    mine = sorted({a.stage for a in actions if a.kind in (Kind.F, Kind.B, Kind.I, Kind.W)})
    acts = bufs = peak_acts = peak_bufs = 0.0
    for a in actions:
        c = chunks[a.stage] if a.kind in (Kind.F, Kind.B, Kind.I, Kind.W) else None
        if c is None:
            continue
        if a.kind == Kind.F:
            acts, bufs = acts + c.activation_bytes, bufs + c.buffer_bytes
        elif a.kind == Kind.B:
            acts, bufs = acts - c.activation_bytes, bufs - c.buffer_bytes
        elif a.kind == Kind.I:
            acts, bufs = acts - c.activation_bytes + c.stash_bytes, bufs - c.buffer_bytes
        else:
            acts -= c.stash_bytes
        if acts + bufs > peak_acts + peak_bufs:
            peak_acts, peak_bufs = acts, bufs
    fixed = [chunks[s].fixed for s in mine]
    return StageMemory(weights=sum(f.weights for f in fixed), gradients=sum(f.gradients for f in fixed),
                       optimizer=sum(f.optimizer for f in fixed), activations=peak_acts,
                       buffers=peak_bufs + sum(f.buffers for f in fixed))


def stashing_total(param_bytes: float | np.ndarray, activation_bytes: float | np.ndarray, input_bytes: float | np.ndarray,
                   in_flight_count: float | np.ndarray, states: int = 1) -> float | np.ndarray:
    """:func:`stage_memory`'s total under weight stashing, ``n (P + A + I) + (1 + k) P``, for floats or numpy
    arrays that broadcast (the planner's dynamic program checks whole rows at once). Bytes.

    Args:
        param_bytes, activation_bytes, input_bytes: ``P``, ``A``, ``I`` as in :func:`stage_memory`.
        in_flight_count: ``n`` (at least 1).
        states: ``k``, the optimizer's state tensors (:func:`optimizer_states`).
    """
    return in_flight_count * (param_bytes + activation_bytes + input_bytes) + (1 + states) * param_bytes


def format_bytes(n: float) -> str:
    """``n`` bytes as ``'1.23 GB'``, ``'4.5 MB'`` or ``'678 B'`` (decimal units)."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"
