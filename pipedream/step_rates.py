"""How fast an optimizer steps on this host: seconds per parameter byte of SGD's, Adam's and Muon's step, timed
as a worker steps (``meta.json`` ``optimizer_step_s_per_param_byte``; read back by
:func:`pipedream.sim.profiled.step_rate`).

A step is not all per byte: it is one call that walks its tensors one by one, so a stage of many small tensors
steps slower than its bytes say (:func:`pipedream.costmodel.optimizer_step_s`). :func:`step_overheads` times
SGD's and Adam's step over one and over :data:`OVERHEAD_TENSORS` one-element tensors (``meta.json``
``optimizer_step_overheads``: seconds per call and per tensor), and :func:`split_step` makes the per-byte rate
what is left of the whole model's step, so that a step over the whole model (DDP's) costs what it was timed at
and a stage's step its share of the calls, the tensors and the bytes."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from pipedream.capture import call_model, tensors, to_device
from pipedream.errors import PipeDreamError
from pipedream.profiler import ProfileSettings, _timed
from pipedream.runtime.config import OPTIMIZERS, TrainConfig
from pipedream.runtime.optim import hidden_matrices, make_optimizer

# seconds of timed steps per optimizer after which a slow one stops (at least two timed; :func:`_timed`): SGD's and
# Adam's steps on the reduced models take milliseconds and keep all their iterations, Muon's take seconds on a CPU
STEP_BUDGET_S = 2.0
# one-element tensors of the second of step_overheads' two timed steps (the first steps over one)
OVERHEAD_TENSORS = 64
# optimizers whose per-call and per-tensor overheads are timed (:func:`step_overheads`): Muon's step is compute on
# its hidden matrices, its rate stays per byte
OVERHEAD_TIMED = ("sgd", "adam")


def trainable_bytes(model: nn.Module) -> int:
    """Bytes of ``model``'s parameters that require a gradient: what an optimizer step walks, and the bytes a step
    time is divided by for its rate (:func:`optimizer_step_rates`)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def trainable_tensors(model: nn.Module) -> int:
    """How many parameter tensors of ``model`` require a gradient: what an optimizer step walks one by one."""
    return sum(1 for p in model.parameters() if p.requires_grad)


def optimizer_step_rates(model: nn.Module, example_input: Any, settings: ProfileSettings | None = None,
                         optimizers: Sequence[str] = OPTIMIZERS) -> dict[str, float]:
    """Seconds per parameter byte of one optimizer step over all of ``model``'s parameters, per optimizer.

    Each of ``optimizers`` (default every one the runtime trains with, built as
    :func:`pipedream.runtime.optim.make_optimizer` builds them at TrainConfig's defaults) steps on a copy of the
    model (``model`` is left as it is), right after a forward and backward of ``example_input`` (loss: the sum of
    the floating-point outputs), as in training: the backward leaves the caches full of activations, so the step
    reads its weights, gradients and state from memory, not from a cache warmed by the previous step. ``max(1,
    warmup)`` untimed iterations (the first step creates the optimizer's state), then the median of ``iters``
    timed steps (fewer, at least two, for a step slower than :data:`STEP_BUDGET_S` in all), divided by the
    parameter bytes. The step is memory bound (:data:`pipedream.costmodel.STEP_TRAFFIC`), so the rate carries
    over to a stage's share of the parameters; Muon's Newton-Schulz iterations are compute on the hidden
    matrices, so its rate carries over to stages holding about the model's share of them.

    Returns:
        ``{"sgd": s_per_byte, "adam": s_per_byte, "muon": s_per_byte}`` (the keys are ``optimizers``); empty for a
        model without parameters.
    Raises:
        PipeDreamError: an optimizer the runtime does not have.
    """
    unknown = [name for name in optimizers if name not in OPTIMIZERS]
    if unknown:
        raise PipeDreamError(f"no optimizer-step rate for {', '.join(unknown)}: the profile times "
                             f"{', '.join(OPTIMIZERS)}")
    settings = settings or ProfileSettings()
    device = torch.device(settings.device)
    inputs = to_device(example_input, device)
    timing = ProfileSettings(**{**vars(settings), "warmup": max(1, settings.warmup)})  # the first step makes state
    if not any(p.requires_grad for p in model.parameters()):
        return {}
    return {name: _step_rate(copy.deepcopy(model).to(device).train(), inputs, name, timing) for name in optimizers}


