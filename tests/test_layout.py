"""Each rank's copy of the model as a draw of its memory layout (pipedream/sim/layout.py) and the
prediction averaged over the draws (pipedream/sim/predict.py)."""

from __future__ import annotations

import statistics

import pytest

from pipedream.sim.costs import StageCost
from pipedream.sim.layout import scaled, spread, stage_factor_samples
from pipedream.sim.predict import EpochShape, predict_epoch
from pipedream.sim.profiled import profiled_host
from pipedream.topology import Cluster
from tests.test_predict import chain


def test_spread_is_the_mean_and_the_draws_over_it() -> None:
    assert spread([0.9, 1.1, 1.0]) == (pytest.approx(1.0), pytest.approx((0.9, 1.1, 1.0)))
    assert spread([2.0, 2.0]) == (2.0, (1.0, 1.0))
    assert spread([]) == (1.0, ())


def test_a_stage_runs_at_its_slowest_replicas_draw() -> None:
    """Draws 0.9 and 1.1: one replica averages 1.0; two average 1.1 unless both draw 0.9 (1/4): 1.05; three
    1.1 - 0.2 / 8 = 1.075."""
    samples = stage_factor_samples((0.9, 1.1), [1, 2, 3], samples=8000)
    means = [statistics.fmean(s[i] for s in samples) for i in range(3)]
    assert means == pytest.approx([1.0, 1.05, 1.075], abs=0.006)
    assert samples[:5] == stage_factor_samples((0.9, 1.1), [1, 2, 3], samples=5)  # a fixed seed: reproducible
    assert stage_factor_samples((), [3, 1]) == [[1.0, 1.0]]


def test_scaled_multiplies_compute_not_bytes() -> None:
    c = StageCost(fwd_s=1.0, bwd_s=2.0, send_fwd_bytes=4.0, send_bwd_bytes=0.0, param_bytes=8.0, buckets=[(0.5, 8.0)])
    (got,) = scaled([c], [1.5])
    assert (got.fwd_s, got.bwd_s, got.buckets, got.param_bytes, got.send_fwd_bytes) == (1.5, 3.0, [(0.75, 8.0)], 8.0, 4.0)


def test_the_epoch_is_the_mean_over_draws_of_the_slowest_replica() -> None:
    """Lock-step DP of 2 ranks without weights on 2 cores (no sharing): 4 minibatches, 2 per rank, of F + B =
    2 x (1 + 2) = 6 s: 12 s at the mean copy. Recorded copies 0.5x and 1.5x the profiled process (mean 1.0): each
    simulated epoch is 12 s times the slower of its two ranks' draws, so the prediction is 12 s times the mean of
    those maxima (1.25 in the limit); the per-stage compute is the mean copy's."""
    g = chain(2, 1.0, 2.0)
    args = (g, [["node1", "node2"]], [[0, 1]], Cluster("c", [(2, 1e9)]), EpochShape("dp", 8, 1, 4, 32))
    plain = predict_epoch(*args, cores=2)
    drawn = predict_epoch(*args, cores=2, layouts=(0.5, 1.5))
    slowest = statistics.fmean(f for (f,) in stage_factor_samples((0.5, 1.5), [2]))
    assert plain.epoch_s == pytest.approx(12.0)
    assert drawn.epoch_s == pytest.approx(12.0 * slowest)
    assert 1.1 < slowest < 1.4
    assert drawn.compute_s == pytest.approx(plain.compute_s)
    # copies all 2x the profiled one: every layer twice as long, as a composition of 2 would make it
    assert predict_epoch(*args, cores=2, layouts=(2.0, 2.0)).epoch_s == pytest.approx(24.0)


def test_layouts_come_from_a_profile_of_this_host_only() -> None:
    meta = {"host": {"cores": 2, "contention": 1.1, "layouts": [0.9, 1.2, "x", -1]}}
    assert profiled_host(meta, 2)["layouts"] == (0.9, 1.2)
    assert profiled_host(meta, 4)["layouts"] == ()
    assert profiled_host({}, 2)["layouts"] == ()
    # with the copies' mean step in the profile (the composition's step), only their spread is drawn: over their mean
    typical = {"host": {"cores": 2, "layouts": [0.9, 1.2], "copy_step_s": 0.1}}
    assert profiled_host(typical, 2)["layouts"] == pytest.approx((0.9 / 1.05, 1.2 / 1.05))
