"""A plan's stages as modules, and what crosses each boundary (§3.1 partitions).

:func:`build_stages` cuts any torch.fx-traceable model along the plan's node ids
(:mod:`pipedream.runtime.split`), chains and DAGs alike. For a chain of layers (the ``"layer"``
granularity) stage ``s`` owns graph nodes ``node{i+1}`` = layer ``i`` of the sequence
(:func:`pipedream.models.node_layer_index`); :func:`stage_layer_ranges` gives those ranges.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pipedream.errors import PipeDreamError
from pipedream.models import node_layer_index
from pipedream.plan import Plan
from pipedream.runtime import split


def stage_layer_ranges(plan: Plan, num_layers: int) -> list[range]:
    """Layer index range of every stage of ``plan`` for a chain model of ``num_layers`` layers.

    Raises:
        PipeDreamError: a stage's layers are not contiguous, stages overlap or leave gaps, or a node
            names a layer the model does not have.
    """
    ranges: list[range] = []
    nxt = 0
    for s, stage in enumerate(plan.stages):
        idx = sorted(i for i in (node_layer_index(n) for n in stage.nodes) if i >= 0)
        if not idx:
            raise PipeDreamError(f"plan stage {s} has no layers (nodes {stage.nodes})")
        if idx != list(range(idx[0], idx[-1] + 1)):
            raise PipeDreamError(f"plan stage {s} owns non-contiguous layers {idx}; only chain partitions are "
                                 "supported by the runtime")
        if idx[0] != nxt:
            raise PipeDreamError(f"plan stage {s} starts at layer {idx[0]} but the previous stage ends at "
                                 f"layer {nxt - 1}; stages must cover the model in order")
        if idx[-1] >= num_layers:
            raise PipeDreamError(f"plan stage {s} names layer {idx[-1]} but the model has {num_layers} layers; "
                                 "was the plan made for another model or preset?")
        ranges.append(range(idx[0], idx[-1] + 1))
        nxt = idx[-1] + 1
    if nxt != num_layers:
        raise PipeDreamError(f"plan covers layers 0..{nxt - 1} but the model has {num_layers} layers")
    return ranges


def granularity_of(plan: Plan) -> str:
    """The profile granularity the plan's node ids refer to (``plan.extra["granularity"]``, default layer)."""
    return str(plan.extra.get("granularity", "layer"))


@dataclass(frozen=True)
class Boundary:
    """What crosses one stage boundary, per sample: a flat tuple of tensors.

    Attributes:
        specs: ``(shape without the batch dimension, dtype)`` of each tensor, in order.
    """

    specs: tuple[tuple[tuple[int, ...], torch.dtype], ...]

    @property
    def grad_items(self) -> list[int]:
        """Indices of the floating-point tensors: the ones whose gradients flow back."""
        return [k for k, (_, dtype) in enumerate(self.specs) if dtype.is_floating_point]

    def batched(self, batch: int, grads: bool = False) -> list[tuple[tuple[int, ...], torch.dtype]]:
        """(shape, dtype) of each tensor for ``batch`` samples (only the gradient-carrying ones if ``grads``)."""
        items = self.grad_items if grads else range(len(self.specs))
        return [((batch, *self.specs[k][0]), self.specs[k][1]) for k in items]

    @staticmethod
    def unpack(value: Any) -> list[torch.Tensor]:
        """The tensors of a stage's output value (a tensor or a flat tuple of tensors)."""
        return list(value) if isinstance(value, tuple | list) else [value]


@dataclass
class Stages:
    """A model cut into the stages of a plan.

    Attributes:
        modules: stage ``s``'s module; stage 0 takes the model input, every later stage takes the
            previous stage's flat tuple of tensors as ``*args``; all but the last return such a tuple.
        boundaries: what leaves each stage, stages in order (the last one: the model output).
    """

    modules: list[nn.Module]
    boundaries: list[Boundary]


def build_stages(model: nn.Module, plan: Plan, example: Any) -> Stages:
    """Cut ``model`` into the stages of ``plan`` with torch.fx (:mod:`pipedream.runtime.split`).

    Args:
        model: the whole model; the stage modules share its parameters (names unchanged).
        plan: its stages' node ids refer to a profile at ``plan.extra["granularity"]`` (default layer).
        example: a model input of one sample ``(1, ...)``, run once to learn the boundary shapes.
    Raises:
        PipeDreamError: the plan does not cover the model's graph exactly once in graph order, a
            boundary carries something other than tensors, or two stages share a parameter.
    """
    gm = split.trace(model, granularity_of(plan))
    part = split.split(gm, [s.nodes for s in plan.stages], example)
    owner: dict[int, tuple[int, str]] = {}
    for s, module in enumerate(part.modules):
        for name, p in module.named_parameters():
            if owner.setdefault(id(p), (s, name))[0] != s:
                raise PipeDreamError(f"parameter {name} is used by stages {owner[id(p)][0]} and {s} (tied weights); "
                                     "re-plan so that all of its users are in one stage")
    out: list[Boundary] = []
    was_training = model.training
    model.eval()
    with torch.no_grad():
        x: Any = example if isinstance(example, tuple) else (example,)
        for module in part.modules:
            x = Boundary.unpack(module(*x))
            out.append(Boundary(tuple((tuple(t.shape[1:]), t.dtype) for t in x)))
    model.train(was_training)
    return Stages(list(part.modules), out)


def straight_plan(model: str, num_layers: int, layers_per_stage: list[int], replicas: list[int] | None = None) -> Plan:
    """A plan by hand: consecutive stages of ``layers_per_stage`` layers, ranks assigned in order.

    Used by tests and benchmarks (the planner makes the real plans).
    """
    from pipedream.models import layer_node_id
    from pipedream.plan import Stage

    if sum(layers_per_stage) != num_layers:
        raise PipeDreamError(f"layers_per_stage {layers_per_stage} does not sum to {num_layers}")
    replicas = replicas or [1] * len(layers_per_stage)
    stages, start, rank = [], 0, 0
    for n, rep in zip(layers_per_stage, replicas, strict=True):
        stages.append(Stage(nodes=[layer_node_id(i) for i in range(start, start + n)], replicas=rep,
                            ranks=list(range(rank, rank + rep))))
        start += n
        rank += rep
    return Plan(model=model, cluster="manual", workers=rank, stages=stages, minibatch_size=0,
                time_per_sample_s=0.0, dp_time_per_sample_s=0.0)
