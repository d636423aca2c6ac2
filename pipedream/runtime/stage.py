"""Build a stage's module from a Plan by slicing the model's flat ``nn.Sequential`` (§3.1 partitions).

Stage ``s`` of a plan owns graph nodes ``node{i+1}`` = layer ``i`` of the sequence
(:func:`pipedream.models.node_layer_index`); the input node ``node0`` belongs to no layer. A chain
model's stages must own contiguous, consecutive layer ranges that together cover the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pipedream.errors import PipeDreamError
from pipedream.models import node_layer_index
from pipedream.plan import Plan


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


def build_stage(model: nn.Sequential, plan: Plan, stage: int) -> nn.Sequential:
    """The layers of ``stage`` as their own ``nn.Sequential`` (sharing the model's parameters)."""
    r = stage_layer_ranges(plan, len(model))[stage]
    return nn.Sequential(*(model[i] for i in r))


@dataclass(frozen=True)
class Boundary:
    """What crosses one stage boundary, per sample: one tensor or a flat tuple of tensors.

    Attributes:
        specs: ``(shape without the batch dimension, dtype)`` of each tensor, in order.
        is_tuple: whether the layers exchange a tuple (else a single tensor).
    """

    specs: tuple[tuple[tuple[int, ...], torch.dtype], ...]
    is_tuple: bool

    @property
    def grad_items(self) -> list[int]:
        """Indices of the floating-point tensors: the ones whose gradients flow back."""
        return [k for k, (_, dtype) in enumerate(self.specs) if dtype.is_floating_point]

    def batched(self, batch: int, grads: bool = False) -> list[tuple[tuple[int, ...], torch.dtype]]:
        """(shape, dtype) of each tensor for ``batch`` samples (only the gradient-carrying ones if ``grads``)."""
        items = self.grad_items if grads else range(len(self.specs))
        return [((batch, *self.specs[k][0]), self.specs[k][1]) for k in items]

    def pack(self, tensors: list[torch.Tensor]) -> Any:
        """The value the next stage's first layer takes: the tuple, or the single tensor."""
        return tuple(tensors) if self.is_tuple else tensors[0]

    @staticmethod
    def unpack(value: Any) -> list[torch.Tensor]:
        """The tensors of a stage's output value (a tensor or a flat tuple of tensors)."""
        return list(value) if isinstance(value, tuple | list) else [value]


def boundary_shapes(model: nn.Sequential, plan: Plan, example: torch.Tensor) -> list[Boundary]:
    """What crosses each stage's output boundary, stages in order (the last one: the model output).

    Computed by one forward pass of ``example`` (a batch of one sample, model input) through the
    whole model in evaluation mode.

    Raises:
        PipeDreamError: a boundary carries something other than a tensor or a flat tuple of tensors.
    """
    ranges = stage_layer_ranges(plan, len(model))
    out = []
    x = example
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for s, r in enumerate(ranges):
            for i in r:
                x = model[i](x)
            items = Boundary.unpack(x)
            if not all(isinstance(t, torch.Tensor) for t in items):
                raise PipeDreamError(f"the output of stage {s} is {type(x).__name__} of "
                                     f"{[type(t).__name__ for t in items]}; stage boundaries must carry a tensor or "
                                     "a flat tuple of tensors")
            out.append(Boundary(tuple((tuple(t.shape[1:]), t.dtype) for t in items), isinstance(x, tuple | list)))
    model.train(was_training)
    return out


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
