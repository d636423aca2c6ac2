"""Samples/s of our runtime's schedules vs ``torch.distributed.pipelining`` on the same partition.

One run starts ``--workers`` gloo processes on the CPU (from a fork server, so a CUDA machine works
too); every process builds the same model (same seed), keeps
the same stage of one straight partition (balanced by measured per-layer time unless ``--plan`` is
given) and then, in turn and separated by barriers, trains ``--steps`` x ``--microbatches`` units of
``--batch-size`` samples with:

* ours-1F1B: PipeDream 1F1B with weight stashing (an optimizer step per minibatch per stage),
* ours-GPipe: our GPipe schedule (flush every ``--microbatches``),
* torch-1F1B: ``torch.distributed.pipelining.Schedule1F1B`` (flush every ``--microbatches``),
* torch-GPipe: ``torch.distributed.pipelining.ScheduleGPipe``.

Inputs are fixed random tensors of the model's input shape (data loading excluded for all). Rank 0 prints samples/s and the
ratios of ours-1F1B to the others.

In the same run, before the timed runs, each rank times its own stage alone (ranks take turns,
separated by barriers; ``--time-together``: all at once): forward (the last stage's includes the loss), backward, and the update
(optimizer step plus one copy of the weights, the new weight version our executor commits), the mean
of ``--time-reps`` repetitions after a warm-up; plus the bytes leaving the stage per unit. Rank 0 and
1 measure the gloo loopback bandwidth with a ping-pong of ``--link-mb`` MB (or ``--link-Bps`` is
taken). Rank 0 then event-simulates (:mod:`pipedream.sim.engine`) exactly the action lists ours-1F1B
and ours-GPipe executed, with those stage costs on a one-level cluster of ``--workers`` ranks joined
at that bandwidth, and prints predicted vs measured samples/s. Usage (from the repository root)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/runtime/main.py --model vgg16 --workers 4
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from pipedream import schedules
from pipedream.plan import Plan
from pipedream.runtime import distributed as D
from pipedream.runtime.comm import P2P
from pipedream.runtime.config import TrainConfig
from pipedream.runtime.executor import StageData, StageExecutor
from pipedream.runtime.launch import free_port, start_method
from pipedream.runtime.optim import make_optimizer
from pipedream.runtime.stage import Boundary, build_stages, stage_layer_ranges, straight_plan
from pipedream.runtime.versions import Policy, WeightVersions
from pipedream.sim.costs import measured_costs
from pipedream.sim.engine import run as simulate
from pipedream.sim.network import Network
from pipedream.topology import Cluster


def build(model: str, seed: int) -> nn.Sequential:
    """A registry model at the reduced preset, or ``package.module:function``."""
    torch.manual_seed(seed)
    if ":" in model:
        mod, _, fn = model.partition(":")
        return getattr(importlib.import_module(mod), fn)()
    from pipedream.models import build_model

    return build_model(model, "reduced", seed)


def example_batch(model: str, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed (input, target) minibatch: the registry model's synthetic data at the reduced preset (its
    real shapes and label ranges, e.g. AlexNet's 3x64x64 images, GNMT's packed token pairs), else
    3x32x32 images of 10 classes."""
    if ":" in model:
        g = torch.Generator().manual_seed(1)
        return torch.randn(batch_size, 3, 32, 32, generator=g), torch.randint(0, 10, (batch_size,), generator=g)
    from pipedream.data.synthetic import synthetic_datasets
    from pipedream.models import get_spec

    train, _ = synthetic_datasets(get_spec(model).synthetic("reduced"), batch_size, 1, seed=1)
    return train.batch(range(batch_size))


def criterion(model: str):  # type: ignore[no-untyped-def]
    """The model's loss (the registry's ``criterion``; cross-entropy over classes otherwise)."""
    if ":" in model:
        return F.cross_entropy
    from pipedream.models import get_spec

    return get_spec(model).criterion


