"""Check an experiment config before any work starts: YAML syntax, the schema, known models and
cluster, workers that match the cluster, thresholds on metrics the models have, models whose weights,
gradients and optimizer state fit a device (the DP baseline holds them all on each worker), and data each
model can train on. `make run` calls this first,
so a mistake costs one clear line (exit status 2) instead of a half-run workflow.

With --model, check one model instead, in seconds: build it, take one sample of its data, capture it,
run one forward (in evaluation mode: batch norm cannot normalise a batch of one), loss and backward, and
print the layers the planner may cut between, with their parameter and activation bytes (per sample), and
the parameters several layers share."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from pipedream.paths import CI_CONFIG

HELP = "validate an experiment config, or (--model) run one sample through a model and list its layers"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``pipedream check``."""
    p.add_argument("--config", default=CI_CONFIG,
                   help="experiment config (YAML; a relative path not found here is looked up in the checkout)")
    p.add_argument("--model",
                   help="check this model instead of a config (registered, or package.module:function): one forward "
                        "and backward on one sample of its data, then its layers, parameter and activation bytes")
    p.add_argument("--preset", default="reduced", choices=("reduced", "full"), help="with --model: model size")
    p.add_argument("--granularity", default="layer", choices=("layer", "op"), help="with --model: what a node is")
    p.add_argument("--data", choices=("real", "synthetic"),
                   help="check as if the config's top-level data key were this (what `snakemake --config data=...` "
                        "sets); a model's own train.data still wins")
    p.add_argument("--missing-data", choices=("error", "warn"), default="error",
                   help="a real data set whose environment variable is unset on this machine: refuse (default) or "
                        "print a warning (dry runs on a machine that will not train)")


# full-size real data sets found through the environment, by model task (registered models only)
DATA_ENV = {"image_classification": ("PIPEDREAM_IMAGENET", "ImageNet"),
            "translation": ("PIPEDREAM_WMT16", "WMT16 En-De")}


def data_problem(name: str, spec: Any, preset: str, data: str) -> tuple[str, bool] | None:
    """(message, fatal) when model ``name`` cannot get its ``data`` at ``preset`` here, else None.

    Fatal: data that no machine has (synthetic data for a model without a synthetic hook, full-size S2VT
    on real data). Not fatal: a data set whose environment variable is unset on this machine.
    """
    if data == "synthetic":
        if getattr(spec, "synthetic", None) is None:
            return f"models.{name}: no synthetic data for this model; set its train.data: real", True
        return None
    if preset != "full" or ":" in name:
        return None
    if spec.task == "video_captioning":
        return (f"models.{name}: full-size S2VT has no real data (no MSVD loader); set data: synthetic (top level or "
                f"models.{name}.train.data) or drop the model", True)
    var, what = DATA_ENV.get(spec.task, ("", ""))
    if var and var not in os.environ:
        return (f"models.{name}: preset full trains on {what}: set ${var}, or use data: synthetic (top level or "
                f"models.{name}.train.data)", False)
    return None


def dp_memory_problem(name: str, model_cfg: dict[str, Any], cluster: Any) -> str | None:
    """Why the DP baseline of model ``name`` cannot train on ``cluster``'s devices, or None if it can.

    Every DP worker holds the whole model: its weights, gradients and optimizer state, the exact part of the
    memory model (:func:`pipedream.memory.stage_memory`, the run's optimizer and momentum from
    ``model_cfg["train"]``), counted from the model built on the meta device (no memory, no time). Table 1
    trains DP beside PipeDream, so a model whose state alone exceeds ``cluster.device_memory_bytes`` is
    refused before any profile is taken.
    """
    import torch

    from pipedream import memory
    from pipedream.models import build_model

    preset = model_cfg["preset"]
    train = model_cfg.get("train") or {}
    optimizer, momentum = train.get("optimizer", "sgd"), float(train.get("momentum", 0.9))
    with torch.device("meta"):
        model = build_model(name, preset, 0)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    need = memory.stage_memory(param_bytes, 0, 0, schedule="dp", in_flight_count=1, optimizer=optimizer,
                               momentum=momentum, hidden_bytes=_hidden_bytes(name, preset, model, optimizer)).total
    if need <= cluster.device_memory_bytes:
        return None
    return (f"{name} ({preset}) holds {memory.format_bytes(need)} of weights, gradients and {optimizer} state on "
            f"every DP worker, more than a device of cluster {cluster.name!r} has "
            f"({memory.format_bytes(cluster.device_memory_bytes)}); use a cluster with more device memory")


