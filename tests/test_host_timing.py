"""The host's measurements of a training step: copies at once against each alone, and where copies land."""

from __future__ import annotations

import time

import pytest

import pipedream.host_timing as host_timing
from pipedream.host_timing import Sharing, host_contention


def _sleep() -> None:
    time.sleep(0.005)


def test_copies_of_a_step_that_only_sleeps_contend_for_nothing() -> None:
    """Forked copies sleeping 5 ms a step: together as fast as alone, and each as fast as this process."""
    got = host_contention(_sleep, lambda: _sleep, 2, seconds=0.6, rounds=2)
    assert 0.8 < got.slowdown < 1.3
    assert len(got.placements) == 4  # two copies in each of two rounds
    assert all(0.7 < p < 1.4 for p in got.placements)
    assert 0.004 < got.alone_s < 0.008


def test_one_copy_measures_nothing() -> None:
    assert host_contention(_sleep, lambda: _sleep, 1) == Sharing(1.0, (), 0.0)


@pytest.mark.parametrize(("processes", "slowdown"), [(2, 2.4), (4, 1.2), (3, 1.6)])
def test_the_ratio_is_each_copy_against_itself_over_its_fair_share(monkeypatch: pytest.MonkeyPatch,
                                                                   processes: int, slowdown: float) -> None:
    """Copies that step 1.5 ms alone (this process: 1 ms) and 3.6 ms together: 2.4x themselves. With one copy per
    core (2 on 2 cores) that is all contention; with two per core (4 on 2) each gets half a core, which
    processor sharing already explains: 2.4 / 2 = 1.2; 3 copies on 2 cores: 2.4 / 1.5 = 1.6. Their placement is
    1.5x this process's, and does not enter the ratio."""
    monkeypatch.setattr(host_timing.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(host_timing, "_mean_step_s", lambda step, seconds, min_steps: 1e-3)
    monkeypatch.setattr(host_timing, "_together_then_alone",
                        lambda fresh, n, seconds, min_steps: [(3.6e-3, 1.5e-3)] * n)
    got = host_contention(lambda: None, lambda: lambda: None, processes, rounds=3)
    assert got.slowdown == pytest.approx(slowdown)
    assert got.placements == pytest.approx((1.5,) * (3 * processes))
    assert got.alone_s == pytest.approx(1.5e-3)


def test_the_rounds_median_keeps_a_burst_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three rounds measure 1.1, 3.0 (another process burst in) and 1.2: the slowdown is 1.2."""
    monkeypatch.setattr(host_timing.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(host_timing, "_mean_step_s", lambda step, seconds, min_steps: 1.0)
    rounds = iter([1.1, 3.0, 1.2])
    monkeypatch.setattr(host_timing, "_together_then_alone",
                        lambda fresh, n, seconds, min_steps: [(next(rounds), 1.0)] * 1)
    assert host_contention(lambda: None, lambda: lambda: None, 2, rounds=3).slowdown == pytest.approx(1.2)