# torch.distributed.pipelining fails on these (torch 2.x, gloo): AWD-LM's backward receive raises
# "input tensor has to be contiguous" inside its _batch_p2p
TORCH_FAILS = ("awd_lm",)


def torch_runnable(name: str, model: nn.Sequential, plan: Plan, x: torch.Tensor) -> bool:
    """Whether ``torch.distributed.pipelining`` can run this partition here: one floating-point tensor
    crosses every stage boundary (GNMT's and S2VT's boundaries carry tuples with integer ids), and the
    model is not one it is known to fail on (:data:`TORCH_FAILS`)."""
    return name not in TORCH_FAILS and all(len(b.specs) == 1 and b.specs[0][1].is_floating_point
               for b in build_stages(model, plan, x[:1]).boundaries[:-1])


def _median_rate(samples: int, run, repeats: int) -> float:  # type: ignore[no-untyped-def]
    """Median over ``repeats`` timed calls of ``run`` (between barriers) of ``samples`` / seconds."""
    return statistics.median(samples / _timed(run) for _ in range(repeats))


def _sgd(params, lr: float) -> torch.optim.Optimizer:  # type: ignore[no-untyped-def]
    """SGD with momentum 0.9, also for a stage without parameters (as the runtime's workers make it)."""
    return make_optimizer(TrainConfig(lr=lr, momentum=0.9, weight_decay=0.0), list(params))


def balanced_plan(model: nn.Sequential, stages: int, x: torch.Tensor) -> Plan:
    """Contiguous split of the layers into ``stages`` minimising the slowest stage (measured fwd+bwd)."""
    times = []
    value: Any = x
    for layer in model:  # a layer takes one tensor or one tuple (GNMT), integer ids included
        parts = [t.detach().requires_grad_(t.is_floating_point()) for t in Boundary.unpack(value)]
        value = tuple(parts) if isinstance(value, tuple) else parts[0]
        for k in range(3):
            t0 = time.perf_counter()
            y = layer(value)
            outs = [o for o in Boundary.unpack(y) if o.requires_grad]
            if outs:
                sum(o.sum() for o in outs).backward()
            if k == 2:
                times.append(time.perf_counter() - t0)
        value = tuple(t.detach() for t in y) if isinstance(y, tuple) else y.detach()
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


