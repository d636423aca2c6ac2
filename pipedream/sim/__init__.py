"""The cluster simulator: time PipeDream, GPipe, 2BW, PipeDream-Flush, data parallelism and torch's schedules (interleaved,
zero-bubble, V-shaped: :mod:`pipedream.torch_schedules`) on a modelled cluster.

Public API (from :mod:`.simulate`): :func:`simulate_plan`, :func:`simulate_dp`, :func:`simulate_stages`,
:func:`run_minibatches`, :class:`SimOptions`, :class:`SimResult`. Its parts: links with per-level bandwidth, latency and
contention (:mod:`.network`), the cost of every action from a layer profile or from measured stage times,
DDP gradient buckets and the optimizer step included (:mod:`.costs`), and the event loop that times the
per-rank action lists of :mod:`pipedream.schedules` (:mod:`.engine`). Every time is one of
:mod:`pipedream.costmodel`'s, the formulas the planner and the runtime use too.
"""

from pipedream.sim.simulate import (
    DEFAULT_ALLREDUCE,
    IMAGENET_TRAIN_SAMPLES,
    SCHEDULES,
    SimOptions,
    SimResult,
    build_schedule,
    extrapolate,
    run_minibatches,
    simulate_dp,
    simulate_plan,
    simulate_stages,
    torch_stage_ranks,
)

__all__ = ["DEFAULT_ALLREDUCE", "IMAGENET_TRAIN_SAMPLES", "SCHEDULES", "SimOptions", "SimResult", "build_schedule", "extrapolate",
           "run_minibatches", "simulate_dp", "simulate_plan", "simulate_stages", "torch_stage_ranks"]
