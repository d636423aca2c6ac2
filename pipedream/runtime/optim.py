"""Optimizers of the master weights: SGD with momentum and weight decay (the paper's image models), Adam."""

from __future__ import annotations

import torch

from pipedream.runtime.config import TrainConfig


def make_optimizer(cfg: TrainConfig, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """``torch.optim.SGD(lr, momentum, weight_decay)`` or ``torch.optim.Adam(lr, weight_decay)``.

    Adam's betas and eps are PyTorch's defaults; ``cfg.momentum`` only applies to SGD. A stage without
    parameters (only pooling or flattening layers, e.g. AlexNet's ``MaxPool2d, AdaptiveAvgPool2d, Flatten``)
    gets an optimizer of one empty tensor, so its ``STEP`` does nothing (PyTorch refuses an empty list).
    """
    params = list(params) or [torch.zeros(0, requires_grad=True)]
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
