"""Model registry: every Table 1 model as a flat ``nn.Sequential`` of layers.

A flat sequence is what the profiler measures layer by layer and what the runtime slices into
stages: layer ``i`` of the sequence is graph node ``node{i+1}`` (``node0`` is the input), see
:func:`pipedream.models.layer_node_id`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from pipedream.errors import PipeDreamError


@dataclass(frozen=True)
class ModelSpec:
    """How to build one model.

    Attributes:
        name: registry key, e.g. ``"vgg16"``.
        task: ``"image_classification"``, ``"translation"``, ``"language_model"`` or ``"video_captioning"``.
        build: ``build(preset) -> nn.Sequential``; presets are ``"reduced"`` (CPU) and ``"full"`` (paper).
        input_shape: ``input_shape(preset) -> per-sample input shape`` (without the batch dimension).
        dataset: name of the data set the model trains on at the reduced preset.
    """

    name: str
    task: str
    build: Callable[[str], nn.Sequential]
    input_shape: Callable[[str], tuple[int, ...]]
    dataset: str


_REGISTRY: dict[str, ModelSpec] = {}


def register(spec: ModelSpec) -> None:
    """Add a model to the registry (called by each model module at import)."""
    _REGISTRY[spec.name] = spec


def get_spec(name: str) -> ModelSpec:
    """The spec of model ``name``; raises PipeDreamError listing known models if unknown."""
    _load_all()
    if name not in _REGISTRY:
        raise PipeDreamError(f"unknown model {name!r}; known models: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def model_names() -> list[str]:
    """Names of all registered models, sorted."""
    _load_all()
    return sorted(_REGISTRY)


def build_model(name: str, preset: str = "reduced", seed: int = 0) -> nn.Sequential:
    """Build model ``name`` at ``preset`` with weights initialised from ``seed``.

    Raises:
        PipeDreamError: unknown model or preset.
    """
    spec = get_spec(name)
    if preset not in ("reduced", "full"):
        raise PipeDreamError(f"unknown preset {preset!r} for model {name!r}; use 'reduced' or 'full'")
    torch.manual_seed(seed)
    return spec.build(preset)


def example_input(name: str, batch_size: int, preset: str = "reduced", seed: int = 0) -> torch.Tensor:
    """A random input batch of shape ``(batch_size, *input_shape)`` for profiling."""
    spec = get_spec(name)
    g = torch.Generator().manual_seed(seed)
    return torch.randn((batch_size, *spec.input_shape(preset)), generator=g)


def layer_node_id(index: int) -> str:
    """Graph node id of layer ``index`` of a model's sequence (``node0`` is the input)."""
    return f"node{index + 1}"


def node_layer_index(node_id: str) -> int:
    """Inverse of :func:`layer_node_id`; ``-1`` for the input node ``node0``.

    Raises:
        PipeDreamError: if ``node_id`` is not of the form ``node<k>``.
    """
    if not node_id.startswith("node") or not node_id[4:].isdigit():
        raise PipeDreamError(f"node id {node_id!r} does not name a layer of a registered model (expected node<k>)")
    return int(node_id[4:]) - 1


def _load_all() -> None:
    from pipedream.models import vgg  # noqa: F401  (registers itself)
