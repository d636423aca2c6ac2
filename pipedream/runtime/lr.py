"""Learning-rate policy, warm-up and gradient clipping, applied before every optimizer step by both the
PipeDream workers and the data-parallel baseline.

The learning rate is a function of training progress ``p`` in epochs (``epoch + minibatch / minibatches
per epoch``), so it does not depend on how many optimizer steps a replica takes:

* ``constant``: ``lr``;
* ``polynomial``: ``lr * (1 - p / epochs) ** lr_power`` (the release's image-model policy; the paper's
  Table 1 runs use power 2);
* ``step``: ``lr * 0.1 ** floor(p / lr_step_epochs)``.

Linear scaling with gradual warm-up (Goyal et al. 2017, "Accurate, Large Minibatch SGD", §2.1-2.2): a
run whose minibatch is ``k`` times the reference multiplies the learning rate by ``k``, reaching it
linearly from ``lr`` over the first ``lr_warmup_epochs`` epochs: ``lr * (1 + (k - 1) * min(1, p / warmup))``
before the policy's decay factor. The DP baseline with per-worker minibatches (``dp_batch: per_worker``)
and SGD uses ``k = workers``; every other run ``k = 1`` (the rule is derived for SGD; Adam keeps ``lr``).

Per-stage learning rate under 1F1B-RR (:func:`stage_lr_factor`): a stage with ``r_s`` replicas steps once per
round of ``r_s`` minibatches on their averaged gradient, ``r_s`` times smaller steps per sample than an
unreplicated one. The release's runtime (``StageRuntime.get_adjusted_learning_rate``) multiplies stage ``s``'s
learning rate by ``r_s / r_0`` (``r_0``: the input stage's replicas); we do the same for SGD by default
(``stage_lr="sgd"``; with Adam the factor lowers accuracy) and for every optimizer with ``stage_lr="all"`` or
``compat``.

Clipping (``clip_norm > 0``) rescales the gradients so their L2 norm is at most ``clip_norm``
(``torch.nn.utils.clip_grad_norm_``). DP clips the whole model's averaged gradient. A pipeline stage
clips its own parameters' gradient: stages step at different times for different minibatches, so no
global norm exists without a flush; the whole model's norm is then at most ``sqrt(stages) * clip_norm``.
"""

from __future__ import annotations

import math

import torch

from pipedream.runtime.config import TrainConfig


def lr_at(cfg: TrainConfig, progress_epochs: float, scale: float = 1.0) -> float:
    """The learning rate at ``progress_epochs`` (0 .. ``cfg.epochs``) for a minibatch ``scale`` times
    the reference one (see the module docstring for the formulas)."""
    p = max(0.0, progress_epochs)
    warm = min(1.0, p / cfg.lr_warmup_epochs) if cfg.lr_warmup_epochs > 0 else 1.0
    lr = cfg.lr * (1.0 + (scale - 1.0) * warm)
    if cfg.lr_policy == "polynomial":
        lr *= max(0.0, 1.0 - p / cfg.epochs) ** cfg.lr_power
    elif cfg.lr_policy == "step":
        lr *= 0.1 ** math.floor(p / cfg.lr_step_epochs)
    return lr


def stage_lr_applies(cfg: TrainConfig) -> bool:
    """Whether stages get the release's per-stage learning rate: under 1F1B-RR when ``cfg.stage_lr`` covers
    ``cfg.optimizer``, or with ``cfg.compat``. GPipe and 2BW replicas share each minibatch's microbatches,
    so every stage steps once per minibatch there and needs no factor."""
    covered = cfg.compat or cfg.stage_lr == "all" or (cfg.stage_lr == "sgd" and cfg.optimizer == "sgd")
    return covered and cfg.schedule == "1f1b"


def stage_lr_factor(cfg: TrainConfig, replicas: list[int], stage: int) -> float:
    """What stage ``stage``'s learning rate is multiplied by: ``replicas[stage] / replicas[0]`` when
    :func:`stage_lr_applies`, else 1 (see the module docstring)."""
    return replicas[stage] / replicas[0] if stage_lr_applies(cfg) else 1.0


def before_step(cfg: TrainConfig, optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter],
                progress_epochs: float, scale: float = 1.0, factor: float = 1.0) -> None:
    """Set the learning rate of every parameter group for this step, ``factor`` times :func:`lr_at`
    (:func:`stage_lr_factor` of a pipeline stage), and clip the gradients of ``params``."""
    lr = factor * lr_at(cfg, progress_epochs, scale)
    for group in optimizer.param_groups:
        group["lr"] = lr
    if cfg.clip_norm > 0:
        torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], cfg.clip_norm)
