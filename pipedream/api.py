"""pipedream as a library: profile, plan and train any ``nn.Module`` from Python, as the command line does.

::

    import pipedream

    graph = pipedream.profile(model, x, target=y)                # per-layer times and bytes (a LayerGraph)
    plan = pipedream.partition(graph, "2:1e9", model="mine")     # stages, replicas, ranks (a Plan)
    rows = pipedream.train(model, plan, (train, val), pipedream.TrainConfig(epochs=2, batch_size=16))

``pipedream profile``, ``pipedream plan`` and ``pipedream train`` call :func:`profile`, :func:`partition` and
:func:`train` (``pipedream.plan`` is the module of the :class:`Plan` record); what ``pipedream train`` adds around
the call (its checks, the staging folder, the predicted epoch time, MLflow, scoring, ``run.json``) is in
:mod:`pipedream.commands.train`.
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
            warmup: int = 2, iters: int = 5, device: str = "cpu", name: str = "model",
            in_situ: bool = True) -> LayerGraph:
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
        in_situ: on the CPU, each layer's times inside whole steps (:mod:`pipedream.in_situ`; its times alone
            kept in ``isolated``); False: its times alone.
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

    settings = ProfileSettings(warmup=warmup, iters=iters, device=device, in_situ=in_situ)
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
         activation_compression_ratio: float | None = None, optimizer: str = "sgd") -> Plan:
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
        optimizer: the optimizer the plan's runs train with (``sgd``, ``adam``, ``muon``): the planner charges its
            step, at the rates the profile's meta.json measured where it has them
            (:func:`pipedream.sim.profiled.step_rates`), else memory-bound.
    Raises:
        PipeDreamError: an unknown cluster or optimizer, a profile without a minibatch size, no plan that fits.
    """
    from pipedream.graph import profiled_batch as batch_of
    from pipedream.graph import read_meta
    from pipedream.paths import CLUSTERS, shipped
    from pipedream.planner import PlanOptions, plan_pipeline
    from pipedream.sim.profiled import step_rates
    from pipedream.topology import get_cluster

    meta: dict[str, Any] = {}
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
    options = PlanOptions(memory_limit=memory_limit, straight=straight, compat=compat,
                          activation_compression_ratio=activation_compression_ratio)
    out = plan_pipeline(graph, get_cluster(cluster, clusters or CLUSTERS), model=model, minibatch_size=batch,
                        options=options, step=step_rates(meta or {}, optimizer))
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


