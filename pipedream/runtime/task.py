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

from pipedream.capture import turn_off_kv_cache
from pipedream.data import fashion_mnist as fm
from pipedream.runtime.config import TrainConfig


@dataclass
class Task:
    """A model to train and its data.

    Attributes:
        model: the whole model (weights from ``cfg.seed``): a flat ``nn.Sequential`` or any module.
        example: one-sample model input ``(1, ...)`` for shape inference.
        train, val: data sets with ``len()`` and ``batch(indices) -> (input, target)``.
        criterion: ``criterion(output, target) -> scalar`` mean loss.
        ignore_index: target id that validation accuracy skips, as the loss does (padding); None: none.
    """

    model: nn.Module
    example: Any
    train: Any
    val: Any
    criterion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    ignore_index: int | None = None

    def count_correct(self, output: torch.Tensor, target: torch.Tensor) -> tuple[int, int]:
        """:func:`count_correct` with this task's ``ignore_index``."""
        return count_correct(output, target, self.ignore_index)

    def input_batch(self, n: int) -> Any:
        """The inputs of the first ``n`` training samples: the example a model is captured on."""
        return self.train.batch(list(range(min(n, len(self.train)))))[0]


def load_datasets(cfg: TrainConfig) -> tuple[Any, Any]:
    """The training and validation sets of ``cfg`` (each with ``len()`` and ``batch(indices)``), without
    building the model: the model's own data (its ``make_datasets`` hook, or Fashion-MNIST), or synthetic
    samples of its shapes with ``data: synthetic``, drawn to ``train_subset``/``val_subset`` from ``seed``.

    Raises:
        PipeDreamError: unknown model, missing data set (naming how to install it).
    """
    from pipedream.data import synthetic

    data_dir = Path(cfg.data_dir) if cfg.data_dir else None
    if cfg.datasets is not None:  # given as objects, or a function returning them (pipedream.train)
        return _subsets(cfg, *(cfg.datasets() if callable(cfg.datasets) else cfg.datasets))
    if cfg.model_factory is not None:
        if cfg.data == "synthetic":
            from pipedream.data.images import fmnist_synthetic

            return synthetic.synthetic_datasets(fmnist_synthetic(32), cfg.train_subset, cfg.val_subset, cfg.seed)
        return fm.datasets(data_dir, cfg.train_subset, cfg.val_subset, cfg.seed)
    from pipedream.models import get_spec

    spec = get_spec(cfg.model)
    hook = getattr(spec, "make_datasets", None)
    if cfg.data == "synthetic":
        made = synthetic.require_spec(cfg.model, getattr(spec, "synthetic", None), cfg.preset)
        return synthetic.synthetic_datasets(made, cfg.train_subset, cfg.val_subset, cfg.seed)
    if hook is not None and data_dir is None:
        return _subsets(cfg, *hook(cfg.preset, cfg.train_subset, cfg.val_subset, cfg.seed))
    return fm.datasets(data_dir, cfg.train_subset, cfg.val_subset, cfg.seed)


def _subsets(cfg: TrainConfig, train: Any, val: Any) -> tuple[Any, Any]:
    """``train`` and ``val`` as sample sets, the config's subsets drawn from them whether a data hook drew them or
    not (a smaller set is left as it is)."""
    from pipedream.data.base import as_sample_set, limit

    return (limit(as_sample_set(train, "training"), cfg.train_subset, cfg.seed),
            limit(as_sample_set(val, "validation"), cfg.val_subset, cfg.seed + 1))


def load_task(cfg: TrainConfig, datasets: tuple[Any, Any] | None = None) -> Task:
    """Build the task of ``cfg`` (the same on every rank): the model from ``cfg.seed``, with any Hugging Face
    key/value cache turned off (:func:`pipedream.capture.turn_off_kv_cache`: training reads none, in either mode),
    then its data (:func:`load_datasets`), or ``datasets`` (``(train, val)`` of an earlier task of the same
    ``cfg``: a new model on data already loaded).

    Raises:
        PipeDreamError: unknown model, missing data set (naming how to install it).
    """
    if cfg.model_factory is not None:
        torch.manual_seed(cfg.seed)
        model = cfg.model_factory()
        turn_off_kv_cache(model)
        train, val = datasets or load_datasets(cfg)
        from pipedream.models import classification_loss

        return Task(model, train.batch(torch.tensor([0]))[0], train, val, cfg.criterion or classification_loss)
    from pipedream.models import build_model, example_input, get_spec

    spec = get_spec(cfg.model)
    model = build_model(cfg.model, cfg.preset, cfg.seed)
    turn_off_kv_cache(model)
    train, val = datasets or load_datasets(cfg)
    own_data = cfg.data == "synthetic" or (getattr(spec, "make_datasets", None) is not None and not cfg.data_dir)
    example = train.batch([0])[0] if own_data else example_input(cfg.model, 1, cfg.preset, cfg.seed)
    criterion = getattr(spec, "criterion", None) or F.cross_entropy
    return Task(model, example, train, val, criterion, getattr(spec, "ignore_index", None))

def count_correct(output: Any, target: torch.Tensor, ignore_index: int | None = None) -> tuple[int, int]:
    """(correct, counted) top-1 predictions: ``output (..., C)`` logits against ``target (...)`` ids.

    Positions whose target is ``ignore_index`` (padding) are not counted, as the loss ignores them
    (``F.cross_entropy(ignore_index=...)``). An output that is not a tensor (a tuple, a dict, a Hugging Face
    ``ModelOutput``) counts its logits (:func:`pipedream.models.logits_of`). Returns (0, 0) when the output is
    not a classification over the target's shape.
    """
    from pipedream.models import logits_of

    output = logits_of(output)
    if (not isinstance(target, torch.Tensor) or output.dim() < 1 or target.is_floating_point()
            or tuple(output.shape[:-1]) != tuple(target.shape)):
        return 0, 0
    hit = output.argmax(dim=-1) == target
    if ignore_index is None:
        return int(hit.sum()), int(target.numel())
    keep = target != ignore_index
    return int((hit & keep).sum()), int(keep.sum())
