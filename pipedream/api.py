"""pipedream as a library: profile, plan and train any ``nn.Module`` from Python, as the command line does.

::

    import pipedream

    graph = pipedream.profile(model, x, target=y)                # per-layer times and bytes (a LayerGraph)
    plan = pipedream.partition(graph, "2:1e9", model="mine")     # stages, replicas, ranks (a Plan)
    rows = pipedream.train(model, plan, (train, val), pipedream.TrainConfig(epochs=2, batch_size=16))

``pipedream profile`` and ``pipedream plan`` call :func:`profile` and :func:`partition` (``pipedream.plan`` is
the module of the :class:`Plan` record); :func:`train` runs the same
workers as ``pipedream train`` (the PipeDream runtime, or DDP with ``mode="dp"``), started on this machine
from a fork server instead of torchrun, without MLflow: it returns the metrics rows ``metrics.json`` holds.
"""

from __future__ import annotations

import functools
import json
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph
from pipedream.plan import Plan
from pipedream.runtime.config import TrainConfig

if TYPE_CHECKING:  # planning does not import torch
    import torch
    from torch import nn


def profile(model: nn.Module, example: Any, target: torch.Tensor | None = None,
            criterion: Callable[[Any, torch.Tensor], torch.Tensor] | None = None, *, granularity: str = "layer",
            warmup: int = 2, iters: int = 5, device: str = "cpu", name: str = "model") -> LayerGraph:
    """Per-layer forward and backward seconds, activation and parameter bytes of ``model`` on one minibatch.

    Args:
        model: an ``nn.Sequential`` (one layer per child) or any module (captured: :mod:`pipedream.capture`).
        example: one minibatch of inputs: a tensor, or a tuple or dict of tensors (positional or keyword
            arguments); its first dimension is the profiled minibatch size. A graph captured by torch.export is
            specialised to these shapes: profile on the minibatch a run trains on.
        target: that minibatch's targets; with it the loss's forward and backward are timed too (the last
            stage computes it), by ``criterion`` (default: cross-entropy of the logits,
            :func:`pipedream.models.classification_loss`).
        granularity: ``"layer"`` or ``"op"`` (:func:`pipedream.runtime.split.trace`).
        warmup, iters: untimed and timed calls per layer (the median is kept).
        device: ``"cpu"`` or ``"cuda"``.
    Returns:
        the layer graph (times per minibatch in seconds, sizes in bytes, ``minibatch_size`` set), which
        :meth:`LayerGraph.write` saves as graph.txt.
    Raises:
        PipeDreamError: the model cannot be captured, or a layer fails on the example (named).
    Warns:
        UserWarning: layers whose timed calls spread by more than 20% of their median
            (:func:`pipedream.profiler.noise_warning`).
    """
    from pipedream.capture import to_device
    from pipedream.models import classification_loss
    from pipedream.profiler import ProfileSettings, noise_warning, profile_module

    settings = ProfileSettings(warmup=warmup, iters=iters, device=device)
    loss = None
    if target is not None:
        y, crit = to_device(target, device), criterion or classification_loss
        loss = functools.partial(_bound_loss, crit, y)
    graph = profile_module(model, example, settings, name=name, granularity=granularity, loss=loss)
    noise = noise_warning(graph)
    if noise:
        warnings.warn(noise, stacklevel=2)
    return graph


def _bound_loss(criterion: Callable[[Any, torch.Tensor], torch.Tensor], target: torch.Tensor, output: Any) -> torch.Tensor:
    return criterion(output, target)


