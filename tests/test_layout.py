"""Each rank's copy of the model as a draw of its memory layout (pipedream/sim/layout.py) and the
prediction averaged over the draws (pipedream/sim/predict.py)."""

from __future__ import annotations

import statistics

import pytest

from pipedream.sim.costs import StageCost
from pipedream.sim.layout import rank_factor_samples, scaled, spread
from pipedream.sim.predict import EpochShape, predict_epoch, profiled_host
from pipedream.topology import Cluster
from tests.test_predict import chain


def test_spread_is_the_mean_and_the_draws_over_it() -> None:
    assert spread([0.9, 1.1, 1.0]) == (pytest.approx(1.0), pytest.approx((0.9, 1.1, 1.0)))
    assert spread([2.0, 2.0]) == (2.0, (1.0, 1.0))
    assert spread([]) == (1.0, ())


def test_every_rank_draws_its_own_copy() -> None:
    """Draws 0.9 and 1.1: each rank of each sample gets one of them, independently, half the time each."""
    samples = rank_factor_samples((0.9, 1.1), [0, 3, 5], samples=8000)
    assert all(set(s) == {0, 3, 5} and set(s.values()) <= {0.9, 1.1} for s in samples)
    for r in (0, 3, 5):
        assert statistics.fmean(s[r] for s in samples) == pytest.approx(1.0, abs=0.006)
    both_slow = statistics.fmean(s[0] == s[3] == 1.1 for s in samples)
    assert both_slow == pytest.approx(0.25, abs=0.015)  # independent draws
    assert samples[:5] == rank_factor_samples((0.9, 1.1), [0, 3, 5], samples=5)  # a fixed seed: reproducible
    assert rank_factor_samples((), [3, 1]) == [{3: 1.0, 1: 1.0}]


def test_scaled_multiplies_compute_not_bytes() -> None:
    c = StageCost(fwd_s=1.0, bwd_s=2.0, send_fwd_bytes=4.0, send_bwd_bytes=0.0, param_bytes=8.0, buckets=[(0.5, 8.0)])
    (got,) = scaled([c], [1.5])
    assert (got.fwd_s, got.bwd_s, got.buckets, got.param_bytes, got.send_fwd_bytes) == (1.5, 3.0, [(0.75, 8.0)], 8.0, 4.0)


def test_with_a_core_each_replicas_wait_for_their_slowest_draw() -> None:
    """Lock-step DP of 2 ranks without weights on 2 cores (no sharing): 4 minibatches, 2 per rank, of F + B =
    2 x (1 + 2) = 6 s: 12 s at the mean copy. Recorded copies 0.5x and 1.5x the profiled process (mean 1.0): in
    each simulated epoch both ranks step at the slower rank's pace, 12 s times the larger of their two draws, so
    the prediction is 12 s times the mean of those maxima over the samples; the per-stage compute is the mean
    copy's."""
    g = chain(2, 1.0, 2.0)
    args = (g, [["node1", "node2"]], [[0, 1]], Cluster("c", [(2, 1e9)]), EpochShape("dp", 8, 1, 4, 32))
    plain = predict_epoch(*args, cores=2)
    drawn = predict_epoch(*args, cores=2, layouts=(0.5, 1.5))
    slowest = statistics.fmean(max(s.values()) for s in rank_factor_samples((0.5, 1.5), [0, 1]))
    assert plain.epoch_s == pytest.approx(12.0)
    assert drawn.epoch_s == pytest.approx(12.0 * slowest)
    assert 1.1 < slowest < 1.4
    assert drawn.compute_s == pytest.approx(plain.compute_s)
    # copies all 2x the profiled one: every layer twice as long, as a composition of 2 would make it
    assert predict_epoch(*args, cores=2, layouts=(2.0, 2.0)).epoch_s == pytest.approx(24.0)


def test_sharing_one_core_the_slow_copy_takes_the_fast_ones_idle_share() -> None:
    """The same DP on one core: both ranks compute at half speed until the faster is done and waits in the
    allreduce (using no core), then the slower runs alone at full speed, so the core never idles and each step
    takes the two ranks' work, 6 f_0 + 6 f_1 s (F + B of 2 layers); 2 steps: 12 (f_0 + f_1) s per sample (24 s at
    the mean copy), not 24 max(f_0, f_1) s (every replica at its slowest's draw, the first version's model: 1.25x
    the mean copy for these draws)."""
    g = chain(2, 1.0, 2.0)
    args = (g, [["node1", "node2"]], [[0, 1]], Cluster("c", [(2, 1e9)]), EpochShape("dp", 8, 1, 4, 32))
    assert predict_epoch(*args, cores=1).epoch_s == pytest.approx(24.0)
    drawn = predict_epoch(*args, cores=1, layouts=(0.5, 1.5))
    by_hand = statistics.fmean(12.0 * (s[0] + s[1]) for s in rank_factor_samples((0.5, 1.5), [0, 1]))
    assert drawn.epoch_s == pytest.approx(by_hand)
    assert by_hand == pytest.approx(24.0, rel=0.1)  # the mean copy's, up to the samples' own spread


def test_layouts_come_from_a_profile_of_this_host_only() -> None:
    meta = {"host": {"cores": 2, "contention": 1.1, "layouts": [0.9, 1.2, "x", -1]}}
    assert profiled_host(meta, 2)["layouts"] == (0.9, 1.2)
    assert profiled_host(meta, 4)["layouts"] == ()
    assert profiled_host({}, 2)["layouts"] == ()
    # with the copies' mean step in the profile (the composition's step), only their spread is drawn: over their mean
    typical = {"host": {"cores": 2, "layouts": [0.9, 1.2], "copy_step_s": 0.1}}
    assert profiled_host(typical, 2)["layouts"] == pytest.approx((0.9 / 1.05, 1.2 / 1.05))
