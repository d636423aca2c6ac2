"""Tied parameters: one parameter tensor that several layers of a profile use (a language model's input and
output embeddings, GPT-2's ``transformer.wte`` and ``lm_head``).

The profiler records each as a :class:`Tied` (its name, the nodes that use it, its bytes) on
:attr:`pipedream.graph.LayerGraph.tied` and in ``graph.json``'s ``"tied"`` list; a profile without that list
(the release's, or one written before it) has none. Every user's ``param_bytes`` includes the tensor's bytes,
so a sum over nodes counts it once per user; :meth:`pipedream.graph.LayerGraph.param_bytes_of` counts it once
per set of nodes, which is what one stage holding several of its users keeps. A plan that puts its users in
several stages gives each of them a copy, and the runtime sums the copies' gradients over every rank of those
stages before each step (:mod:`pipedream.runtime.shared`): one collective per set of holding stages
(:func:`gradient_sums`), which the simulator times (:mod:`pipedream.sim.engine`).

The rule for which plans can keep those copies equal is here, once (:func:`replica_conflict`): the runtime's
:func:`pipedream.runtime.shared.check` raises it, and the planner drops the plans it refuses
(:func:`plan_conflict`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipedream.errors import PipeDreamError


@dataclass(frozen=True)
class Tied:
    """One parameter tensor used by several nodes of a layer graph.

    Attributes:
        name: its name in the profiled model (the first of its names, e.g. ``lm_head.weight``).
        nodes: ids of the nodes that use it, in graph order (at least two).
        nbytes: its bytes, counted in each of those nodes' ``param_bytes``.
    """

    name: str
    nodes: tuple[str, ...]
    nbytes: float

    def to_json(self) -> dict[str, Any]:
        """The ``graph.json`` record: ``{"name", "nodes", "bytes"}``."""
        return {"name": self.name, "nodes": list(self.nodes), "bytes": self.nbytes}

    @classmethod
    def from_json(cls, record: Any, known: Iterable[str]) -> Tied:
        """Read a ``graph.json`` record written by :meth:`to_json`.

        Raises:
            PipeDreamError: a malformed record, fewer than two nodes, negative bytes, or a node not in ``known``.
        """
        try:
            tied = cls(str(record["name"]), tuple(str(n) for n in record["nodes"]), float(record["bytes"]))
        except (KeyError, TypeError, ValueError):
            raise PipeDreamError(f"malformed tied-parameter record {record!r} in graph.json; expected "
                                 "{'name', 'nodes', 'bytes'}: run `pipedream profile` again") from None
        names = set(known)
        unknown = [n for n in tied.nodes if n not in names]
        if len(set(tied.nodes)) < 2 or tied.nbytes < 0 or unknown:
            raise PipeDreamError(f"tied parameter {tied.name} in graph.json names nodes {list(tied.nodes)} "
                                 f"({'unknown: ' + ', '.join(unknown) if unknown else 'fewer than two or negative bytes'}); "
                                 "graph.json does not match graph.txt: run `pipedream profile` again")
        return tied


def duplicate_bytes(tied: Sequence[Tied], nodes: Iterable[str]) -> float:
    """Bytes a sum of ``nodes``' ``param_bytes`` counts more than once: each tied tensor used by ``k > 1`` of
    them, ``(k - 1)`` times its bytes."""
    inside = set(nodes)
    return sum(t.nbytes * max(0, sum(1 for n in t.nodes if n in inside) - 1) for t in tied)


def holding_stages(tied: Sequence[Tied], stage_nodes: Sequence[Iterable[str]]) -> list[tuple[Tied, tuple[int, ...]]]:
    """The tied tensors that more than one stage holds, each with those stages in pipeline order (node ids per
    stage; a node in no stage holds nothing)."""
    stage_of: Mapping[str, int] = {n: s for s, nodes in enumerate(stage_nodes) for n in nodes}
    held = ((t, tuple(sorted({stage_of[n] for n in t.nodes if n in stage_of}))) for t in tied)
    return [(t, stages) for t, stages in held if len(stages) > 1]


def gradient_sums(tied: Sequence[Tied], stage_nodes: Sequence[Iterable[str]]) -> list[tuple[tuple[int, ...], float]]:
    """The runtime's gradient sums of tied tensors (:class:`pipedream.runtime.shared.SharedGrads`): one per set of
    holding stages, in order of first appearance, over all their ranks, of the bytes of every tensor those
    stages share: ``(stages, bytes)``."""
    sums: dict[tuple[int, ...], float] = {}
    for t, stages in holding_stages(tied, stage_nodes):
        sums[stages] = sums.get(stages, 0.0) + t.nbytes
    return list(sums.items())


def replica_conflict(name: str, stages: Sequence[int], replicas: Sequence[int], schedule: str) -> str | None:
    """Why the runtime refuses a parameter held by ``stages`` (pipeline order) of a plan with ``replicas`` per
    stage under ``schedule``, or None if it accepts it.

    The copies' gradients are summed at every optimizer step, so every holding stage must step over the same
    minibatches: under 1F1B(-RR) a stage replicated ``r`` times steps once per round of ``r`` minibatches, so
    the holding stages need equal replica counts (the flush schedules step every stage once per minibatch).
    """
    reps = [replicas[s] for s in stages]
    if schedule == "1f1b" and len(set(reps)) > 1:
        return (f"parameter {name} is used by stages {list(stages)}, replicated {reps} times: under 1F1B their "
                "steps cover different minibatches; plan them with equal replicas or use --schedule gpipe or 2bw")
    return None


def plan_conflict(tied: Sequence[Tied], stage_nodes: Sequence[Iterable[str]], replicas: Sequence[int],
                  schedule: str = "1f1b") -> str | None:
    """:func:`replica_conflict` of the first tied tensor a plan (node ids and replicas per stage) breaks the rule
    for, or None when the runtime accepts them all."""
    for t, stages in holding_stages(tied, stage_nodes):
        why = replica_conflict(t.name, stages, replicas, schedule)
        if why is not None:
            return why
    return None
