"""Profile a registered model layer by layer (forward and backward seconds, activation and
parameter bytes) and write graph.txt in the original PipeDream format, plus graph.json and meta.json."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipedream.allocator import keep_freed_memory
from pipedream.runtime.config import OPTIMIZERS

HELP = "profile a model per layer and write graph.txt"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``pipedream profile``."""
    p.add_argument("--model", required=True,
                   help="registered model name (e.g. vgg16) or package.module:function (docs/your-own-model.md)")
    p.add_argument("--preset", default="reduced", choices=["reduced", "full"], help="model size")
    p.add_argument("--profiled-batch", type=int, default=32,
                   help="samples in the profiled minibatch (written to meta.json, where plan and simulate read it)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="device to profile on")
    p.add_argument("--warmup", type=int, default=2, help="untimed runs per layer")
    p.add_argument("--iters", type=int, default=5, help="timed runs per layer (their median is kept)")
    p.add_argument("--threads", type=int, default=1,
                   help="CPU threads to time with (torch.set_num_threads); default 1, what every `pipedream train` "
                        "worker runs with (OMP_NUM_THREADS=1), so the profile times what the workers compute at")
    p.add_argument("--isolated", action="store_true",
                   help="keep each layer's time alone (timed over and over on its own inputs, its weights warm in the "
                        "caches), as the release's profiler did. Default on the CPU: each layer's time inside whole "
                        "training steps, where the layers before it have evicted its data (pipedream/in_situ.py), "
                        "the times alone kept in graph.json (isolated_fwd_s, isolated_bwd_s)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and input")
    p.add_argument("--data", choices=["real", "synthetic"], default=None,
                   help="what the profiled minibatch is: real: the first minibatch a run trains on (epoch 1's "
                        "order from --seed) of the model's data set, so padding and sequence lengths are the "
                        "run's; synthetic: random samples of its shapes (pipedream.data.synthetic). Default: real "
                        "for --preset reduced, synthetic for full (the shipped data sets are reduced-size)")
    p.add_argument("--granularity", default="layer", choices=["layer", "op"],
                   help="layer: one node per layer of the model's sequence (blocks stay whole; the workflow's default); "
                        "op: every torch.fx operation, a DAG with skip connections as branches. plan and "
                        "train accept both: the runtime cuts the model with torch.fx at the plan's nodes")
    p.add_argument("--optimizers", nargs="+", default=list(OPTIMIZERS), choices=OPTIMIZERS, metavar="OPT",
                   help="optimizers whose step to time (meta.json optimizer_step_s_per_param_byte, the step a "
                        "prediction charges a run): any of %(choices)s. A run with an optimizer the "
                        "profile did not time is predicted without its step (a warning says so). The workflow "
                        "passes the optimizers its runs train with: Muon's step takes seconds on a CPU. "
                        "SGD's and Adam's step is also timed over 1 and 64 one-element tensors: seconds per call and "
                        "per tensor (meta.json optimizer_step_overheads), the rate per byte the rest of the step")
    p.add_argument("--out-dir", type=Path, required=True, help="folder for graph.txt, graph.json, meta.json")


def runtime_step(model: Any, criterion: Callable[[Any, Any], Any], xs: Any, ys: Any) -> Callable[[], None]:
    """One whole training step as a worker runs its stage: the forward on leaf aliases of the weights (a weight
    version, :mod:`pipedream.runtime.versions`) through ``torch.func.functional_call``, the loss, the gradients
    with ``torch.autograd.grad``, and each gradient added into a buffer of its own kept across steps (the
    returned function's ``grads``, in the order of ``model.named_parameters()`` that require a gradient), as a
    worker adds it to its master gradient (:meth:`pipedream.runtime.executor.StageExecutor._do_b`) and DDP's
    backward into ``.grad``: the add is one more pass over the gradients' bytes, part of every step. The buffers
    are never zeroed: in a run the optimizer step zeroes them, and its time is the profile's optimizer-step rate
    (:mod:`pipedream.step_rates`). ``run.grads`` are the buffers."""
    import torch

    from pipedream.capture import call_args

    aliases = {n: p.detach().requires_grad_(p.requires_grad) for n, p in model.named_parameters()}
    args_, kwargs_ = call_args(xs)
    needed = [t for t in aliases.values() if t.requires_grad]
    grads = [torch.zeros_like(t) for t in needed]

    def run() -> None:
        loss = criterion(torch.func.functional_call(model, aliases, args_, kwargs_), ys)
        for buffer, g in zip(grads, torch.autograd.grad(loss, needed, allow_unused=True), strict=True):
            if g is not None:
                buffer.add_(g)

    run.grads = grads  # type: ignore[attr-defined]
    return run


def run(args: argparse.Namespace) -> int:
    """Profile and write; returns 0."""
    import torch

    from pipedream.api import profile
    from pipedream.capture import to_device
    from pipedream.data.fashion_mnist import minibatch_indices
    from pipedream.errors import PipeDreamError
    from pipedream.models import get_spec
    from pipedream.profiler import ProfileSettings, data_load_s, noise_warning, noisy_layers, whole_step_s, write_profile
    from pipedream.runtime.config import TrainConfig
    from pipedream.runtime.task import load_task
    from pipedream.step_rates import optimizer_step_rates, split_step, step_overheads, trainable_bytes, trainable_tensors

    spec = get_spec(args.model)
    if args.profiled_batch < 1 or args.iters < 1 or args.warmup < 0 or args.threads < 1:
        raise PipeDreamError("--profiled-batch, --iters and --threads must be >= 1 and --warmup >= 0")
    keep_freed_memory()  # the allocator the workers run with (pipedream/allocator.py)
    torch.set_num_threads(args.threads)
    data = args.data or ("real" if args.preset == "reduced" else "synthetic")
    cfg = TrainConfig(model=args.model, preset=args.preset, seed=args.seed, data=data, batch_size=args.profiled_batch)
    task = load_task(cfg)
    if len(task.train) < args.profiled_batch:
        raise PipeDreamError(f"{args.model}'s {data} training set has {len(task.train)} samples, fewer than "
                             f"--profiled-batch {args.profiled_batch}; give a smaller --profiled-batch")
    rows = minibatch_indices(len(task.train), args.profiled_batch, args.seed, 0)[0]
    x, y = (to_device(t, args.device) for t in task.train.batch(rows))
    settings = ProfileSettings(warmup=args.warmup, iters=args.iters, device=args.device)
    phases: dict[str, float] = {}  # wall seconds of each part of the profile, printed at the end
    clock = [time.perf_counter()]

    def lap(name: str) -> None:
        now = time.perf_counter()
        phases[name], clock[0] = now - clock[0], now

    graph = profile(task.model, x, y, task.criterion, granularity=args.granularity, warmup=args.warmup,
                    iters=args.iters, device=args.device, name=args.model, in_situ=not args.isolated)
    noise = noise_warning(graph)
    if noise:
        print(f"warning: {noise}", file=sys.stderr)
    lap("layers")
    rates = optimizer_step_rates(task.model, x, settings, list(dict.fromkeys(args.optimizers)))
    overheads = step_overheads(task.model, x, settings, list(rates))  # per call and per tensor, SGD's and Adam's
    param_bytes, tensors = trainable_bytes(task.model), trainable_tensors(task.model)  # what a step walks
    lap("optimizer steps")
    data_s = data_load_s(lambda: task.train.batch(rows), settings)

    step = runtime_step(task.model, task.criterion, x, y)
    step_s = whole_step_s(step, ProfileSettings(warmup=max(2, args.warmup), iters=max(20, args.iters),
                                                device=args.device))  # a step is noisier than a layer
    t = graph.totals()
    print(f"{args.model}: a whole training step takes {step_s * 1e3:.1f} ms, "
          f"{step_s / (t['fwd_s'] + t['bwd_s']):.2f}x its layers' sum")
    lap("data and whole step")
    # a step's calls and tensors apart from its bytes (pipedream.step_rates.split_step): the whole model's step stays
    # the time just taken, a stage's is its share of the three
    split = {}
    for name, (call_s, tensor_s) in overheads.items():
        call_s, tensor_s, rates[name] = split_step(rates[name] * param_bytes, param_bytes, tensors, call_s, tensor_s)
        split[name] = {"s_per_call": call_s, "s_per_tensor": tensor_s}
        print(f"{args.model}: {name}'s step costs {call_s * 1e3:.2f} ms a call + {tensor_s * 1e6:.1f} us a tensor "
              f"({tensors} tensors) + {rates[name] * 2**20 * 1e3:.2f} ms/MiB")
    meta = {"model": spec.name, "preset": args.preset, "device": args.device, "warmup": args.warmup,
            "iters": args.iters, "layer_times": "isolated" if args.isolated or args.device == "cuda" else "in situ",
            "granularity": args.granularity, "threads": args.threads, "data": data,
            "loss": "in the output node", "data_s": data_s, "whole_step_s": step_s,
            "optimizer_step_s_per_param_byte": rates, "optimizer_step_overheads": split,
            "profiled_at_unix_s": time.time(),
            "noisy_layers": {nid: round(r, 3) for nid, r in noisy_layers(graph)}}
    write_profile(graph, args.out_dir, meta)
    print(f"{args.model}: {len(graph.nodes)} nodes, fwd {t['fwd_s'] * 1e3:.1f} ms + bwd {t['bwd_s'] * 1e3:.1f} ms "
          f"per minibatch of {args.profiled_batch}, {t['param_bytes'] / 2**20:.2f} MiB parameters -> {args.out_dir}/graph.txt")
    if t["bwd_s"] > 0:
        halves = sum(sum(graph.backward_split(n)) for n in graph.nodes)
        print(f"{args.model}: the backward's halves timed apart, I + W = {halves / t['bwd_s']:.2f} x the whole "
              "backward (per layer in graph.json: input_grad_s, weight_grad_s)")
    print(f"{args.model}: profiled in {sum(phases.values()):.0f} s after loading ("
          + ", ".join(f"{name} {s:.1f} s" for name, s in phases.items()) + ")")
    return 0
