"""Layer times inside whole steps (pipedream/in_situ.py): each forward and backward where it runs, on a fake clock."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import pipedream.in_situ as in_situ
from pipedream.profiler import ProfileSettings, profile_module, write_profile
from pipedream.runtime.split import OPS, node_ids, trace

CLOCK = [0.0]


class _Costly(torch.autograd.Function):
    """Identity that advances the fake clock by ``fwd`` seconds in its forward and ``bwd`` in its backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, fwd: float, bwd: float) -> torch.Tensor:  # type: ignore[override]
        ctx.bwd = bwd
        CLOCK[0] += fwd
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        CLOCK[0] += ctx.bwd
        return grad, None, None


class Costly(nn.Module):
    """A layer with a weight whose forward costs ``fwd`` and backward ``bwd`` seconds of the fake clock."""

    def __init__(self, fwd: float, bwd: float) -> None:
        super().__init__()
        self.w, self.fwd, self.bwd = nn.Parameter(torch.ones(1)), fwd, bwd

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Costly.apply(x * self.w, self.fwd, self.bwd)


def _loss(out: torch.Tensor) -> torch.Tensor:  # 7 ms forward, 11 ms backward
    return _Costly.apply(out, 0.007, 0.011).sum()


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    CLOCK[0] = 0.0
    monkeypatch.setattr(in_situ.time, "perf_counter", lambda: CLOCK[0])
    return CLOCK


def test_each_layer_gets_its_own_forward_and_backward_and_the_last_the_loss(fake_clock: list[float]) -> None:
    """Three layers of 10/30, 20/5 and 4/9 ms (forward/backward): inside a whole step each gets exactly its own,
    the backward measured from its output's gradient to the one before it, and the last layer also the loss's 7 and
    11 ms."""
    model = nn.Sequential(Costly(0.010, 0.030), Costly(0.020, 0.005), Costly(0.004, 0.009))
    gm = trace(model)
    ids = {n: nid for n, nid in node_ids(gm).items() if n.op in OPS}
    got = in_situ.in_situ_times(gm, ids, [torch.randn(3, 2)], "node3", _loss, warmup=1, iters=3)
    assert got == {"node1": pytest.approx((0.010, 0.030)), "node2": pytest.approx((0.020, 0.005)),
                   "node3": pytest.approx((0.004 + 0.007, 0.009 + 0.011))}


def test_without_a_loss_the_backward_starts_from_the_outputs(fake_clock: list[float]) -> None:
    model = nn.Sequential(Costly(0.010, 0.030), Costly(0.020, 0.005))
    gm = trace(model)
    ids = {n: nid for n, nid in node_ids(gm).items() if n.op in OPS}
    got = in_situ.in_situ_times(gm, ids, [torch.randn(3, 2)], "node2", None, warmup=0, iters=1)
    assert got == {"node1": pytest.approx((0.010, 0.030)), "node2": pytest.approx((0.020, 0.005))}


def test_a_layer_no_gradient_reaches_has_no_backward(fake_clock: list[float]) -> None:
    """A ReLU on the model's input (no weight before it) computes no gradient in training: backward 0, as alone."""
    model = nn.Sequential(nn.ReLU(), Costly(0.010, 0.030))
    gm = trace(model)
    ids = {n: nid for n, nid in node_ids(gm).items() if n.op in OPS}
    got = in_situ.in_situ_times(gm, ids, [torch.randn(3, 2)], "node2", _loss, warmup=0, iters=1)
    assert got["node1"] == (0.0, 0.0)
    assert got["node2"] == pytest.approx((0.010 + 0.007, 0.030 + 0.011))


def test_the_profile_keeps_both_times(tmp_path: Path) -> None:
    """On the CPU the node times are those inside whole steps and the times alone go to ``isolated`` and
    graph.json; with ``in_situ=False`` the times alone are the node times and nothing else is kept."""
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(4, 8)
    situ = profile_module(model, x, ProfileSettings(warmup=0, iters=1))
    assert set(situ.isolated) == {"node1", "node2", "node3"}
    write_profile(situ, tmp_path, {})
    nodes = {n["id"]: n for n in json.loads((tmp_path / "graph.json").read_text())["nodes"]}
    assert nodes["node1"]["isolated_fwd_s"] == situ.isolated["node1"][0]
    assert nodes["node1"]["fwd_s"] == situ.nodes["node1"].fwd_s
    alone = profile_module(model, x, ProfileSettings(warmup=0, iters=1, in_situ=False))
    assert alone.isolated == {}


class _Pair(nn.Module):
    """Two outputs of one input: the first's backward costs 3 ms, the second's (made later, so the engine runs its
    backward first once both are ready) 8 ms; forwards 1 and 2 ms."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = Costly(0.001, 0.003), Costly(0.002, 0.008)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.first(x), self.second(x)


class _Join(nn.Module):
    """Adds a pair and costs ``fwd`` s forward, ``bwd`` s backward; with ``passes`` it also returns the pair's
    second tensor unchanged (as GNMT's decoder layers pass the attention context on)."""

    def __init__(self, fwd: float, bwd: float, passes: bool = False) -> None:
        super().__init__()
        self.layer, self.passes = Costly(fwd, bwd), passes

    def forward(self, pair: tuple[torch.Tensor, torch.Tensor]) -> Any:
        out = self.layer(pair[0] + pair[1])
        return (out, pair[1]) if self.passes else out


def test_a_layer_with_two_outputs_gets_both_branches_of_its_backward(fake_clock: list[float]) -> None:
    """The pair's second branch (8 ms) runs in the backward before its first output's gradient is ready: hooked
    on its first output alone, those 8 ms went to the layer after it (13 ms against 5, the pair 3 against 11)."""
    model = nn.Sequential(_Pair(), _Join(0.004, 0.005))
    gm = trace(model)
    ids = {n: nid for n, nid in node_ids(gm).items() if n.op in OPS}
    got = in_situ.in_situ_times(gm, ids, [torch.randn(3, 2)], "node2", _loss, warmup=0, iters=1)
    assert got == {"node1": pytest.approx((0.001 + 0.002, 0.003 + 0.008)),
                   "node2": pytest.approx((0.004 + 0.007, 0.005 + 0.011))}


def test_an_output_passed_through_stays_its_makers(fake_clock: list[float]) -> None:
    """The middle layer returns the pair's second output as it is: its gradient opens the pair's backward, not the
    middle layer's, so each layer keeps exactly its own times."""
    model = nn.Sequential(_Pair(), _Join(0.004, 0.005, passes=True), _Join(0.006, 0.002))
    gm = trace(model)
    ids = {n: nid for n, nid in node_ids(gm).items() if n.op in OPS}
    got = in_situ.in_situ_times(gm, ids, [torch.randn(3, 2)], "node3", _loss, warmup=0, iters=1)
    assert got == {"node1": pytest.approx((0.003, 0.011)), "node2": pytest.approx((0.004, 0.005)),
                   "node3": pytest.approx((0.006 + 0.007, 0.002 + 0.011))}