def train(model: nn.Module | str, plan: Plan | str | Path | None, datasets: tuple[Any, Any] | None = None,
          config: TrainConfig | None = None, *, mode: str = "pipedream", launcher: str = "local",
          workers: int | None = None, nnodes: int = 1, rdzv_endpoint: str | None = None,
          criterion: Callable[[Any, torch.Tensor], torch.Tensor] | None = None, timeout_s: float = 1800.0,
          on_epochs: Callable[[list[dict[str, float]]], None] | None = None,
          max_restarts: int = 0, runtime: str | None = None) -> list[dict[str, float]]:
    """Train ``model`` with PipeDream (``plan``'s pipeline) or data parallelism on worker processes; wait for them.

    ``pipedream train`` is this function with ``launcher="torchrun"`` and MLflow around it.

    Args:
        model: an ``nn.Module``, as :func:`profile` took it (every worker starts from a copy of its weights;
            ``launcher="local"`` only), or the name of a registered model or ``"package.module:function"``
            (:func:`pipedream.models.build_model`; it replaces ``config.model``), which each worker builds.
        plan: from :func:`partition`, or the path of a plan JSON; its ``workers`` processes are started.
            ``mode="dp"`` takes only its worker count. None: ``config.plan`` if set, else an even straight
            split of the layers over ``workers``.
        datasets: ``(train, val)``: :class:`pipedream.data.base.SampleSet` s or sequences of ``(input, target)``
            samples (inputs: tensors, tuples or dicts of them); ``config.train_subset``/``val_subset`` draw
            subsets of them. Needed with a module; with a model name, None means the model's own data
            (``config.data``, ``config.data_dir``), the only choice under torchrun.
        config: the training options (:class:`TrainConfig`; ``out_dir`` default ``results/runs/<model>/<mode>``);
            not modified.
        mode: ``"pipedream"`` or ``"dp"``.
        launcher: ``"local"`` (processes forked from a fork server on this machine,
            :func:`pipedream.runtime.launch.spawn_local`) or ``"torchrun"`` (a supervised torchrun job,
            :func:`pipedream.runtime.launch.run_torchrun`: the workers' progress on stderr and in
            ``<out_dir>/train.log``, and any failure kills every process it started).
        workers: worker processes in all (default: the plan's, else 1); with several nodes, ``workers / nnodes``
            a node.
        nnodes, rdzv_endpoint: torchrun on several nodes: call this on every node with the same arguments and a
            c10d rendezvous ``"host:port"``; ``out_dir`` should be on a shared file system.
        criterion: ``criterion(output, target) -> loss`` (default: cross-entropy of the logits); local only.
        timeout_s: limit for the whole run, s.
        on_epochs: called from a thread with every epoch's row so far each time an epoch ends (and once at the
            end), e.g. to log them live (:func:`pipedream.runtime.launch.following`).
        max_restarts: torchrun only: restart the job up to this many times when a worker fails (torchrun's
            ``--max-restarts``); it resumes from the newest complete checkpoint (``config.checkpoint``;
            docs/checkpoints.md), each restart noted in ``<out_dir>/restarts.json``.
        runtime: the pipeline's runtime, ``"pipedream"`` (ours) or ``"torch"`` (torch.distributed.pipelining's schedule
            classes on the plan's stages, docs/torch-runtime.md; the plan's schedule and microbatches unless
            ``config`` names one of torch's); None: ``config.runtime``.
    Returns:
        one row per epoch (``train_loss``, ``val_accuracy``, ``epoch_time_s``, ...), as in ``metrics.json``
        (empty on a node of a multi-node run that does not see rank 0's ``metrics.json``).
    Raises:
        PipeDreamError: bad settings (named), a plan that does not fit the model or the workers, or a worker
            that failed (one line: its rank and reason), or the timeout. No worker is left running.
    """
    from pipedream.runtime import launch as L

    if mode not in ("pipedream", "dp"):
        raise PipeDreamError(f"unknown mode {mode!r}; use 'pipedream' or 'dp'")
    cfg = _worker_config(model, datasets, config or TrainConfig(), criterion, launcher, nnodes)
    cfg.runtime = runtime or cfg.runtime
    if plan is None and cfg.plan:
        plan = cfg.plan
    plan_obj = Plan.load(Path(plan)) if isinstance(plan, (str, Path)) else plan
    if plan_obj is not None:
        from pipedream.runtime.config import plan_schedule

        plan_schedule(cfg, plan_obj.extra)  # --runtime torch: the plan's schedule and microbatches by default
    count = workers if workers is not None else plan_obj.workers if plan_obj is not None else 1
    if count < 1 or timeout_s <= 0:
        raise PipeDreamError(f"workers ({count}) and timeout_s ({timeout_s:g}) must be positive")
    if max_restarts < 0 or (max_restarts and launcher != "torchrun"):
        raise PipeDreamError(f"max_restarts={max_restarts}: restarts are torchrun's (its elastic agent); give a "
                             "number >= 0 with launcher='torchrun'")
    if plan_obj is not None and plan_obj.workers != count:
        raise PipeDreamError(f"the plan is for {plan_obj.workers} workers, not {count}; start {plan_obj.workers} "
                             f"workers or plan for a cluster of {count}")
    L.check_nodes(count, nnodes, rdzv_endpoint)
    cfg.validate()
    out_dir = cfg.run_dir(mode)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg.out_dir, cfg.plan = str(out_dir), None  # DP workers take no plan
    if plan_obj is not None and mode == "pipedream":
        if isinstance(plan, (str, Path)):
            cfg.plan = str(plan)
        else:  # the workers read it from the run's folder
            plan_obj.save(out_dir / "plan.json")
            cfg.plan = str(out_dir / "plan.json")
    metrics = out_dir / "metrics.json"
    with L.following(metrics, on_epochs):
        if launcher == "torchrun":
            entry = L.DP_MODULE if mode == "dp" else L.TORCH_WORKER_MODULE if cfg.runtime == "torch" else L.WORKER_MODULE
            cmd = L.torchrun_command(entry, cfg, count, nnodes, rdzv_endpoint, run_id=cfg.model,
                                     max_restarts=max_restarts)
            L.run_torchrun(cmd, out_dir, timeout_s, max_restarts)
        else:
            if mode == "dp":
                from pipedream.baselines.ddp import train as fn
            elif cfg.runtime == "torch":
                from pipedream.runtime.torch_worker import train as fn
            else:
                from pipedream.runtime.worker import train as fn
            L.spawn_local(cfg, count, fn=fn, timeout_s=timeout_s)
    if metrics.is_file():
        return json.loads(metrics.read_text())
    if nnodes > 1:  # rank 0 ran on another node, which does not share out_dir
        return []
    raise PipeDreamError(f"workers finished but wrote no {metrics}"
                         + (f"; see {out_dir / 'train.log'}" if launcher == "torchrun" else ""))


def _worker_config(model: nn.Module | str, datasets: tuple[Any, Any] | None, config: TrainConfig,
                   criterion: Callable[[Any, torch.Tensor], torch.Tensor] | None, launcher: str,
                   nnodes: int) -> TrainConfig:
    """A copy of ``config`` that names or carries ``model`` (and ``datasets``, ``criterion``) for ``launcher``'s
    workers: a module and Python objects only go to local workers, pickled (:func:`_pack`).

    Raises:
        PipeDreamError: an unknown launcher, a module without datasets, Python objects or several nodes for the
            launcher that cannot take them.
    """
    from pipedream.runtime.launch import LAUNCHERS

    if launcher not in LAUNCHERS:
        raise PipeDreamError(f"unknown launcher {launcher!r}; use one of {', '.join(map(repr, LAUNCHERS))}")
    cfg = replace(config, criterion=criterion if criterion is not None else config.criterion)
    objects = not isinstance(model, str) or datasets is not None or cfg.model_factory or cfg.datasets or cfg.criterion
    if launcher == "torchrun" and objects:
        raise PipeDreamError("torchrun's workers build the model and its data from their names: give a registered "
                             "model or 'package.module:function' and no datasets or criterion, or launcher='local'")
    if launcher == "local" and nnodes != 1:
        raise PipeDreamError(f"nnodes={nnodes}: several nodes need launcher='torchrun'")
    if isinstance(model, str):
        cfg.model = model
    else:
        if datasets is None:
            raise PipeDreamError("a model given as a module needs datasets=(train, val)")
        cfg.model_factory = functools.partial(_unpack, _pack(model), 0)
        if cfg.model == TrainConfig.model:  # the registry's default name: this is the caller's own model
            cfg.model = "model"
    if datasets is not None:
        cfg.datasets = functools.partial(_unpack, _pack(tuple(datasets)), 0)
    return cfg
