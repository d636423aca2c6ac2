"""Optimizers of the master weights: SGD with momentum and weight decay (the paper's image models), Adam, and
Muon on the hidden matrices with Adam on the rest.

Muon (Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural networks",
https://kellerjordan.github.io/posts/muon/; ``torch.optim.Muon``) orthogonalises each 2-D weight's momentum with
Newton-Schulz iterations before the update. It is meant for the *hidden* weight matrices only: embeddings, biases,
norms and the output layer stay on Adam (Keller Jordan's recipe). Under PipeDream-2BW's one-step delay,
``W(t+1) = W(t) - lr * grad f(W(t-1))``, Muon loses almost nothing where Adam loses several percent of validation
loss (Zmushko et al., "One-Step Gradient Delay is Not a Barrier for Large-Scale Asynchronous Pipeline Parallel LLM
Pretraining", ICML 2026, arXiv:2606.30634).

Which parameters are hidden matrices is decided once, on the whole model (:func:`hidden_matrices`), and the same
tensors are handed to every stage's :func:`make_optimizer` (a stage's module shares the model's parameter objects,
:func:`pipedream.runtime.stage.build_stages`), to the data-parallel baseline and to the profiler, whose per-layer
bytes of them (``graph.json``'s ``hidden_bytes``) the memory model reads.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import Any

import torch
from torch import nn

from pipedream.capture import call_model
from pipedream.runtime.config import TrainConfig


def hidden_matrices(model: nn.Module, example: Any) -> list[nn.Parameter]:
    """The weights Muon updates: those of ``model``'s ``nn.Linear`` modules, except the output layer's.

    The output layer is the last ``nn.Linear`` the forward calls on ``example`` (one forward in eval mode, without
    gradients, the RNG state restored, so no dropout draw, BatchNorm statistic or random number of training
    changes). A Linear's weight that a module of another kind also holds (an output projection tied to the
    embedding) is not a hidden matrix; nor is a weight that does not require a gradient.

    Args:
        model: the whole model (every stage of a pipeline must get the same set).
        example: an input :func:`pipedream.capture.call_model` takes, on ``model``'s device.
    Returns:
        the weights in ``model.modules()`` order, each once.
    """
    order: list[nn.Module] = []
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    hooks = [m.register_forward_hook(lambda mod, args, out: order.append(mod)) for m in linears]
    modes = {m: m.training for m in model.modules()}
    try:
        model.eval()
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            call_model(model, example)
    finally:
        for h in hooks:
            h.remove()
        for m, training in modes.items():
            m.training = training
    output = order[-1] if order else None
    other = {id(p) for m in model.modules() if not isinstance(m, nn.Linear) for p in m.parameters(recurse=False)}
    if output is not None:
        other.add(id(output.weight))
    hidden = {id(m.weight): m.weight for m in linears
              if m is not output and m.weight.requires_grad and m.weight.ndim == 2 and id(m.weight) not in other}
    return list(hidden.values())


class MuonAdam(torch.optim.Optimizer):
    """``torch.optim.Muon`` on the hidden matrices and ``torch.optim.Adam`` on the other parameters, as one optimizer.

    The two keep their own parameter groups, and this optimizer's ``param_groups`` are those same dicts (Muon's
    first): setting ``group["lr"]`` (:func:`pipedream.runtime.lr.before_step`) sets it for the part that owns the
    group. Both parts write their per-parameter state into this optimizer's ``state`` (the parameters are
    disjoint), so :meth:`state_dict`, :meth:`load_state_dict`, :meth:`zero_grad` and the memory meter see one
    optimizer. A part without parameters is left out.

    Args:
        hidden: the parameters Muon updates (2-D).
        rest: the parameters Adam updates.
        lr, weight_decay: both parts' learning rate and weight decay (Muon's is decoupled, Adam's L2); Muon's
            ``adjust_lr_fn="match_rms_adamw"`` scales its orthogonalised update to Adam's RMS, so Adam's learning
            rate carries over; every other argument is torch's default.
    Raises:
        ValueError: both lists are empty, or a hidden parameter is not 2-D (torch's).
    """

    def __init__(self, hidden: list[nn.Parameter], rest: list[nn.Parameter], lr: float, weight_decay: float) -> None:
        parts: list[torch.optim.Optimizer] = []
        if hidden:
            parts.append(torch.optim.Muon(hidden, lr=lr, weight_decay=weight_decay, adjust_lr_fn="match_rms_adamw"))
        if rest:
            parts.append(torch.optim.Adam(rest, lr=lr, weight_decay=weight_decay))
        super().__init__([*hidden, *rest], {})  # the base class's hooks and checks; its groups are replaced
        self.parts = parts
        self.param_groups = [g for part in parts for g in part.param_groups]
        self._share()

    def _share(self) -> None:
        """Hand each part its slice of :attr:`param_groups` and this optimizer's ``state``."""
        first = 0
        for part in self.parts:
            n = len(part.param_groups)
            part.param_groups, part.state = self.param_groups[first:first + n], self.state
            first += n

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One step of each part (``closure``, if given, is evaluated once, before them)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for part in self.parts:
            part.step()
        return loss

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's :meth:`torch.optim.Optimizer.load_state_dict` (which makes new groups and state), then both
        parts use them."""
        super().load_state_dict(state_dict)
        self._share()


def make_optimizer(cfg: TrainConfig, params: Iterable[torch.nn.Parameter],
                   hidden: Collection[torch.Tensor] = ()) -> torch.optim.Optimizer:
    """``torch.optim.SGD(lr, momentum, weight_decay)``, ``torch.optim.Adam(lr, weight_decay)`` or, for ``muon``,
    :class:`MuonAdam` with Muon on those of ``params`` that are in ``hidden`` (the same objects: the model's
    :func:`hidden_matrices`) and Adam on the others.

    Adam's betas and eps are PyTorch's defaults; ``cfg.momentum`` only applies to SGD. A stage without
    parameters (only pooling or flattening layers, e.g. AlexNet's ``MaxPool2d, AdaptiveAvgPool2d, Flatten``)
    gets an optimizer of one empty tensor, so its ``STEP`` does nothing (PyTorch refuses an empty list).
    """
    params = list(params) or [torch.zeros(0, requires_grad=True)]
    if cfg.optimizer == "muon":
        ids = {id(t) for t in hidden}
        return MuonAdam([p for p in params if id(p) in ids], [p for p in params if id(p) not in ids],
                        lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
