"""A plan's stages as modules, and what crosses each boundary (§3.1 partitions).

:func:`build_stages` cuts any model along the plan's node ids (:mod:`pipedream.runtime.split`; a model that
is not an ``nn.Sequential`` is captured first, :mod:`pipedream.capture`), chains and DAGs alike; a parameter
that several stages read is held by each of them (:mod:`pipedream.runtime.shared`). For a chain of layers (the ``"layer"``
granularity) stage ``s`` owns graph nodes ``node{i+1}`` = layer ``i`` of the sequence
(:func:`pipedream.models.node_layer_index`); :func:`stage_layer_ranges` gives those ranges.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from pipedream.capture import batch_size, flat_inputs, tensors
from pipedream.errors import PipeDreamError
from pipedream.models import node_layer_index
from pipedream.plan import Plan
from pipedream.runtime import shared, split
from pipedream.runtime.shared import Shared


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
        specs: ``(shape without the batch dimension, dtype)`` of each tensor, in order; the whole shape of a tensor
            that has no batch dimension (one the model broadcasts over the batch, such as the ``(1, positions,
            width)`` cosines and sines of rotary embeddings).
        per_sample: whether each tensor's first dimension is the batch (default: every one).
    """

    specs: tuple[tuple[tuple[int, ...], torch.dtype], ...]
    per_sample: tuple[bool, ...] = ()

    @property
    def grad_items(self) -> list[int]:
        """Indices of the floating-point tensors: the ones whose gradients flow back."""
        return [k for k, (_, dtype) in enumerate(self.specs) if dtype.is_floating_point]

    def batched(self, batch: int, grads: bool = False) -> list[tuple[tuple[int, ...], torch.dtype]]:
        """(shape, dtype) of each tensor for ``batch`` samples (only the gradient-carrying ones if ``grads``)."""
        items = self.grad_items if grads else range(len(self.specs))
        whole = [k < len(self.per_sample) and not self.per_sample[k] for k in range(len(self.specs))]
        return [(self.specs[k][0] if whole[k] else (batch, *self.specs[k][0]), self.specs[k][1]) for k in items]

    @staticmethod
    def of(values: list[torch.Tensor], batch: int) -> Boundary:
        """The boundary of ``values``, computed on a batch of ``batch`` samples: a tensor whose first dimension is
        not ``batch`` is sent whole."""
        per_sample = tuple(t.dim() > 0 and t.shape[0] == batch for t in values)
        return Boundary(tuple((tuple(t.shape[1:]) if b else tuple(t.shape), t.dtype)
                              for t, b in zip(values, per_sample, strict=True)), per_sample)

    @staticmethod
    def unpack(value: Any) -> list[torch.Tensor]:
        """The tensors of a stage's output value (a tensor or a flat tuple of tensors)."""
        return list(value) if isinstance(value, tuple | list) else [value]


@dataclass
class Stages:
    """A model cut into the stages of a plan.

    Attributes:
        modules: stage ``s``'s module; stage 0 takes the model input (its flat tensors,
            :func:`pipedream.capture.flat_inputs`), every later stage takes the previous stage's flat tuple of
            tensors as ``*args``; all but the last return such a tuple.
        boundaries: what leaves each stage, stages in order (the last one: the tensors of the model output).
        shared: parameters several stages hold (:mod:`pipedream.runtime.shared`).
    """

    modules: list[nn.Module]
    boundaries: list[Boundary]
    shared: list[Shared] = field(default_factory=list)


def build_stages(model: nn.Module, plan: Plan, example: Any) -> Stages:
    """Cut ``model`` into the stages of ``plan`` (:mod:`pipedream.runtime.split`).

    Args:
        model: the whole model; the stage modules share its parameters (names unchanged).
        plan: its stages' node ids refer to a profile at ``plan.extra["granularity"]`` (default layer).
        example: a model input batch, run once to learn the boundary shapes; a model that is not an
            ``nn.Sequential`` is captured on it (:mod:`pipedream.capture`), so give a batch of the size that runs.
    Raises:
        PipeDreamError: the plan does not cover the model's graph exactly once in graph order, or a boundary
            carries something other than tensors.
    """
    gm = split.trace(model, granularity_of(plan), example)
    part = split.split(gm, [s.nodes for s in plan.stages], example)
    out: list[Boundary] = []
    was_training = model.training
    model.eval()
    for m in part.modules:
        m.eval()
    with torch.no_grad():
        x: Any = flat_inputs(example)
        for s, module in enumerate(part.modules):
            value = module(*x)
            x = Boundary.unpack(value) if s + 1 < len(part.modules) else tensors(value)
            out.append(Boundary.of(x, batch_size(example)))
    model.train(was_training)
    for m in part.modules:
        m.train(was_training)
    return Stages(list(part.modules), out, shared.find(part.modules))


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
