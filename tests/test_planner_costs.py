"""The planner prices weight sync and transfers with the one cost model (default mode) or the release's
formulas (compat mode): the vectorised recurrence's terms against pipedream.costmodel's scalar functions
and against the release's formulas written out by hand."""

from __future__ import annotations

import itertools
import math

import numpy as np

from pipedream import costmodel
from pipedream.planner.hierarchy import level_rules
from pipedream.planner.recurrence import activation_s, weight_sync_s
from pipedream.topology import Cluster

CLUSTER = Cluster("two", [(4, 10e9), (2, 1e9)], 16e9)


def test_array_variants_equal_the_scalar_cost_model() -> None:
    sizes = np.array([0.0, -5.0, 1.0, 3e6, 7.5e8])
    ranks = np.array([1, 2, 3, 8])
    got = costmodel.ring_allreduce_s_array(sizes[:, None], ranks[None, :], 2e9, 1e-5)
    for (i, s), (j, n) in itertools.product(enumerate(sizes), enumerate(ranks)):
        assert got[i, j] == costmodel.ring_allreduce_s(float(s), int(n), 2e9, 1e-5)
    sent = costmodel.transfer_s_array(sizes, 2e9, 1e-5)
    assert list(sent) == [costmodel.transfer_s(float(s), 2e9, 1e-5) for s in sizes]
    assert list(costmodel.transfer_s_array(sizes, float("inf"), 1e-5)) == [0.0] * len(sizes)
    tensors = np.array([0, 1, 3, 64, 161])
    for rates in (costmodel.StepRates(), costmodel.StepRates("adam", 1.6e-9, 5e-4, 4.5e-5),
                  costmodel.StepRates("sgd", memory_Bps=None)):
        for cow in (False, True):
            got = np.broadcast_to(rates.seconds_array(sizes[:, None], tensors[None, :], cow), (len(sizes), len(tensors)))
            for (i, s), (j, n) in itertools.product(enumerate(sizes), enumerate(tensors)):
                assert got[i, j] == costmodel.optimizer_step_s(float(s), rates.optimizer, rates.memory_Bps,
                                                               rates.s_per_param_byte, cow, int(n), rates.s_per_tensor,
                                                               rates.s_per_call)
    # by hand: Adam over 1 MB in 3 tensors with copy on write (10 bytes moved per byte against 8)
    one = costmodel.StepRates("adam", 1.6e-9, 5e-4, 4.5e-5).seconds_array(np.array(1e6), np.array(3), True)
    assert math.isclose(float(one), 5e-4 + 3 * 4.5e-5 + 1.6e-9 * 1e6 * 10 / 8, rel_tol=1e-12)


def test_default_mode_charges_a_ring_allreduce_and_transfers_with_latency() -> None:
    inner, outer = level_rules(CLUSTER, compat=False, memory_limit=False, straight=False, ratio=None)
    lat = costmodel.DEFAULT_STEP_LATENCY_S
    assert CLUSTER.latency_s == lat and outer.latency_s == lat
    # 3 replicas inside a server: 2 (n - 1) L + 2 (n - 1) / n * P / B, by hand
    assert weight_sync_s(inner, 6e8, 3, 1.0) == 2 * 2 * lat + 2 * 2 / 3 * 6e8 / 10e9
    # 2 servers, 4 devices each carry a quarter of the gradient across
    assert weight_sync_s(outer, 8e8, 2, 4.0) == 2 * lat + 2 * 1 / 2 * 2e8 / 1e9
    assert weight_sync_s(inner, 6e8, 1, 1.0) == 0.0
    # activations one way and gradients back, on one of 2 replicas
    assert activation_s(inner, 1e8, 2) == 2 * (lat + 1e8 / 10e9) / 2
    assert activation_s(inner, 0.0, 2) == 0.0


def test_compat_mode_keeps_the_release_formulas() -> None:
    inner, outer = level_rules(CLUSTER, compat=True, memory_limit=False, straight=False, ratio=2.0)
    assert weight_sync_s(inner, 6e8, 3, 1.0) == 4.0 * 2 * 6e8 / (10e9 * 3) / 1.0
    assert weight_sync_s(outer, 8e8, 2, 4.0) == 4.0 * 1 * 8e8 / (1e9 * 2) / 4.0
    assert activation_s(inner, 1e8, 2) == 2.0 * 1e8 / (10e9 * 2) / 2.0


def test_latency_of_a_cluster_that_gives_one() -> None:
    c = Cluster("l", [(2, 1e9)], 1e9, latency_s=5e-6)
    (rules,) = level_rules(c, compat=False, memory_limit=False, straight=False, ratio=None)
    assert weight_sync_s(rules, 1e9, 2, 1.0) == 2 * 5e-6 + 1e9 / 1e9
