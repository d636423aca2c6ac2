"""Optimizers of the master weights: SGD with momentum and weight decay (the paper's image models), Adam."""

from __future__ import annotations

import torch

from pipedream.runtime.config import TrainConfig


def make_optimizer(cfg: TrainConfig, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """``torch.optim.SGD(lr, momentum, weight_decay)`` or ``torch.optim.Adam(lr, weight_decay)``.

    Adam's betas and eps are PyTorch's defaults; ``cfg.momentum`` only applies to SGD.
    """
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