def _hidden_bytes(name: str, preset: str, model: Any, optimizer: str) -> float | None:
    """Bytes of ``model``'s hidden matrices (:func:`pipedream.runtime.optim.hidden_matrices`, found by a forward on
    the meta device) for ``--optimizer muon``, else None; 0 (Muon's state counted as Adam's, an upper bound) for a
    model whose forward the meta device cannot run (GNMT's packed LSTMs)."""
    if optimizer != "muon":
        return None
    from pipedream.capture import to_device
    from pipedream.models import example_input
    from pipedream.runtime.optim import hidden_matrices

    try:
        hidden = hidden_matrices(model, to_device(example_input(name, 1, preset, 0), "meta"))
    except (NotImplementedError, RuntimeError):
        return 0.0
    return float(sum(p.numel() * p.element_size() for p in hidden))


def twobw_problem(cfg: dict[str, Any]) -> str | None:
    """What is wrong with a config's ``twobw:`` section (PipeDream-2BW's table, experiments/2bw.yaml), or None: its
    model must be one of ``models``, its depth divide the workers, its microbatch divide the model's batch into
    whole microbatches for every pipeline."""
    tb = cfg.get("twobw")
    if tb is None:
        return None
    if tb["model"] not in cfg["models"]:
        return f"twobw.model: {tb['model']!r} is not one of models ({', '.join(cfg['models'])}); add it there"
    if cfg["workers"] % tb["depth"]:
        return f"twobw.depth: {tb['depth']} does not divide workers: {cfg['workers']}; use a divisor"
    width = cfg["workers"] // tb["depth"]
    batch = cfg["models"][tb["model"]]["train"]["batch_size"]
    if batch % (tb["microbatch"] * width):
        return (f"twobw.microbatch: models.{tb['model']}.train.batch_size {batch} is not a multiple of microbatch "
                f"{tb['microbatch']} x {width} pipelines; change one of them")
    return None


def check_model(name: str, preset: str = "reduced", granularity: str = "layer", data: str = "real") -> list[str]:
    """The report of ``pipedream check --model``: lines to print.

    Raises:
        PipeDreamError: the model does not build, capture, or run on its data (naming the layer), or its loss
            does not reach a parameter.
    """
    import time

    from pipedream.capture import describe, first_line, flat_inputs, run_graph, shapes, tensors
    from pipedream.errors import PipeDreamError
    from pipedream.runtime import shared, split
    from pipedream.runtime.config import TrainConfig
    from pipedream.runtime.task import load_task

    t0 = time.perf_counter()
    task = load_task(TrainConfig(model=name, preset=preset, data=data, train_subset=8, val_subset=8))
    model = task.model
    x, y = task.train.batch([0])
    # one sample, in evaluation mode: batch norm on its running statistics (a batch of one has no spread)
    gm = split.trace(model, granularity, x, training=False).eval()
    ids = split.node_ids(gm)
    values: dict = {}
    out = run_graph(gm, flat_inputs(x), ids, values)
    try:
        loss = task.criterion(out, y)
        loss.backward()
    except PipeDreamError:
        raise
    except Exception as e:  # the loss of the model's output against its data's targets
        raise PipeDreamError(f"the loss fails on the output ({shapes(out)}) and target ({shapes(y)}): "
                             f"{first_line(e)}") from None
    params = dict(model.named_parameters())
    unused = [n for n, p in params.items() if p.requires_grad and p.grad is None]
    elapsed = time.perf_counter() - t0
    ops = [n for n in gm.graph.nodes if n.op in split.OPS]
    how = gm.meta.get("captured_by", "torch.fx (one layer per child of the nn.Sequential)"
                      if granularity == "layer" else "torch.fx")
    total = sum(p.numel() * p.element_size() for p in params.values())
    lines = [f"{name}: {len(ops)} layers captured by {how}; {len(params)} parameters, {total / 2**20:.2f} MiB; "
             f"one sample's forward and backward in {elapsed:.1f} s (loss {float(loss.detach()):.4f})",
             f"{'node':>8}  {'param bytes':>12}  {'activation bytes':>16}  layer"]
    for n in ops:
        acts = sum(t.numel() * t.element_size() for t in tensors(values.get(n)))
        held = (sum(p.numel() * p.element_size() for p in gm.get_submodule(str(n.target)).parameters())
                if n.op == "call_module" else 0)
        lines.append(f"{ids[n]:>8}  {held:>12,}  {acts:>16,}  {describe(gm, n)[:90]}")
    one = split.split(gm, [[ids[n]] for n in ops], x).modules  # one stage per layer: who reads what
    lines += [f"shared: {sh.names[0]} is read by layers {', '.join(ids[ops[s]] for s in sh.stages)}; the stages "
              "that hold it sum its gradients before each step" for sh in shared.find(one)]
    if unused:
        lines.append(f"warning: {len(unused)} parameters get no gradient from the loss: {', '.join(unused[:5])}")
    return lines


