"""The memory one replica of a stage holds, in one place (the planner, the re-ranking, ``explain`` and the
runtime's memory check all call :func:`stage_memory`).

A replica of a stage with ``P`` parameter bytes that holds ``n`` (micro)batches in flight at its peak holds

* weights: ``c * P``, ``c`` the weight copies of its schedule (:func:`weight_copies`): 1 for a flush
  schedule (GPipe, data parallelism), 2 for PipeDream-2BW (PipeDream-2BW §3.1, "at most 2" versions),
  and one per version an in-flight minibatch still needs under weight stashing, the newest being the
  live weights, so ``n`` (PipeDream §3.3: the input stage stashes NOAM versions);
* gradients: ``P`` (one buffer the backward accumulates into);
* optimizer state: ``k * P``, ``k`` = 1 for SGD with momentum, 0 without, 2 for Adam (its two moments);
* activations: ``n * A``, ``A`` the activation bytes its forward stashes for one (micro)batch;
* receive buffers: ``n * I``, ``I`` the bytes of one received input (the previous stage's output),
  held until the backward that consumes it.

Allocator slack, workspace and the transient copies of an update are not counted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph
from pipedream.schedules import DEFAULT_WARMUP, WARMUPS

OPTIMIZER_STATES = {"sgd": 1, "adam": 2}  # state tensors of the weights' size per optimizer (SGD: momentum)
SCHEDULES = ("1f1b", "vertical", "gpipe", "2bw", "dp")


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


def optimizer_states(optimizer: str, momentum: float = 0.9) -> int:
    """Optimizer state tensors of the weights' size: SGD 1 with momentum (0 without), Adam 2.

    Raises:
        PipeDreamError: an unknown optimizer.
    """
    if optimizer not in OPTIMIZER_STATES:
        raise PipeDreamError(f"unknown optimizer {optimizer!r}; use one of {sorted(OPTIMIZER_STATES)}")
    return 0 if optimizer == "sgd" and momentum == 0 else OPTIMIZER_STATES[optimizer]


def in_flight(schedule: str, replicas: Sequence[int], stage: int, microbatches: int = 1,
              warmup: str = DEFAULT_WARMUP) -> int:
    """(Micro)batches whose activations one replica of ``stage`` holds at its peak.

    1F1B (stashing or vertical sync): its warm-up count (:data:`pipedream.schedules.WARMUPS`, NOAM on the
    input stage, §3.2); GPipe: every microbatch the replica runs (``ceil(m / r)``, all forwards before
    any backward); 2BW: 1F1B over microbatches, ``min(m, warm-up)``; data parallelism: 1.

    Raises:
        PipeDreamError: an unknown schedule.
    """
    if schedule in ("1f1b", "vertical"):
        return WARMUPS[warmup](replicas, stage)
    if schedule == "gpipe":
        return math.ceil(microbatches / replicas[stage])
    if schedule == "2bw":
        return min(math.ceil(microbatches / replicas[stage]), WARMUPS[warmup](replicas, stage))
    if schedule == "dp":
        return 1
    raise PipeDreamError(f"unknown schedule {schedule!r}; use one of {', '.join(SCHEDULES)}")


def weight_copies(schedule: str, in_flight_count: int) -> int:
    """Copies of a stage's weights its schedule holds (module docstring): flush and DP 1, 2BW 2, weight
    stashing and vertical sync one per in-flight minibatch's version (at most ``in_flight_count``).

    Raises:
        PipeDreamError: an unknown schedule.
    """
    if schedule in ("gpipe", "dp"):
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
                 in_flight_count: int, optimizer: str = "sgd", momentum: float = 0.9) -> StageMemory:
    """Bytes one replica of a stage holds at its peak.

    Args:
        param_bytes: the stage's parameters, bytes (``P``).
        activation_bytes: what its forward stashes for one (micro)batch, bytes (``A``).
        input_bytes: what the runtime keeps per (micro)batch outside autograd, bytes (``I``: the received
            input or the data, and the output it sent; see :func:`plan_memory`).
        schedule: one of :data:`SCHEDULES`.
        in_flight_count: (micro)batches held at the peak (:func:`in_flight`).
        optimizer, momentum: the optimizer (:func:`optimizer_states`).
    Raises:
        PipeDreamError: an unknown schedule or optimizer.
    """
    return StageMemory(weights=weight_copies(schedule, in_flight_count) * param_bytes, gradients=param_bytes,
                       optimizer=optimizer_states(optimizer, momentum) * param_bytes,
                       activations=in_flight_count * activation_bytes, buffers=in_flight_count * input_bytes)


def plan_memory(graph: LayerGraph, stages: Sequence[Sequence[str]], replicas: Sequence[int], *,
                schedule: str = "1f1b", microbatches: int = 1, warmup: str = DEFAULT_WARMUP, optimizer: str = "sgd",
                momentum: float = 0.9) -> list[StageMemory]:
    """:func:`stage_memory` of one replica of each stage of a plan, from a profile.

    ``A`` and ``I`` per (micro)batch as :func:`_activation_and_buffer_bytes` defines them: ``graph`` must be
    at the (micro)batch size the stage runs. ``stages`` are node ids per stage, ``replicas`` per stage.

    Raises:
        PipeDreamError: an unknown schedule or optimizer.
    """
    where = {n: s for s, nodes in enumerate(stages) for n in nodes}
    consumers: dict[str, list[str]] = {}
    for a, b in graph.edges:
        consumers.setdefault(a, []).append(b)
    out = []
    for s, nodes in enumerate(stages):
        params = sum(graph.nodes[n].param_bytes for n in nodes)
        acts, inputs = _activation_and_buffer_bytes(graph, s, nodes, where, consumers, last=s == len(stages) - 1)
        n = in_flight(schedule, replicas, s, microbatches, warmup)
        out.append(stage_memory(params, acts, inputs, schedule=schedule, in_flight_count=n, optimizer=optimizer,
                                momentum=momentum))
    return out


def _activation_and_buffer_bytes(graph: LayerGraph, s: int, nodes: Sequence[str], where: dict[str, int],
                                 consumers: dict[str, list[str]], last: bool) -> tuple[float, float]:
    """``(A, I)`` of stage ``s`` per (micro)batch, bytes.

    ``I``: what the runtime keeps per in-flight (micro)batch outside autograd: the received input (or the
    data, on a stage with the model's inputs) and, on a stage that sends, its output (kept for the backward).
    ``A``: with our profiler's record of what each layer saves (``graph.saved``), those bytes plus the
    output of every layer of the stage that it or a consumer in the stage saves (sent outputs are in ``I``;
    the model's final output is saved by the loss); without it (the release's profiles), every layer's output.
    """
    inside = set(nodes)
    received = {a for a, b in graph.edges if where.get(b) == s and where.get(a, s) != s}
    data = [n for n in nodes if graph.nodes[n].is_input]
    kept = sum(graph.nodes[a].output_bytes for a in (*received, *data))
    layers = [n for n in nodes if not graph.nodes[n].is_input]
    if not all(n in graph.saved for n in layers):
        return sum(graph.nodes[n].output_bytes for n in layers), kept
    sent = set() if last else {n for n in nodes if any(where.get(c, s) != s for c in consumers.get(n, []))}
    acts = 0.0
    for n in layers:
        own, _, saves_output = graph.saved[n]
        inside_consumers = [c for c in consumers.get(n, []) if c in inside]
        held = saves_output or not consumers.get(n) or any(graph.saved[c][1] for c in inside_consumers)
        acts += own + (graph.nodes[n].output_bytes if held and n not in sent else 0.0)
    return acts, kept + sum(graph.nodes[n].output_bytes for n in sent)


def stashing_total(param_bytes, activation_bytes, input_bytes, in_flight_count, states: int = 1):  # type: ignore[no-untyped-def]
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