def _step_rate(net: nn.Module, inputs: Any, optimizer: str, timing: ProfileSettings) -> float:
    """Seconds per parameter byte of ``optimizer``'s step on ``net``, each timed step right after a forward and
    backward (:func:`optimizer_step_rates`)."""
    params = [p for p in net.parameters() if p.requires_grad]
    hidden = hidden_matrices(net, inputs) if optimizer == "muon" else ()  # only Muon splits its parameters
    opt = make_optimizer(TrainConfig(optimizer=optimizer), params, hidden)

    def forward_backward() -> None:
        opt.zero_grad(set_to_none=False)
        backward_through = _forward_backward(net, inputs)
        for p in params:
            if p.grad is None or not backward_through:
                p.grad = torch.randn_like(p)

    def step(_: None) -> None:  # what a worker's STEP does besides copy on write: update, then zero the gradients
        opt.step()
        opt.zero_grad(set_to_none=False)

    return _timed(step, timing, prepare=forward_backward, budget_s=STEP_BUDGET_S) / trainable_bytes(net)


def _forward_backward(net: nn.Module, inputs: Any) -> bool:
    """A forward of ``inputs`` through ``net`` and a backward of the sum of its floating-point outputs that need a
    gradient (the caches left as a training step leaves them); False when no output needs one (no backward)."""
    outs = [t for t in tensors(call_model(net, inputs)) if t.is_floating_point() and t.requires_grad]
    if outs:
        torch.autograd.backward([t.float().sum() for t in outs])
    return bool(outs)


def step_overheads(model: nn.Module, example_input: Any, settings: ProfileSettings | None = None,
                   optimizers: Sequence[str] = OVERHEAD_TIMED) -> dict[str, tuple[float, float]]:
    """Per optimizer, the seconds of one step call and of each tensor it walks, apart from the bytes.

    Each of ``optimizers`` (those of :data:`OVERHEAD_TIMED` among them) steps over one and over
    :data:`OVERHEAD_TENSORS` one-element tensors, each step timed as :func:`optimizer_step_rates` times one (right
    after a forward and backward of ``example_input`` through a copy of ``model``). With ``t_1`` and ``t_K`` those
    medians, the per-tensor seconds are ``a = (t_K - t_1) / (K - 1)`` and the per-call seconds ``c = t_1 - a``,
    each at least 0.

    Returns:
        ``{name: (s_per_call, s_per_tensor)}``; empty for a model without trained parameters.
    """
    settings = settings or ProfileSettings()
    if not any(p.requires_grad for p in model.parameters()):
        return {}
    device = torch.device(settings.device)
    inputs = to_device(example_input, device)
    timing = ProfileSettings(**{**vars(settings), "warmup": max(1, settings.warmup)})
    net = copy.deepcopy(model).to(device).train()

    def forward_backward() -> None:  # evicts the caches as a training step does; the model's gradients are dropped
        _forward_backward(net, inputs)
        net.zero_grad(set_to_none=True)

    out = {}
    for name in (n for n in optimizers if n in OVERHEAD_TIMED):
        times = []
        for k in (1, OVERHEAD_TENSORS):
            tiny = [torch.zeros(1, device=device, requires_grad=True) for _ in range(k)]
            for t in tiny:
                t.grad = torch.ones_like(t)
            opt = make_optimizer(TrainConfig(optimizer=name), tiny)

            def step(_: None, opt: torch.optim.Optimizer = opt) -> None:
                opt.step()
                opt.zero_grad(set_to_none=False)

            times.append(_timed(step, timing, prepare=forward_backward))
        per_tensor = max(0.0, (times[1] - times[0]) / (OVERHEAD_TENSORS - 1))
        out[name] = (max(0.0, times[0] - per_tensor), per_tensor)
    return out


def split_step(step_s: float, param_bytes: float, tensors: int, s_per_call: float,
               s_per_tensor: float) -> tuple[float, float, float]:
    """Split a whole model's step of ``step_s`` seconds over ``param_bytes`` bytes in ``tensors`` tensors into
    ``(s_per_call, s_per_tensor, s_per_param_byte)`` with the per-call and per-tensor seconds of
    :func:`step_overheads`: the per-byte rate is what is left, ``(step_s - c - a * tensors) / param_bytes``, so
    that :func:`pipedream.costmodel.optimizer_step_s` over the whole model gives ``step_s`` back. Where the
    overheads alone exceed the step (a model of a few tiny tensors, or a noisy timing), both are scaled down to
    fill it and the rate per byte is 0.

    Raises:
        PipeDreamError: a non-positive step, bytes or tensor count, or a negative overhead.
    """
    if step_s <= 0 or param_bytes <= 0 or tensors < 1 or s_per_call < 0 or s_per_tensor < 0:
        raise PipeDreamError(f"cannot split a step of {step_s} s over {param_bytes} bytes in {tensors} tensors with "
                             f"{s_per_call} s a call and {s_per_tensor} s a tensor")
    overhead = s_per_call + s_per_tensor * tensors
    if overhead <= step_s:
        return s_per_call, s_per_tensor, (step_s - overhead) / param_bytes
    fill = step_s / overhead
    return s_per_call * fill, s_per_tensor * fill, 0.0