def run(args: argparse.Namespace) -> int:
    """Validate; raises PipeDreamError on the first problem, prints a summary and returns 0 otherwise."""
    if getattr(args, "model", None):
        print("\n".join(check_model(args.model, args.preset, args.granularity, args.data or "real")))
        return 0
    from pipedream.errors import PipeDreamError
    from pipedream.experiment import load_config, model_data
    from pipedream.paths import CLUSTERS, shipped
    from pipedream.topology import get_cluster

    cfg = load_config(args.config)
    if getattr(args, "data", None):
        cfg["data"] = args.data
    from pipedream.models import get_spec  # imports torch: only once the file itself is known to be good

    specs = {name: get_spec(name) for name in cfg["models"]}  # raises on an unknown model, listing the known ones
    clusters_file = cfg.get("clusters_file", CLUSTERS)
    cluster = get_cluster(cfg["cluster"], clusters_file)
    if cluster.workers != cfg["workers"]:
        raise PipeDreamError(f"{args.config}: workers: {cfg['workers']} but cluster {cfg['cluster']!r} has "
                             f"{cluster.workers} workers; make them agree")
    if not shipped(cfg["paper_table"]).is_file():
        raise PipeDreamError(f"{args.config}: paper_table {cfg['paper_table']} not found")
    from pipedream.experiment import SCORED_METRICS

    for name, spec in specs.items():
        metric = (cfg["models"][name].get("threshold") or {}).get("metric")
        if metric in SCORED_METRICS and metric != spec.metric:
            raise PipeDreamError(f"{args.config}: models.{name}.threshold.metric: {name} is scored with "
                                 f"{spec.metric!r}, not {metric!r}; use {spec.metric!r} or token_accuracy")
    problem = twobw_problem(cfg)
    if problem is not None:
        raise PipeDreamError(f"{args.config}: {problem}")
    for name in specs:
        problem = dp_memory_problem(name, cfg["models"][name], cluster)
        if problem is not None:
            raise PipeDreamError(f"{args.config}: {problem}")
    for name, spec in specs.items():
        problem = data_problem(name, spec, cfg["models"][name]["preset"], model_data(cfg, name))
        if problem is None:
            continue
        message, fatal = problem
        if fatal or getattr(args, "missing_data", "error") == "error":
            raise PipeDreamError(f"{args.config}: {message}")
        print(f"warning: {args.config}: {message}", file=sys.stderr)
    print(f"{args.config}: ok ({len(cfg['models'])} models on {cfg['cluster']}, {cfg['workers']} workers)")
    return 0
