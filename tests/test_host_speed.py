"""The host's speed when a run starts against the profile's (pipedream/host_speed.py), and the prediction it scales."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

import pipedream.host_speed as host_speed
from pipedream.commands.train import _predict
from pipedream.graph import LayerGraph, Node
from pipedream.host_speed import Speed, expected_copy_s, speed_now, step_times
from pipedream.plan import Plan, Stage
from pipedream.profiler import write_profile
from pipedream.runtime.config import TrainConfig

META = {"model": "alexnet", "preset": "reduced", "data": "real", "seed": 0, "threads": 1, "whole_step_s": 0.1,
        "host": {"cores": 2, "contention": 1.05, "layouts": [0.9, 1.1, 1.3]}}


def test_the_profiles_fresh_copy_is_its_whole_step_times_the_mean_layout() -> None:
    """0.1 s whole step, fresh copies at 0.9, 1.1 and 1.3x it: a fresh copy is expected at 0.11 s, on this many cores
    only, and only where the profile measured copies."""
    assert expected_copy_s(META, 2) == pytest.approx(0.11)
    assert expected_copy_s(META, 4) is None
    assert expected_copy_s({**META, "host": {"cores": 2, "contention": 1.0}}, 2) is None  # --host-seconds 0
    assert expected_copy_s({k: v for k, v in META.items() if k != "whole_step_s"}, 2) is None


class FakeClock:
    """``time.perf_counter`` of steps that cost known seconds."""

    def __init__(self) -> None:
        self.now, self.calls = 0.0, []

    def step(self, name: str, seconds: float):  # type: ignore[no-untyped-def]
        def run() -> None:
            self.calls.append(name)
            self.now += seconds
        return run


def test_copies_step_in_turns_and_each_keeps_its_median(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two copies costing 10 and 30 ms a step, one call of the second 90 ms (a burst): timed in turns for 0.2 s of
    the fake clock after two untimed calls each, each keeps its median, 10 and 30 ms."""
    clock = FakeClock()
    monkeypatch.setattr(host_speed.time, "perf_counter", lambda: clock.now)
    costs = iter([0.03, 0.03, 0.09] + [0.03] * 100)
    a = clock.step("a", 0.01)
    b_calls = clock.step("b", 0.0)

    def b() -> None:
        b_calls()
        clock.now += next(costs)

    got = step_times([a, b], seconds=0.2, min_steps=3)
    assert got == pytest.approx((0.01, 0.03))
    assert clock.calls[:4] == ["a", "a", "b", "b"]  # warm-up
    assert clock.calls[4:] == ["a", "b"] * ((len(clock.calls) - 4) // 2)  # then in turns
    assert (len(clock.calls) - 4) // 2 == 4  # 100 ms for the burst's turn, then 40 ms a turn: 0.22 s after 4


def test_speed_is_the_copies_mean_now_over_the_profiles_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Copies stepping 0.12 and 0.15 s now against the profile's expected 0.11 s: the host is 0.135 / 0.11 slower."""
    monkeypatch.setattr(host_speed, "profiled_steps", lambda meta, minibatch, copies: [lambda: None] * copies)
    monkeypatch.setattr(host_speed, "step_times", lambda steps, seconds: (0.12, 0.15))
    got = speed_now(META, 32, cores=2, threads=1, copies=2)
    assert got == Speed(pytest.approx(0.135 / 0.11), pytest.approx(0.135), pytest.approx(0.11), (0.12, 0.15))
    assert speed_now(META, 32, cores=4, threads=1) is None  # profiled on another host
    assert speed_now(META, 32, cores=2, threads=2) is None  # profiled with another thread count
    assert speed_now(META, 32, cores=2, threads=1, seconds=0) is None


def test_the_probe_steps_the_profiles_model_and_minibatch() -> None:
    """The reduced AlexNet on the profile's first real minibatch of 8: two copies, each a few ms a step."""
    steps = host_speed.profiled_steps(META, 8, 2)
    times = step_times(steps, seconds=0.05, min_steps=2)
    assert len(times) == 2 and all(t > 0 for t in times)


def _profile(tmp_path: Path) -> Path:
    """A 2-layer profile of 8 samples, 1 + 2 s a layer, with a host probe on this test's 2 cores."""
    g = LayerGraph(minibatch_size=8)
    g.add_node(Node("node0", "Input", 0.0, 0.0, (0.0,), 0.0))
    for i in (1, 2):
        g.add_node(Node(f"node{i}", "Linear", 1.0, 2.0, (0.0,), 0.0))
        g.add_edge(f"node{i - 1}", f"node{i}")
    write_profile(g, tmp_path / "profile", {**META, "whole_step_s": 6.0, "data_s": 0.5})
    return tmp_path / "profile" / "graph.txt"


def test_the_host_speed_scales_the_layers_the_data_and_the_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A straight 2-stage plan on one GPU each (no sharing, so compute is linear in the speed): with the host 1.5x
    slower now, every stage's compute (its layers, and stage 0's data) is 1.5x the profile's, and the prediction
    from the profile alone is kept beside it."""
    import pipedream.commands.train as train

    monkeypatch.setattr(train, "_host_speed", lambda args, cores: Speed(1.5, 0.165, 0.11, (0.165,)))
    monkeypatch.setattr(train.os, "cpu_count", lambda: 2)
    profile = _profile(tmp_path)
    plan = Plan(model="alexnet", cluster="A_1x4", workers=2, minibatch_size=8, time_per_sample_s=1.0,
                dp_time_per_sample_s=1.0, stages=[Stage(nodes=["node0", "node1"], replicas=1, ranks=[0]),
                                                  Stage(nodes=["node2"], replicas=1, ranks=[1])])
    args = argparse.Namespace(mode="pipedream", profile=profile, clusters="experiments/clusters.yaml", nnodes=1,
                              host_probe_seconds=2.0)
    cfg = TrainConfig(model="alexnet", batch_size=8, data="synthetic", train_subset=64, val_subset=32)
    got, why = _predict(args, cfg, plan)
    assert why is None and got["speed"] == 1.5 and got["host_speed"]["factor"] == 1.5
    monkeypatch.setattr(train, "_host_speed", lambda args, cores: None)
    profiled, _ = _predict(args, cfg, plan)
    assert profiled["speed"] == 1.0 and "host_speed" not in profiled
    assert got["predicted_epoch_time_profiled_s"] == pytest.approx(profiled["predicted_epoch_time_s"])
    # per stage: compute seconds over work at full speed is the same sharing factor either way, so the work
    # (compute_s / compute_scale) is exactly 1.5x
    work = [c / f for c, f in zip(got["compute_s"], got["compute_scale"], strict=True)]
    base = [c / f for c, f in zip(profiled["compute_s"], profiled["compute_scale"], strict=True)]
    assert work == pytest.approx([1.5 * b for b in base])
    assert got["predicted_epoch_time_s"] > profiled["predicted_epoch_time_s"]