def _schedule(kind: str, stages: int, units: int, microbatches: int) -> schedules.Schedule:
    """The action lists ours-``kind`` executes for ``units`` units (and the simulator times)."""
    if kind == "1f1b":
        return schedules.build("1f1b", schedules.consecutive_ranks([1] * stages), units)
    return schedules.build("gpipe", schedules.consecutive_ranks([1] * stages), units // microbatches, microbatches)


def _ours(args: argparse.Namespace, plan: Plan, schedule: str, x: torch.Tensor, y: torch.Tensor,
          busy: dict[str, float]) -> float:
    """Samples/s of our executor; fills ``busy`` with this rank's ``compute_s`` and ``wait_s`` (receive
    waits) per unit of the timed run, seconds."""
    rank = dist.get_rank()
    model = build(args.model, args.seed)
    s = plan.stage_of_rank(rank)
    stages = build_stages(model, plan, x[:1])
    shapes, module = stages.boundaries, stages.modules[s]
    m = args.microbatches
    policy = Policy.STASH if schedule == "1f1b" else Policy.FLUSH
    versions = WeightVersions(module, policy)
    opt = _sgd(versions.master, args.lr)
    ex = StageExecutor(s, len(plan.stages), module, versions, opt, P2P(120.0, torch.device("cpu")),
                       shapes[s - 1] if s > 0 else None, shapes[s], timeout_s=120.0, criterion=criterion(args.model))
    data = StageData(lambda mb, j: x, lambda mb, j: y)
    units = args.steps * m

    def run(n: int) -> None:
        sched = _schedule(schedule, len(plan.stages), n, m)
        stats = ex.run(sched.order[rank], sched, data, args.batch_size)
        busy.update(compute_s=stats.compute_s / n, wait_s=stats.wait_s / n)

    run(m)  # warm-up
    return _median_rate(units * args.batch_size, lambda: run(units), args.repeats)


def _torch(args: argparse.Namespace, plan: Plan, kind: str, x: torch.Tensor, y: torch.Tensor) -> float:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    rank = dist.get_rank()
    s = plan.stage_of_rank(rank)
    module = copy.deepcopy(build_stages(build(args.model, args.seed), plan, x[:1]).modules[s])
    stage = PipelineStage(module, s, len(plan.stages), torch.device("cpu"))
    cls = Schedule1F1B if kind == "1f1b" else ScheduleGPipe
    sched = cls(stage, args.microbatches, loss_fn=criterion(args.model))
    opt = _sgd(module.parameters(), args.lr)
    big_x = x.repeat(args.microbatches, *[1] * (x.dim() - 1))
    big_y = y.repeat(args.microbatches, *[1] * (y.dim() - 1))
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
    return _median_rate(args.steps * args.microbatches * args.batch_size, run, args.repeats)


def _mean_s(fn, warmup: int, reps: int) -> list[float]:  # type: ignore[no-untyped-def]
    """Run ``fn`` (which returns its own timings, seconds) ``warmup`` times, then the mean of ``reps``."""
    for _ in range(warmup):
        fn()
    rows = [fn() for _ in range(reps)]
    return [sum(col) / reps for col in zip(*rows, strict=True)]


def _stage_times(args: argparse.Namespace, plan: Plan, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """This rank's stage alone, per unit of ``--batch-size`` samples: ``fwd_s``, ``bwd_s``, ``update_s``
    (seconds), ``send_bytes`` (bytes of the output activations; 0 for the last stage), ``param_bytes``."""
    s = plan.stage_of_rank(dist.get_rank())
    last = s == len(plan.stages) - 1
    model = build(args.model, args.seed)
    stages = build_stages(model, plan, x[:1])
    module = stages.modules[s]
    params = [p for p in module.parameters() if p.requires_grad]
    feed = [x]
    with torch.no_grad():
        for earlier in stages.modules[:s]:  # this stage's real input
            feed = Boundary.unpack(earlier(*feed))
    inputs = [t.detach().requires_grad_(s > 0 and t.is_floating_point()) for t in feed]
    in_float = [t for t in inputs if t.requires_grad]
    opt = _sgd(params, args.lr)
    out_bytes = [0.0]

    def unit() -> tuple[float, float, float]:
        t0 = time.perf_counter()
        out = module(*inputs)
        if last:
            outs, grad_outs = [criterion(args.model)(out, y)], None
        else:
            outs = [o for o in Boundary.unpack(out) if o.requires_grad]
            out_bytes[0] = float(sum(o.numel() * o.element_size() for o in Boundary.unpack(out)))
        t1 = time.perf_counter()
        if not last:
            grad_outs = [torch.ones_like(o) for o in outs]
        grads = torch.autograd.grad(outs, params + in_float, grad_outputs=grad_outs, allow_unused=True)
        t2 = time.perf_counter()
        for p, g in zip(params, grads, strict=False):
            p.grad = g
        t3 = time.perf_counter()
        with torch.no_grad():
            opt.step()
            [p.detach().clone() for p in params]  # the new weight version the executor commits
        opt.zero_grad()
        return t1 - t0, t2 - t1, time.perf_counter() - t3

    fwd_s, bwd_s, update_s = _mean_s(unit, 3, args.time_reps)
    return {"stage": s, "fwd_s": fwd_s, "bwd_s": bwd_s, "update_s": update_s, "send_bytes": out_bytes[0],
            "param_bytes": float(sum(p.numel() * p.element_size() for p in params))}


def _turns(fn):  # type: ignore[no-untyped-def]
    """Run ``fn()`` on one rank at a time (barriers between), so each rank is timed alone; its result."""
    out = None
    for r in range(dist.get_world_size()):
        D.barrier(120.0)
        if r == dist.get_rank():
            out = fn()
    D.barrier(120.0)
    return out


def _link_Bps(megabytes: float, reps: int = 5) -> float:
    """gloo point-to-point bandwidth rank 0 <-> 1, bytes/s: ``bytes / (round trip / 2)`` of a ping-pong
    (mean of ``reps`` after one warm-up); the same value on every rank."""
    rank = dist.get_rank()
    buf = torch.zeros(int(megabytes * 1e6 / 4), dtype=torch.float32)
    times = []
    for k in range(reps + 1):
        D.barrier(120.0)
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        elif rank == 1:
            dist.recv(buf, 0)
            dist.send(buf, 0)
        if k:
            times.append((time.perf_counter() - t0) / 2)
    bw = torch.tensor([buf.numel() * 4 / (sum(times) / reps) if rank == 0 else 0.0], dtype=torch.float64)
    dist.broadcast(bw, 0)
    return float(bw)


def _predict(args: argparse.Namespace, stages: list[dict[str, float]], link_Bps: float) -> dict[str, float]:
    """Samples/s the simulator predicts for ours-1F1B and ours-GPipe from the measured stage costs.

    The update (optimizer step) follows every backward in 1F1B and every ``--microbatches``-th in
    GPipe; it is added to the backward, as its share per unit (the simulator gives STEP no time).
    """
    m, units = args.microbatches, args.steps * args.microbatches
    cluster = Cluster(name="loopback", levels=[(len(stages), link_Bps)])
    out = {}
    for name, kind, updates in (("ours-1F1B", "1f1b", 1.0), ("ours-GPipe", "gpipe", 1.0 / m)):
        costs = measured_costs([st["fwd_s"] for st in stages],
                               [st["bwd_s"] + updates * st["update_s"] for st in stages],
                               [st["send_bytes"] for st in stages[:-1]],
                               [st["param_bytes"] for st in stages])
        trace = simulate(_schedule(kind, len(stages), units, m), costs, Network(cluster), record=False)
        out[name] = units * args.batch_size / trace.makespan_s
    return out


def _child(index: int, args: argparse.Namespace, plan: Plan, port: int, with_torch: bool) -> None:
    os.environ.update({"RANK": str(index), "WORLD_SIZE": str(args.workers), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port), "OMP_NUM_THREADS": str(args.threads),
                       "PIPEDREAM_FORCE_GLOO": "1"})  # every executor here runs on the CPU, GPUs or not
    D.init(120.0)  # sets torch's threads from OMP_NUM_THREADS
    x, y = example_batch(args.model, args.batch_size)
    link_Bps = args.link_Bps or _link_Bps(args.link_mb)
    if args.time_together:  # all stages at once: their times include sharing cores and memory
        D.barrier(120.0)
        mine = _stage_times(args, plan, x, y)
        D.barrier(120.0)
    else:
        mine = _turns(lambda: _stage_times(args, plan, x, y))
    stages: list[dict[str, float]] = [{} for _ in range(args.workers)]
    dist.all_gather_object(stages, mine)
    stages.sort(key=lambda st: st["stage"])
    busy: dict[str, dict[str, float]] = {"ours-1F1B": {}, "ours-GPipe": {}}
    results: dict[str, float | None] = {
        "ours-1F1B": _ours(args, plan, "1f1b", x, y, busy["ours-1F1B"]),
        "ours-GPipe": _ours(args, plan, "gpipe", x, y, busy["ours-GPipe"]),
        "torch-1F1B": _torch(args, plan, "1f1b", x, y) if with_torch else None,
        "torch-GPipe": _torch(args, plan, "gpipe", x, y) if with_torch else None,
    }
    in_run: list[dict[str, dict[str, float]]] = [{} for _ in range(args.workers)]
    dist.all_gather_object(in_run, busy)  # ranks in stage order (straight plans)
    if index == 0:
        _report(args, plan, results, stages, link_Bps, in_run)
    dist.destroy_process_group()


def _report(args: argparse.Namespace, plan: Plan, results: dict[str, float | None], stages: list[dict[str, float]],
            link_Bps: float, in_run: list[dict[str, dict[str, float]]]) -> None:
    """Print (rank 0) samples/s and ratios, the stage times, predicted vs measured samples/s; write ``--out``."""
    ranges = [list(r) for r in stage_layer_ranges(plan, sum(len(s.nodes) for s in plan.stages))]
    cores = len(os.sched_getaffinity(0))
    print(f"model {args.model}, {args.workers} stages (layers {[f'{r[0]}-{r[-1]}' for r in ranges]}), "
          f"{args.steps} x {args.microbatches} units of {args.batch_size} samples, "
          f"{args.threads} thread(s) per process, {cores} cores; median of {args.repeats} timed repetitions")
    for name, sps in results.items():
        print(f"  {name:<12} {sps:8.1f} samples/s" if sps is not None
              else f"  {name:<12}      n/a (torch.distributed.pipelining cannot run this model's stages: see README)")
    ours = results["ours-1F1B"]
    assert ours is not None
    ratios = {f"ours-1F1B / {k}": ours / v for k, v in results.items() if k != "ours-1F1B" and v is not None}
    for k, v in ratios.items():
        print(f"  {k:<26} {v:5.2f}")
    timing = "together" if args.time_together else "alone"
    print(f"stage times {timing}, per unit of {args.batch_size} samples; gloo link {link_Bps / 1e9:.2f} GB/s "
          f"({'given' if args.link_Bps else 'measured'})")
    print("  stage   fwd ms   bwd ms  update ms   sends MB")
    for st in stages:
        print(f"  {st['stage']:5d} {st['fwd_s'] * 1e3:8.2f} {st['bwd_s'] * 1e3:8.2f} {st['update_s'] * 1e3:10.2f} "
              f"{st['send_bytes'] / 1e6:10.3f}")
    predicted = _predict(args, stages, link_Bps)
    prediction = {k: {"predicted_samples_per_s": p, "measured_samples_per_s": results[k],
                      "measured_over_predicted": results[k] / p} for k, p in predicted.items()}  # type: ignore[operator]
    print("simulated schedule with these costs vs measured")
    for k, row in prediction.items():
        print(f"  {k:<12} predicted {row['predicted_samples_per_s']:8.1f}  measured "
              f"{row['measured_samples_per_s']:8.1f}  measured/predicted {row['measured_over_predicted']:5.2f}")
    print("  in the timed runs, per unit and stage: executor compute ms (forward + backward) / receive wait ms")
    for k in prediction:
        cells = [f"{r[k]['compute_s'] * 1e3:6.1f} /{r[k]['wait_s'] * 1e3:6.1f}" for r in in_run]
        print(f"  {k:<12} {'  '.join(cells)}")
        prediction[k]["in_run_compute_s"] = [r[k]["compute_s"] for r in in_run]
        prediction[k]["in_run_wait_s"] = [r[k]["wait_s"] for r in in_run]
    oversubscribed = args.workers * args.threads > cores
    # all work of one unit spread over the cores (no pipeline bubble, no communication): samples/s
    work_s = sum(st["fwd_s"] + st["bwd_s"] for st in stages)
    cores_bound = cores / args.threads * args.batch_size / work_s
    if oversubscribed and not args.time_together:
        print(f"note: {args.workers} processes x {args.threads} thread(s) > {cores} cores: the processes share "
              "cores, so a prediction from stage times taken alone cannot be met; the cores alone allow at "
              f"most {cores_bound:.1f} samples/s (forward + backward work of a unit spread over the cores)")
    elif oversubscribed:
        print(f"note: {args.workers} processes x {args.threads} thread(s) > {cores} cores: stage times were taken "
              "all at once, so they include the sharing of cores (as far as it resembles the pipeline's)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"model": args.model, "repeats": args.repeats,
            "args": {k: str(v) for k, v in vars(args).items()}, "threads": args.threads, "cores": cores,
            "oversubscribed": oversubscribed, "cores_bound_samples_per_s": cores_bound,
            "stage_timing": timing, "samples_per_s": results, "ratios": ratios,
            "link_Bps": link_Bps, "link_measured": not args.link_Bps, "stages": stages,
            "prediction": prediction}, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vgg16",
                        help="registry model (reduced preset), package.module:fn, or all (every registered model)")
    parser.add_argument("--workers", type=int, default=4, help="pipeline stages = processes")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per (micro)batch")
    parser.add_argument("--microbatches", type=int, default=8, help="microbatches per torch/GPipe step")
    parser.add_argument("--steps", type=int, default=4, help="timed steps of --microbatches units")
    parser.add_argument("--lr", type=float, default=0.001)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plan", type=Path, help="plan JSON (straight; one model); default: balanced by measured time, "
                                                  "computed once before the workers start and printed")
    parser.add_argument("--save-plan", type=Path, help="write each model's partition to DIR/<model>.json (for --plan)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repetitions per schedule; the median is reported")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")),
                        help="torch threads per process (default: OMP_NUM_THREADS, else 1)")
    parser.add_argument("--time-reps", type=int, default=10, help="timed repetitions of each stage alone")
    parser.add_argument("--time-together", action="store_true",
                        help="time all stages at once instead of one rank at a time (includes core sharing)")
    parser.add_argument("--link-Bps", type=float, help="loopback bandwidth, bytes/s (default: measured)")
    parser.add_argument("--link-mb", type=float, default=4.0, help="MB per ping-pong when measuring the link")
    parser.add_argument("--out", type=Path, help="also write the numbers as JSON here (--model all: "
                                                 "<stem>_<model>.json each)")
    args = parser.parse_args()
    if (args.threads < 1 or args.time_reps < 1 or args.steps < 1 or args.microbatches < 1 or args.workers < 2
            or args.repeats < 1):
        parser.error("--threads, --time-reps, --steps, --microbatches and --repeats must be at least 1, --workers "
                     "at least 2")
    if args.model == "all" and args.plan:
        parser.error("--plan is one model's partition; leave it out with --model all")
    from pipedream.models import model_names

    out = args.out
    for name in model_names() if args.model == "all" else [args.model]:
        one = argparse.Namespace(**{**vars(args), "model": name})
        if out and args.model == "all":
            one.out = out.with_name(f"{out.stem}_{name}{out.suffix}")
        _bench(one)


def _bench(args: argparse.Namespace) -> None:
    """Partition ``args.model`` once (or read ``--plan``), print it, and run the workers on it."""
    torch.set_num_threads(1)  # the parent times layers for the balance on one thread, like one worker
    model = build(args.model, args.seed)
    x, _ = example_batch(args.model, args.batch_size)
    plan = Plan.load(args.plan) if args.plan else balanced_plan(model, args.workers, x)
    n = sum(len(s.nodes) for s in plan.stages)
    layers = [f"{r[0]}-{r[-1]}" for r in (list(r) for r in stage_layer_ranges(plan, n))]
    print(f"{args.model}: partition {'from ' + str(args.plan) if args.plan else 'balanced by layer time'}: "
          f"layers {', '.join(layers)}", flush=True)
    if args.save_plan:
        args.save_plan.mkdir(parents=True, exist_ok=True)
        plan.save(args.save_plan / f"{args.model.replace(':', '.')}.json")
    with_torch = torch_runnable(args.model, model, plan, x)
    # the workers start from a fork server, never a fork of this process (which ran autograd above)
    mp.start_processes(_child, args=(args, plan, free_port(), with_torch), nprocs=args.workers,
                       start_method=start_method())


if __name__ == "__main__":
    main()
