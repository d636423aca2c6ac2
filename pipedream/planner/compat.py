"""The release optimizer's cost formulas, used only by compat mode (``--compat``).

These are the terms of ``optimizer/optimizer_graph_hierarchical.py`` of the PipeDream release, named as
its variables are, kept exactly (operation order included) so that compat mode reproduces its predicted
times to the last bit (``tests/test_planner_compat.py``). Default mode prices the same things with the one
cost model, :mod:`pipedream.costmodel` (ring allreduce with a per-step latency, ``latency + S / B``
transfers); see :mod:`pipedream.planner` for why the two differ.

All functions take numpy arrays or floats (they broadcast) and return seconds.
"""

from __future__ import annotations

import numpy as np


def data_parallel_communication_time(param_bytes: float | np.ndarray, replicas: int | np.ndarray, bandwidth_Bps: float,
                                     group: float = 1.0) -> np.ndarray:
    """The release's weight sync of a stage replicated ``replicas`` (``m``) times: ``4 (m - 1) P / (B m) / g``.

    The release writes it ``4 m' P / (B (m' + 1))`` with ``m' = m - 1`` (its index of ``m`` workers) and
    divides by ``num_machines_within_machine`` (``g``, the width of the level below) for an unsplit
    segment (and, for the last stage of a split, in default mode only: difference 3); 4 counts each byte
    sent and received twice (reduce and broadcast through a parameter server).
    """
    replicas = np.asarray(replicas, dtype=np.float64)
    return 4.0 * (replicas - 1) * param_bytes / (bandwidth_Bps * replicas) / group


def transfer_time(activation_bytes: float | np.ndarray, replicas: int | np.ndarray, bandwidth_Bps: float,
                  compression_ratio: float) -> float | np.ndarray:
    """The release's ``input_transfer_time`` / ``output_transfer_time`` of a stage on ``m'`` replicas:
    ``2 a / (B m') / c`` (activations forward, their gradients backward, ``c`` the compression ratio)."""
    return 2.0 * activation_bytes / (bandwidth_Bps * replicas) / compression_ratio


def data_parallel_total_time(compute_s: float, param_bytes: float, levels: list[tuple[int, float, float]]) -> float:
    """The release's data-parallel baseline per minibatch, level by level, innermost first:
    ``t = (t + 4 (M - 1) P / (B M) / g) / M`` for levels ``(M, B, g)``, starting from the model's compute."""
    t = compute_s
    for workers, bandwidth, group in levels:
        t = (t + 4.0 * (workers - 1) * param_bytes / (bandwidth * workers) / group) / workers
    return t