def partition(graph: LayerGraph | str | Path, cluster: str, *, model: str = "model", straight: bool = False,
         memory_limit: bool | None = None, compat: bool = False, granularity: str = "layer",
         clusters: str | Path | None = None, profiled_batch: int | None = None,
         activation_compression_ratio: float | None = None) -> Plan:
    """PipeDream's planner (§3.1): the stages, their replicas and ranks for ``cluster``.

    Args:
        graph: a profile (:func:`profile`), or the path of a graph.txt (its meta.json gives the minibatch size
            and granularity).
        cluster: a name in ``clusters`` (default: the shipped ``experiments/clusters.yaml``) or a what-if string
            such as ``"4:1e9"`` (4 workers on 1 GB/s links) or ``"8x2:25e9,3.125e9"``.
        model: the name recorded in the plan.
        straight: one replica per stage.
        memory_limit: reject stages that do not fit a device (default on, off with ``compat``).
        compat: the release optimizer's semantics.
        granularity: what the graph's node ids are (``"layer"`` or ``"op"``), recorded for the runtime.
        profiled_batch: samples in the profiled minibatch, if the graph does not say.
        activation_compression_ratio: divide activation transfer bytes by this.
    Raises:
        PipeDreamError: an unknown cluster, a profile without a minibatch size, no plan that fits.
    """
    from pipedream.graph import profiled_batch as batch_of
    from pipedream.graph import read_meta
    from pipedream.paths import CLUSTERS, shipped
    from pipedream.planner import plan_pipeline
    from pipedream.topology import get_cluster

    if isinstance(graph, LayerGraph):
        batch = profiled_batch or graph.minibatch_size
        if batch < 1:
            raise PipeDreamError("the profile does not say its minibatch size; pass profiled_batch")
    else:
        path = shipped(str(graph))
        meta = read_meta(path)  # the release's profiles have none: their plans name no granularity
        granularity = str(meta.get("granularity", granularity)) if meta else ""
        graph = LayerGraph.read(path)
        batch = batch_of(path, profiled_batch)
    out = plan_pipeline(graph, get_cluster(cluster, clusters or CLUSTERS), model=model, minibatch_size=batch,
                        memory_limit=memory_limit, straight=straight, compat=compat,
                        activation_compression_ratio=activation_compression_ratio)
    if granularity:  # the runtime cuts the model at the granularity the node ids were profiled at
        out.extra["granularity"] = granularity
    return out


def _unpack(blob: bytes, item: int) -> Any:
    """Item ``item`` of what :func:`_pack` saved: each worker's own copy."""
    import io

    import torch

    return torch.load(io.BytesIO(blob), weights_only=False)[item]


def _pack(*objects: Any) -> bytes:
    """``objects`` as bytes for the workers. Pickled as they are, torch.multiprocessing would hand every worker
    the same shared-memory storage of each tensor (one rank's step would change the weights under the others)
    through one file descriptor per storage (the fork server refuses a few hundred: 'too many fds')."""
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(objects, buffer)
    return buffer.getvalue()


def train(model: nn.Module, plan: Plan | None, datasets: tuple[Any, Any], config: TrainConfig | None = None, *,
          mode: str = "pipedream", criterion: Callable[[Any, torch.Tensor], torch.Tensor] | None = None,
          timeout_s: float = 1800.0) -> list[dict[str, float]]:
    """Train ``model`` with PipeDream (``plan``'s pipeline) or data parallelism on local worker processes.

    Args:
        model: the model, as :func:`profile` took it; every worker starts from a copy of its weights.
        plan: from :func:`partition` (its ``workers`` processes are started); ``mode="dp"`` takes only its worker count
            (None: ``config``'s ``plan`` path, or one worker).
        datasets: ``(train, val)``: :class:`pipedream.data.base.SampleSet` s or sequences of ``(input, target)``
            samples (inputs: tensors, tuples or dicts of them); ``config.train_subset``/``val_subset`` draw
            subsets of them.
        config: the training options (:class:`TrainConfig`; ``out_dir`` default ``results/runs/<model>/<mode>``).
        mode: ``"pipedream"`` or ``"dp"``.
        criterion: ``criterion(output, target) -> loss`` (default: cross-entropy of the logits).
        timeout_s: limit for the whole run, s.
    Returns:
        one row per epoch (``train_loss``, ``val_accuracy``, ``epoch_time_s``, ...), as in ``metrics.json``.
    Raises:
        PipeDreamError: bad settings, a plan that does not fit the model, or a worker that failed (its reason).
    """
    from pipedream.runtime.launch import spawn_local

    if mode not in ("pipedream", "dp"):
        raise PipeDreamError(f"unknown mode {mode!r}; use 'pipedream' or 'dp'")
    blob = _pack(model, tuple(datasets))
    cfg = replace(config or TrainConfig(), model_factory=functools.partial(_unpack, blob, 0),
                  datasets=functools.partial(_unpack, blob, 1), criterion=criterion)
    if cfg.model == TrainConfig.model:  # the registry's default name: this is the caller's own model
        cfg.model = "model"
    out_dir = cfg.run_dir(mode)
    out_dir.mkdir(parents=True, exist_ok=True)
    workers = plan.workers if plan is not None else 1
    if plan is not None and mode == "pipedream":
        plan.save(out_dir / "plan.json")
        cfg.plan = str(out_dir / "plan.json")
    cfg.out_dir = str(out_dir)
    cfg.validate()
    if mode == "dp":
        from pipedream.baselines.ddp import train as fn
    else:
        from pipedream.runtime.worker import train as fn
    spawn_local(cfg, workers, fn=fn, timeout_s=timeout_s)
    return json.loads((out_dir / "metrics.json").read_text())
