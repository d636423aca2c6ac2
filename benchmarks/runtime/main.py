"""Samples/s of our runtime's schedules vs ``torch.distributed.pipelining`` on the same partition.

One run forks ``--workers`` gloo processes; every process builds the same model (same seed), keeps
the same stage of one straight partition (balanced by measured per-layer time unless ``--plan`` is
given) and then, in turn and separated by barriers, trains ``--steps`` x ``--microbatches`` units of
``--batch-size`` samples with:

* ours-1F1B: PipeDream 1F1B with weight stashing (an optimizer step per minibatch per stage),
* ours-GPipe: our GPipe schedule (flush every ``--microbatches``),
* torch-1F1B: ``torch.distributed.pipelining.Schedule1F1B`` (flush every ``--microbatches``),
* torch-GPipe: ``torch.distributed.pipelining.ScheduleGPipe``.

Inputs are fixed random tensors (data loading excluded for all). Rank 0 prints samples/s and the
ratios of ours-1F1B to the others. Usage (from the repository root)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/runtime/main.py --model vgg16 --workers 4
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from pipedream import schedules
from pipedream.plan import Plan
from pipedream.runtime import distributed as D
from pipedream.runtime.comm import P2P
from pipedream.runtime.executor import StageData, StageExecutor
from pipedream.runtime.launch import free_port
from pipedream.runtime.stage import boundary_shapes, build_stage, stage_layer_ranges, straight_plan
from pipedream.runtime.versions import Policy, WeightVersions


def build(model: str, seed: int) -> nn.Sequential:
    """A registry model at the reduced preset, or ``package.module:function``."""
    torch.manual_seed(seed)
    if ":" in model:
        mod, _, fn = model.partition(":")
        return getattr(importlib.import_module(mod), fn)()
    from pipedream.models import build_model

    return build_model(model, "reduced", seed)


def balanced_plan(model: nn.Sequential, stages: int, x: torch.Tensor) -> Plan:
    """Contiguous split of the layers into ``stages`` minimising the slowest stage (measured fwd+bwd)."""
    times = []
    for layer in model:
        x = x.detach().requires_grad_()
        for k in range(3):
            t0 = time.perf_counter()
            y = layer(x)
            if y.requires_grad:
                y.sum().backward()
            if k == 2:
                times.append(time.perf_counter() - t0)
        x = y.detach()
    n = len(times)
    prefix = [0.0]
    for t in times:
        prefix.append(prefix[-1] + t)
    # best[k][i]: minimal bottleneck of the first i layers in k stages; cut[k][i]: start of the last stage
    best = [[float("inf")] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                b = max(best[k - 1][j], prefix[i] - prefix[j])
                if b < best[k][i]:
                    best[k][i], cut[k][i] = b, j
    sizes, i = [], n
    for k in range(stages, 0, -1):
        sizes.append(i - cut[k][i])
        i = cut[k][i]
    return straight_plan("bench", n, sizes[::-1])


def _timed(fn) -> float:  # type: ignore[no-untyped-def]
    D.barrier(120.0)
    t0 = time.perf_counter()
    fn()
    D.barrier(120.0)
    return time.perf_counter() - t0


def _ours(args: argparse.Namespace, plan: Plan, schedule: str, x: torch.Tensor, y: torch.Tensor) -> float:
    rank = dist.get_rank()
    model = build(args.model, args.seed)
    s = plan.stage_of_rank(rank)
    shapes = boundary_shapes(model, plan, x[:1])
    module = build_stage(model, plan, s)
    m = args.microbatches
    policy = Policy.STASH if schedule == "1f1b" else Policy.FLUSH
    versions = WeightVersions(module, policy)
    opt = torch.optim.SGD(versions.master, lr=args.lr, momentum=0.9)
    ex = StageExecutor(s, len(plan.stages), module, versions, opt, P2P(120.0, torch.device("cpu")),
                       shapes[s - 1] if s > 0 else None, shapes[s], timeout_s=120.0)
    data = StageData(lambda mb, j: x, lambda mb, j: y)
    units = args.steps * m

    def run(n: int) -> None:
        if schedule == "1f1b":
            sched = schedules.build("1f1b", [1] * len(plan.stages), n)
        else:
            sched = schedules.build("gpipe", [1] * len(plan.stages), n // m, m)
        ex.run(sched.order[rank], sched, data, args.batch_size)

    run(m)  # warm-up
    return units * args.batch_size / _timed(lambda: run(units))


def _torch(args: argparse.Namespace, plan: Plan, kind: str, x: torch.Tensor, y: torch.Tensor) -> float:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    rank = dist.get_rank()
    s = plan.stage_of_rank(rank)
    module = copy.deepcopy(build_stage(build(args.model, args.seed), plan, s))
    stage = PipelineStage(module, s, len(plan.stages), torch.device("cpu"))
    cls = Schedule1F1B if kind == "1f1b" else ScheduleGPipe
    sched = cls(stage, args.microbatches, loss_fn=F.cross_entropy)
    opt = torch.optim.SGD(module.parameters(), lr=args.lr, momentum=0.9)
    big_x = x.repeat(args.microbatches, *[1] * (x.dim() - 1))
    big_y = y.repeat(args.microbatches)
    last = s == len(plan.stages) - 1

    def step() -> None:
        opt.zero_grad()
        if s == 0:
            sched.step(big_x)
        elif last:
            sched.step(target=big_y, losses=[])
        else:
            sched.step()
        opt.step()

    def run() -> None:
        for _ in range(args.steps):
            step()

    step()  # warm-up (and shape inference)
    return args.steps * args.microbatches * args.batch_size / _timed(run)


def _child(index: int, args: argparse.Namespace, plan: Plan, port: int) -> None:
    os.environ.update({"RANK": str(index), "WORLD_SIZE": str(args.workers), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port)})
    D.init(120.0)
    x = torch.randn(args.batch_size, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 10, (args.batch_size,), generator=torch.Generator().manual_seed(2))
    results = {
        "ours-1F1B": _ours(args, plan, "1f1b", x, y),
        "ours-GPipe": _ours(args, plan, "gpipe", x, y),
        "torch-1F1B": _torch(args, plan, "1f1b", x, y),
        "torch-GPipe": _torch(args, plan, "gpipe", x, y),
    }
    if index == 0:
        _report(args, plan, results)
    dist.destroy_process_group()


def _report(args: argparse.Namespace, plan: Plan, results: dict[str, float]) -> None:
    ranges = [list(r) for r in stage_layer_ranges(plan, sum(len(s.nodes) for s in plan.stages))]
    print(f"model {args.model}, {args.workers} stages (layers {[f'{r[0]}-{r[-1]}' for r in ranges]}), "
          f"{args.steps} x {args.microbatches} units of {args.batch_size} samples")
    for name, sps in results.items():
        print(f"  {name:<12} {sps:8.1f} samples/s")
    ours = results["ours-1F1B"]
    ratios = {f"ours-1F1B / {k}": ours / v for k, v in results.items() if k != "ours-1F1B"}
    for k, v in ratios.items():
        print(f"  {k:<26} {v:5.2f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                        "samples_per_s": results, "ratios": ratios}, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vgg16", help="registry model (reduced preset) or package.module:fn")
    parser.add_argument("--workers", type=int, default=4, help="pipeline stages = processes")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per (micro)batch")
    parser.add_argument("--microbatches", type=int, default=8, help="microbatches per torch/GPipe step")
    parser.add_argument("--steps", type=int, default=4, help="timed steps of --microbatches units")
    parser.add_argument("--lr", type=float, default=0.001)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plan", type=Path, help="plan JSON (straight); default: balanced by measured time")
    parser.add_argument("--out", type=Path, help="also write the numbers as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = build(args.model, args.seed)
    plan = Plan.load(args.plan) if args.plan else balanced_plan(model, args.workers, torch.randn(args.batch_size, 3, 32, 32))
    importlib.import_module("torch._dynamo")  # optimizers import it lazily; once here, before forking

    mp.start_processes(_child, args=(args, plan, free_port()), nprocs=args.workers, start_method="fork")


if __name__ == "__main__":
    main()
