"""Model registry: every Table 1 model as a flat ``nn.Sequential`` of layers, and users' own models.

A model name is either a registered name (``vgg16``) or ``package.module:function`` naming a function of
the user's (importable, e.g. through ``PYTHONPATH``) that returns a :class:`ModelSpec` (the model and its
data, see :func:`user_spec`) or just a module over ``(B, 3, 32, 32)`` images, which then trains on
Fashion-MNIST like the registry's image models. A module that is not an ``nn.Sequential`` is captured as a
graph of layers (:mod:`pipedream.capture`).

A flat sequence is what the profiler measures layer by layer and what the runtime slices into
stages: layer ``i`` of the sequence is graph node ``node{i+1}`` (``node0`` is the input), see
:func:`pipedream.models.layer_node_id`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from pipedream.errors import PipeDreamError

if TYPE_CHECKING:
    from pipedream.data.base import SampleSet
    from pipedream.data.synthetic import SyntheticSpec


def logits_of(output: Any) -> torch.Tensor:
    """The logits in a model's output: the output itself if it is a tensor, else its ``"logits"`` entry (a
    Hugging Face ``ModelOutput``, a dict) or its first tensor (a tuple).

    Raises:
        PipeDreamError: the output holds no tensor.
    """
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict) and isinstance(output.get("logits"), torch.Tensor):
        return output["logits"]
    from torch.utils import _pytree as pytree

    for t in pytree.tree_leaves(output):
        if isinstance(t, torch.Tensor):
            return t
    raise PipeDreamError(f"the model's output is a {type(output).__name__} without a tensor; return logits")


def classification_loss(output: Any, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits ``(B, C)`` against class ids ``(B,)``, or of per-position logits
    ``(B, T, C)`` against ``(B, T)`` (a language model's next tokens; target -100 is not counted). The logits
    are :func:`logits_of` the output.

    Raises:
        PipeDreamError: logits and targets whose shapes do not pair up (names both shapes).
    """
    logits = logits_of(output)
    if target.is_floating_point() or tuple(logits.shape[:-1]) != tuple(target.shape):
        raise PipeDreamError(f"the default loss (cross-entropy) needs logits (..., classes) over targets (...) of class "
                             f"ids; got logits {tuple(logits.shape)} and {target.dtype} targets {tuple(target.shape)}: "
                             "fix the data or give ModelSpec a criterion")
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


@dataclass(frozen=True)
class ModelSpec:
    """How to build one model.

    Attributes:
        name: registry key, e.g. ``"vgg16"``.
        task: ``"image_classification"``, ``"translation"``, ``"language_model"`` or ``"video_captioning"``.
        build: ``build(preset) -> nn.Module``; presets are ``"reduced"`` (CPU) and ``"full"`` (paper). An
            ``nn.Sequential`` is cut between its children; any other module is captured first
            (:mod:`pipedream.capture`).
        input_shape: ``input_shape(preset) -> per-sample input shape`` (without the batch dimension), for
            models without data of their own; None where the data say it.
        dataset: name of the data set the model trains on at the reduced preset.
        criterion: ``criterion(output, target) -> scalar loss`` on the last layer's output and the
            collated target batch (the last pipeline stage calls it).
        metric: name of the quality metric: ``"top1"`` (percent), ``"bleu"`` (sacrebleu, 0-100),
            ``"perplexity"`` or ``"bleu4"``.
        ignore_index: target id that neither the loss nor the token accuracy counts (padding); None if
            every target position counts.
        make_datasets: ``make_datasets(preset, train_subset, val_subset, seed) -> (train, val)``
            :class:`~pipedream.data.base.SampleSet` pairs; None if the model has no data hook.
        evaluate: ``evaluate(model, val, batch_size) -> metric value`` on a whole (assembled) model.
        example: ``example(preset, batch_size, seed) -> input batch`` for profiling; None means a
            standard normal tensor of ``input_shape``.
        synthetic: ``synthetic(preset) -> SyntheticSpec``: random samples of the real data's shapes and
            label ranges (``--data synthetic``, :mod:`pipedream.data.synthetic`); None: real data only.
    """

    name: str
    task: str
    build: Callable[[str], nn.Module]
    input_shape: Callable[[str], tuple[int, ...]] | None = None
    dataset: str = "own"
    criterion: Callable[[Any, torch.Tensor], torch.Tensor] = classification_loss
    metric: str = "top1"
    ignore_index: int | None = None
    make_datasets: Callable[[str, int | None, int | None, int], tuple[SampleSet, SampleSet]] | None = None
    evaluate: Callable[[nn.Module, SampleSet, int], float] | None = None
    example: Callable[[str, int, int], torch.Tensor] | None = None
    synthetic: Callable[[str], SyntheticSpec] | None = None


_REGISTRY: dict[str, ModelSpec] = {}


def register(spec: ModelSpec) -> None:
    """Add a model to the registry (called by each model module at import)."""
    _REGISTRY[spec.name] = spec


def get_spec(name: str) -> ModelSpec:
    """The spec of model ``name`` (registered, or ``package.module:function``, see :func:`user_spec`);
    raises PipeDreamError listing known models if unknown."""
    if ":" in name:
        return user_spec(name)
    _load_all()
    if name not in _REGISTRY:
        raise PipeDreamError(f"unknown model {name!r}; known models: {', '.join(sorted(_REGISTRY))} "
                             "(or package.module:function for your own)")
    return _REGISTRY[name]


