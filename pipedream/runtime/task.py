"""What a run trains: the model, an example input, the data sets and the loss, from one config.

Sources, in order: ``cfg.model_factory`` (tests); otherwise :func:`pipedream.models.get_spec` of
``cfg.model``, a registered name or a user's ``"package.module:function"``, whose spec may bring its own
data hook and criterion. Models without a data hook train on Fashion-MNIST (``cfg.data_dir`` or the
installed package). With ``cfg.data == "synthetic"`` the data sets are the spec's synthetic samples
(:mod:`pipedream.data.synthetic`) instead, for the DP baseline and the pipeline alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pipedream.data import fashion_mnist as fm
from pipedream.runtime.config import TrainConfig


@dataclass
class Task:
    """A model to train and its data.

    Attributes:
        model: the whole model as a flat ``nn.Sequential`` (weights from ``cfg.seed``).
        example: one-sample model input ``(1, ...)`` for shape inference.
        train, val: data sets with ``len()`` and ``batch(indices) -> (input, target)``.
        criterion: ``criterion(output, target) -> scalar`` mean loss.
        ignore_index: target id that validation accuracy skips, as the loss does (padding); None: none.
    """

    model: nn.Sequential
    example: torch.Tensor
    train: Any
    val: Any
    criterion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    ignore_index: int | None = None

    def count_correct(self, output: torch.Tensor, target: torch.Tensor) -> tuple[int, int]:
        """:func:`count_correct` with this task's ``ignore_index``."""
        return count_correct(output, target, self.ignore_index)


def load_task(cfg: TrainConfig) -> Task:
    """Build the task of ``cfg`` (the same on every rank).

    Raises:
        PipeDreamError: unknown model, missing data set (naming how to install it).
    """
    from pipedream.data import synthetic

    data_dir = Path(cfg.data_dir) if cfg.data_dir else None
    if cfg.model_factory is not None:
        torch.manual_seed(cfg.seed)
        model = cfg.model_factory()
        if cfg.data == "synthetic":
            from pipedream.data.images import fmnist_synthetic

            train, val = synthetic.synthetic_datasets(fmnist_synthetic(32), cfg.train_subset, cfg.val_subset, cfg.seed)
        else:
            train, val = fm.datasets(data_dir, cfg.train_subset, cfg.val_subset, cfg.seed)
        return Task(model, train.batch(torch.tensor([0]))[0], train, val, F.cross_entropy)
    from pipedream.models import build_model, example_input, get_spec

    spec = get_spec(cfg.model)
    model = build_model(cfg.model, cfg.preset, cfg.seed)
    hook = getattr(spec, "make_datasets", None)
    if cfg.data == "synthetic":
        made = synthetic.require_spec(cfg.model, getattr(spec, "synthetic", None), cfg.preset)
        train, val = synthetic.synthetic_datasets(made, cfg.train_subset, cfg.val_subset, cfg.seed)
        example = train.batch([0])[0]
    elif hook is not None and data_dir is None:
        train, val = hook(cfg.preset, cfg.train_subset, cfg.val_subset, cfg.seed)
        example = train.batch([0])[0]
    else:
        train, val = fm.datasets(data_dir, cfg.train_subset, cfg.val_subset, cfg.seed)
        example = example_input(cfg.model, 1, cfg.preset, cfg.seed)
    criterion = getattr(spec, "criterion", None) or F.cross_entropy
    return Task(model, example, train, val, criterion, getattr(spec, "ignore_index", None))


def count_correct(output: torch.Tensor, target: torch.Tensor, ignore_index: int | None = None) -> tuple[int, int]:
    """(correct, counted) top-1 predictions: ``output (..., C)`` logits against ``target (...)`` ids.

    Positions whose target is ``ignore_index`` (padding) are not counted, as the loss ignores them
    (``F.cross_entropy(ignore_index=...)``). Returns (0, 0) when the output is not a classification over
    the target's shape.
    """
    if output.dim() < 1 or target.is_floating_point() or tuple(output.shape[:-1]) != tuple(target.shape):
        return 0, 0
    hit = output.argmax(dim=-1) == target
    if ignore_index is None:
        return int(hit.sum()), int(target.numel())
    keep = target != ignore_index
    return int((hit & keep).sum()), int(keep.sum())
