"""What a profile's ``meta.json`` says beyond the layers, as the prediction (:mod:`pipedream.sim.predict`) takes
it: the optimizer step's rate, the time to load a minibatch, a whole step over the layers' sum, and the host
(contention, oversubscription, memory layouts, message CPU). A missing measurement (the release's profiles,
another host) is no cost and no slowdown."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipedream import costmodel
from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph, read_meta
from pipedream.sim import layout


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
    profiled minibatch); 1.0 without a step (the release's profiles) or when the layers sum to nothing.

    The step is ``meta.json`` ``host.copy_step_s`` where the profile has it: the mean step of every fresh copy the
    host probe timed alone, over all its rounds (:mod:`pipedream.host_timing`; a minute or more of the profile,
    where a shared machine's speed drifts by tens of percent within seconds: on the 2-core CI machine the reduced
    VGG-16's ``whole_step_s``, one 2.5 s window, was 123 ms and its copies' mean 109 ms, and the runs of one ``make
    run`` agreed with the copies). Else ``whole_step_s``, the profiling process's own step
    (:func:`pipedream.profiler.whole_step_s`)."""
    host = meta.get("host")
    copy = host.get("copy_step_s") if isinstance(host, dict) else None
    value = copy if isinstance(copy, int | float) and copy > 0 else meta.get("whole_step_s")
    t = graph.totals()
    layers = t["fwd_s"] + t["bwd_s"]
    return float(value) / layers if isinstance(value, int | float) and value > 0 and layers > 0 else 1.0


def profiled_host(meta: dict[str, Any], cores: int | None) -> dict[str, Any]:
    """The profile's measurements of its host (``meta``: its ``meta.json``, ``host``) as
    :func:`pipedream.sim.predict.predict_epoch`'s keywords, if they were taken on a host of ``cores`` cores (taken as
    this host): ``contention`` and ``oversubscribed`` (:func:`pipedream.host_timing.host_contention`; at least 1.0, a
    measurement below 1 is noise: other copies cannot speed a step up), ``layouts`` (the same measurement's fresh
    copies, positive ratios; over their mean where the profile has ``copy_step_s``, which :func:`profiled_composition`
    already takes as the typical copy's step), ``message_s`` and ``message_s_per_byte``
    (:mod:`pipedream.runtime.message_cost`; at least 0), ``allreduce_s`` (:mod:`pipedream.runtime.allreduce_cost`:
    member count -> ``(fixed_s, per_byte_s)``, each at least 0; counts below 2 and malformed entries left out). What
    is missing (another host, GPUs, the release's profiles) is no slowdown: contention 1.0, oversubscribed None, no
    layouts, free messages, no measured allreduce (an empty table: estimated from the message cost)."""
    host = meta.get("host")
    if cores is None or not isinstance(host, dict) or host.get("cores") != cores:
        host = {}

    def number(key: str, floor: float) -> float | None:
        value = host.get(key)
        return max(floor, float(value)) if isinstance(value, int | float) else None

    draws = host.get("layouts")
    layouts = tuple(float(p) for p in draws if isinstance(p, int | float) and p > 0) if isinstance(draws, list) else ()
    if layouts and isinstance(host.get("copy_step_s"), int | float):  # the typical copy is in the composition
        layouts = layout.spread(layouts)[1]
    table = host.get("allreduce_s")
    allreduce: dict[int, tuple[float, float]] = {}
    for members, line in (table.items() if isinstance(table, dict) else ()):
        if (str(members).isdigit() and int(members) >= 2 and isinstance(line, list) and len(line) == 2
                and all(isinstance(x, int | float) for x in line)):
            allreduce[int(members)] = (max(0.0, float(line[0])), max(0.0, float(line[1])))
    return {"contention": number("contention", 1.0) or 1.0, "oversubscribed": number("oversubscribed", 1.0),
            "message_s": number("message_s", 0.0) or 0.0, "message_s_per_byte": number("message_s_per_byte", 0.0) or 0.0,
            "allreduce_s": allreduce, "layouts": layouts}