_USER: dict[str, ModelSpec] = {}


def user_spec(path: str) -> ModelSpec:
    """The spec of a user's model ``package.module:function``.

    ``function()`` returns either a :class:`ModelSpec` (its ``build``, ``make_datasets``, ``criterion``, ...
    are used as they are; ``name`` becomes ``path``) or any ``nn.Module`` over ``(B, 3, 32, 32)`` images with
    10 classes (a torchvision ResNet-18 or MobileNetV2 with ``num_classes=10``, an ``nn.Sequential``), which
    trains on Fashion-MNIST; each build calls ``function()`` again. The module must be importable: installed, or
    on ``PYTHONPATH`` (the training workers inherit the environment).

    Raises:
        PipeDreamError: a malformed path, a module or function that does not import, or a function that
            returns something else.
    """
    if path in _USER:
        return _USER[path]
    module, _, fn = path.partition(":")
    if not module or not fn.isidentifier():
        raise PipeDreamError(f"model {path!r}: expected a registered name or package.module:function")
    try:
        factory = getattr(importlib.import_module(module), fn)
    except (ImportError, AttributeError) as e:
        raise PipeDreamError(f"cannot import model function {path!r}: {e}") from None
    made = factory()
    if isinstance(made, ModelSpec):
        spec = replace(made, name=path)
    elif isinstance(made, nn.Module):
        from pipedream.data.images import fmnist_synthetic

        spec = ModelSpec(name=path, task="image_classification", build=lambda preset: factory(),
                         input_shape=lambda preset: (3, 32, 32), dataset="fashion_mnist",
                         synthetic=lambda preset: fmnist_synthetic(32))
    else:
        raise PipeDreamError(f"model function {path!r} returned a {type(made).__name__}; return an nn.Module "
                             "or a pipedream.models.ModelSpec")
    _USER[path] = spec
    return spec


def image_spec(name: str, build: Callable[[str], nn.Module], reduced_size: int) -> ModelSpec:
    """An ImageNet classifier (224x224 at ``full``) that trains on Fashion-MNIST at ``reduced_size`` pixels."""
    from pipedream.data.images import image_datasets, image_synthetic, top1_accuracy

    return ModelSpec(name, "image_classification", build, lambda preset: (3, 224, 224) if preset == "full" else
                     (3, reduced_size, reduced_size), "fashion_mnist", make_datasets=image_datasets(reduced_size),
                     synthetic=image_synthetic(reduced_size), evaluate=top1_accuracy)


def model_names() -> list[str]:
    """Names of all registered models, sorted."""
    _load_all()
    return sorted(_REGISTRY)


def build_model(name: str, preset: str = "reduced", seed: int = 0) -> nn.Module:
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
    """A random input batch of shape ``(batch_size, *input_shape)`` for profiling.

    Models whose input is not a float tensor (token ids, packed frames and captions) supply their own
    ``example`` hook, which this calls instead.
    """
    spec = get_spec(name)
    if spec.example is not None:
        return spec.example(preset, batch_size, seed)
    if spec.input_shape is None:
        raise PipeDreamError(f"model {name!r} has neither input_shape nor an example hook; give it data "
                             "(ModelSpec.make_datasets), whose first samples are the example")
    g = torch.Generator().manual_seed(seed)
    return torch.randn((batch_size, *spec.input_shape(preset)), generator=g)


def disable_inplace(layers: list[nn.Module]) -> None:
    """Make every ``nn.ReLU`` out-of-place: an in-place one would overwrite a tensor received at a stage
    boundary (or a stage's output) that the neighbouring stage's backward still needs."""
    for layer in layers:
        if isinstance(layer, nn.ReLU):
            layer.inplace = False


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


class LayerTracer(fx.Tracer):
    """A ``torch.fx`` tracer for which every direct child of a traced ``nn.Sequential`` is one leaf.

    ``fx.symbolic_trace`` only keeps ``torch.nn`` modules whole and traces through everything else,
    so a ResNet Bottleneck or a GNMT layer would become many nodes (or fail on its time loop). With
    this tracer layer ``i`` of a model's sequence is exactly one node ``node{i+1}``, which is what the
    planner's stages and the runtime's slices are made of. Other roots are traced as usual.
    """

    def __init__(self) -> None:
        super().__init__()
        self._layers: set[int] = set()

    def trace(self, root: Any, concrete_args: dict[str, Any] | None = None) -> fx.Graph:
        """Trace ``root``; if it is an ``nn.Sequential`` its children become leaves."""
        self._layers = {id(m) for m in root.children()} if isinstance(root, nn.Sequential) else set()
        return super().trace(root, concrete_args)

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        """Children of the sequence are leaves, and so is everything fx keeps whole by default."""
        return id(m) in self._layers or super().is_leaf_module(m, module_qualified_name)


def trace_layers(model: nn.Module) -> fx.GraphModule:
    """``fx.symbolic_trace`` with :class:`LayerTracer`: one graph node per layer of a sequence."""
    graph = LayerTracer().trace(model)
    return fx.GraphModule(model, graph, model.__class__.__name__)


def _load_all() -> None:
    from pipedream.models import alexnet, awd_lm, gnmt, resnet, s2vt, transformer, vgg  # noqa: F401  (register themselves)
