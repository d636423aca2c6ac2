"""Does a training step's forward and backward cost what the profile's step costs? One process, one thread.

The prediction's compute is the profile's step (:func:`pipedream.commands.profile.runtime_step`: one minibatch,
repeated, forward on a weight version through ``torch.func.functional_call``, gradients from
``torch.autograd.grad`` added into master gradients), scaled to the layers
(:func:`pipedream.sim.profiled.profiled_composition`).
Runs spend 1.1-1.4x that on most stages (``results/compute_check.csv`` ``compute_cpu_ratio``; issue 18). This
times, in one process, what a worker's step does beyond the profile's:

- ``profile``: the profile's step itself, every gradient added into a master gradient as the pipeline runtime's
  backward does (``pipedream/runtime/executor.py``);
- ``no-add``: the same without the add (the profile's step before 2026-11-28: the gradients dropped);
- ``backward``: the module called as it is and ``loss.backward()`` into zeroed ``.grad``, as a DDP replica does;
- ``new-minibatch+step``: ``backward`` on a new minibatch each step, an optimizer step between steps (neither
  timed).

The modes are interleaved in blocks of ``--block`` steps, ``--blocks`` times, so that the host's drift (tens of
percent over minutes on the 2-core CI VM, ``benchmarks/drift``) falls on every mode alike. It does not
remove the spread between passes: over four passes of AlexNet, VGG-16 and ResNet-50 on that VM (one timed the
modes one after another, three interleaved) ``new-minibatch+step`` over ``profile`` ranged 0.73-1.14x.
Prints each mode's median main-thread CPU per step (:func:`time.thread_time`) and its ratio to ``profile``.

    .venv/bin/python benchmarks/step/main.py --models alexnet vgg16 resnet50 s2vt gnmt8
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.func import functional_call

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `pipedream` from this checkout, also in a worktree

from pipedream.commands.profile import runtime_step  # noqa: E402
from pipedream.runtime.config import TrainConfig  # noqa: E402
from pipedream.runtime.optim import make_optimizer  # noqa: E402
from pipedream.runtime.task import load_task  # noqa: E402


def modes(model: str, batch: int, optimizer: str) -> tuple[dict[str, Callable[[], float]], float]:
    """The timed modes of ``model`` (module docstring), each a call returning one step's CPU seconds, and the
    model's parameter bytes."""
    task = load_task(TrainConfig(model=model, preset="reduced", seed=0, data="real", batch_size=batch))
    net = task.model
    x, y = task.train.batch(list(range(batch)))
    profile_step = runtime_step(net, task.criterion, x, y)
    aliases = {n: p.detach().requires_grad_(p.requires_grad) for n, p in net.named_parameters()}
    names = [n for n, t in aliases.items() if t.requires_grad]
    params = [p for p in net.parameters() if p.requires_grad]
    opt = make_optimizer(TrainConfig(optimizer=optimizer, lr=1e-4), params, ())
    nxt = [0]

    def timed(fn: Callable[[], object]) -> float:
        c0 = time.thread_time()
        fn()
        return time.thread_time() - c0

    def no_add() -> None:
        loss = task.criterion(functional_call(net, aliases, (x,)), y)
        torch.autograd.grad(loss, [aliases[n] for n in names], allow_unused=True)

    def backward(xs: object = x, ys: object = y) -> None:
        task.criterion(net(xs), ys).backward()

    def plain() -> float:
        opt.zero_grad(set_to_none=False)
        return timed(backward)

    def fresh() -> float:
        nxt[0] += 1
        xs, ys = task.train.batch([(nxt[0] * batch + k) % len(task.train) for k in range(batch)])
        opt.zero_grad(set_to_none=False)
        spent = timed(lambda: backward(xs, ys))
        opt.step()
        return spent

    return ({"profile": lambda: timed(profile_step), "no-add": lambda: timed(no_add),
             "backward": plain, "new-minibatch+step": fresh},
            float(sum(p.numel() * p.element_size() for p in params)))


def main() -> int:
    """Parse, time every model's modes interleaved, print; returns 0."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["alexnet", "vgg16", "resnet50"], help="reduced models")
    ap.add_argument("--batch-size", type=int, default=32, help="samples per step (the profile's in make run)")
    ap.add_argument("--optimizer", default="adam", help="the optimizer stepped between new-minibatch steps")
    ap.add_argument("--blocks", type=int, default=10, help="rounds over the modes")
    ap.add_argument("--block", type=int, default=3, help="steps of one mode in a row")
    args = ap.parse_args()
    torch.set_num_threads(1)
    for model in args.models:
        fns, nbytes = modes(model, args.batch_size, args.optimizer)
        for fn in fns.values():  # warm up (the optimizer's first step makes its state)
            fn()
            fn()
        spent: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(args.blocks):
            for k, fn in fns.items():
                spent[k] += [fn() for _ in range(args.block)]
        med = {k: statistics.median(v) for k, v in spent.items()}
        print(f"{model} ({nbytes / 2**20:.1f} MiB of parameters, {args.blocks * args.block} steps a mode)")
        for k, v in med.items():
            print(f"  {k:20s} {v * 1e3:8.2f} ms  x{v / med['profile']:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
