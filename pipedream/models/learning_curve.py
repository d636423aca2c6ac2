"""Single-process learning curve of a registered model on its own data (the DP-equivalent reference).

Data parallelism over ``W`` workers with per-worker minibatch ``b`` and averaged gradients is, up to
floating-point order and batch-norm statistics, plain SGD with minibatch ``W*b``. This module trains
that equivalent in one process, using only the model's hooks (``make_datasets``, ``criterion``,
``evaluate``), and records loss and metric as training goes: the curve a threshold in
``experiments/ci.yaml`` is chosen from.

    python -m pipedream.models.learning_curve --model gnmt8 --batch-size 128 --optimizer adam --lr 1e-3 \\
        --epochs 2 --train-subset 8192 --val-subset 512 --eval-every 16 --out curve.json
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from pipedream.data.base import minibatches
from pipedream.errors import PipeDreamError
from pipedream.models import build_model, get_spec
from pipedream.runtime.config import TrainConfig
from pipedream.runtime.optim import make_optimizer


@dataclass
class CurvePoint:
    """One evaluation: after ``step`` minibatches (``samples`` samples, ``seconds`` of training)."""

    step: int
    epoch: float
    samples: int
    seconds: float
    train_loss: float  # mean criterion value over the minibatches since the previous point
    metric: float
    accuracy: float  # validation top-1 / token accuracy in percent, padding excluded (what the runtimes log)


def val_accuracy(model: torch.nn.Module, val, spec, batch_size: int = 256) -> float:  # type: ignore[no-untyped-def]
    """Validation accuracy in percent as the runtimes count it (:func:`pipedream.runtime.task.count_correct`
    with the model's ``ignore_index``): top-1 for classifiers, per token for sequence models."""
    from pipedream.runtime.task import count_correct

    model.eval()
    correct = counted = 0
    with torch.no_grad():
        for start in range(0, len(val), batch_size):
            x, y = val.batch(torch.arange(start, min(start + batch_size, len(val))))
            c, k = count_correct(model(x), y, spec.ignore_index)
            correct, counted = correct + c, counted + k
    return 100.0 * correct / max(counted, 1)


def learning_curve(name: str, batch_size: int, lr: float, optimizer: str = "sgd", momentum: float = 0.9,
                   weight_decay: float = 0.0, epochs: int = 1, train_subset: int | None = None,
                   val_subset: int | None = None, seed: int = 0, eval_every: int = 0, max_steps: int = 0,
                   clip_norm: float = 0.0, preset: str = "reduced") -> list[CurvePoint]:
    """Train ``name`` single-process and evaluate every ``eval_every`` steps (0: once per epoch).

    The first point (step 0) is the untrained model. Training time excludes evaluation.

    Raises:
        PipeDreamError: the model has no data hook, or its data is not installed.
    """
    spec = get_spec(name)
    if spec.make_datasets is None or spec.evaluate is None:
        raise PipeDreamError(f"model {name!r} has no data or evaluation hook")
    train, val = spec.make_datasets(preset, train_subset, val_subset, seed)
    model = build_model(name, preset, seed)
    opt = make_optimizer(TrainConfig(optimizer=optimizer, lr=lr, momentum=momentum, weight_decay=weight_decay),
                         model.parameters())
    per_epoch = len(train) // batch_size
    points = [CurvePoint(0, 0.0, 0, 0.0, float("nan"), spec.evaluate(model, val, 256), val_accuracy(model, val, spec))]
    step, seconds, losses = 0, 0.0, []
    for epoch in range(epochs):
        for i, (x, y) in minibatches(train, batch_size, seed, epoch):
            start = time.perf_counter()
            model.train()
            loss = spec.criterion(model(x), y)
            opt.zero_grad()
            loss.backward()
            if clip_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
            opt.step()
            seconds += time.perf_counter() - start
            losses.append(float(loss.detach()))
            step += 1
            last = i == per_epoch - 1
            if (eval_every and step % eval_every == 0) or (last and not eval_every) or step == max_steps:
                metric = spec.evaluate(model, val, 256)
                points.append(CurvePoint(step, step / per_epoch, step * batch_size, seconds,
                                         sum(losses) / len(losses), metric, val_accuracy(model, val, spec)))
                losses = []
                print(f"{name} step {step} epoch {step / per_epoch:.2f} {seconds:.0f}s loss {points[-1].train_loss:.3f} "
                      f"{spec.metric} {metric:.2f} accuracy {points[-1].accuracy:.1f}%", flush=True)
            if step == max_steps:
                return points
    return points


def main(argv: list[str] | None = None) -> int:
    """Command line: print points as they come and write them as JSON."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--batch-size", type=int, required=True, help="global minibatch (workers x per-worker)")
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"])
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--train-subset", type=int)
    p.add_argument("--val-subset", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=0, help="steps between evaluations (0: every epoch)")
    p.add_argument("--max-steps", type=int, default=0)
    p.add_argument("--clip-norm", type=float, default=0.0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    points = learning_curve(a.model, a.batch_size, a.lr, a.optimizer, a.momentum, a.weight_decay, a.epochs,
                            a.train_subset, a.val_subset, a.seed, a.eval_every, a.max_steps, a.clip_norm)
    if a.out:
        a.out.write_text(json.dumps({"args": vars(a) | {"out": str(a.out)}, "points": [asdict(q) for q in points]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
