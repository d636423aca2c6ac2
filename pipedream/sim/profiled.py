"""What a profile's ``meta.json`` says beyond the layers, as the prediction (:mod:`pipedream.sim.predict`) takes
it: the optimizer step's rate, the time to load a minibatch and a whole step over the layers' sum. A missing
measurement (the release's profiles) is no cost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipedream import costmodel
from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph, read_meta


def step_rate(meta: dict[str, Any], optimizer: str) -> float | None:
    """The profile's measured optimizer-step seconds per parameter byte for ``optimizer`` (``meta``: its
    ``meta.json``, ``optimizer_step_s_per_param_byte``, :func:`pipedream.step_rates.optimizer_step_rates`); None
    if absent."""
    rates = meta.get("optimizer_step_s_per_param_byte") or {}
    value = rates.get(optimizer) if isinstance(rates, dict) else None
    return float(value) if isinstance(value, int | float) and value > 0 else None


def step_overheads(meta: dict[str, Any], optimizer: str) -> tuple[float, float]:
    """The profile's seconds per step call and per parameter tensor for ``optimizer`` (``meta``: its ``meta.json``,
    ``optimizer_step_overheads``, :func:`pipedream.step_rates.step_overheads` and
    :func:`pipedream.step_rates.split_step`): ``(s_per_call, s_per_tensor)``, ``(0.0, 0.0)`` if absent (older
    profiles, whose rate per byte is the whole step's, and Muon)."""
    record = meta.get("optimizer_step_overheads") or {}
    record = record.get(optimizer) if isinstance(record, dict) else None
    if not isinstance(record, dict):
        return 0.0, 0.0
    values = [record.get(k) for k in ("s_per_call", "s_per_tensor")]
    call_s, tensor_s = (float(v) if isinstance(v, int | float) and v > 0 else 0.0 for v in values)
    return call_s, tensor_s


def step_rates(meta: dict[str, Any], optimizer: str) -> costmodel.StepRates:
    """How the profile prices ``optimizer``'s step, as the planner takes it: its measured seconds per byte, per call
    and per tensor (:func:`step_rate`, :func:`step_overheads`) where it timed them, else the cost model's
    memory-bound estimate (:class:`pipedream.costmodel.StepRates`).

    Raises:
        PipeDreamError: an optimizer the cost model does not know.
    """
    if optimizer not in costmodel.STEP_TRAFFIC:
        raise PipeDreamError(f"unknown optimizer {optimizer!r}; use one of {', '.join(costmodel.STEP_TRAFFIC)}")
    call_s, tensor_s = step_overheads(meta, optimizer)
    return costmodel.StepRates(optimizer, step_rate(meta, optimizer), call_s, tensor_s)


def missing_step_rate(profile: str | Path, optimizer: str) -> bool:
    """Whether the profile at ``profile`` timed some optimizers' steps but not ``optimizer``'s (``pipedream profile
    --optimizers``): a prediction then leaves the step out. False for a profile that times none (the release's)."""
    meta = read_meta(profile)
    rates = meta.get("optimizer_step_s_per_param_byte")
    return isinstance(rates, dict) and bool(rates) and step_rate(meta, optimizer) is None


def profiled_data_s(meta: dict[str, Any]) -> float:
    """The profile's seconds to load one profiled minibatch (``meta``: its ``meta.json``, ``data_s``,
    :func:`pipedream.profiler.data_load_s`); 0.0 if absent (the release's profiles)."""
    value = meta.get("data_s")
    return float(value) if isinstance(value, int | float) and value > 0 else 0.0


def profiled_composition(meta: dict[str, Any], graph: LayerGraph) -> float:
    """A whole training step's time over the sum of the profile's layer times (forward and backward, at the
    profiled minibatch: ``meta.json`` ``whole_step_s`` over them, :func:`pipedream.profiler.whole_step_s`); 1.0
    without a step (the release's profiles) or when the layers sum to nothing."""
    value = meta.get("whole_step_s")
    t = graph.totals()
    layers = t["fwd_s"] + t["bwd_s"]
    return float(value) / layers if isinstance(value, int | float) and value > 0 and layers > 0 else 1.0
