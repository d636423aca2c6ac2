"""The stage probe (pipedream/stage_probe.py): the shares and factors by hand, the interleaving on a fake clock,
the stage steps against the whole model's gradients, and the prediction with the factors against the same
prediction on a profile whose stage times were scaled by hand."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from pipedream import stage_probe
from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph, Node
from pipedream.runtime.stage import straight_plan
from pipedream.sim.predict import EpochShape, predict_epoch
from pipedream.stage_probe import factors, interleaved_medians, layer_shares, probe, stage_steps
from pipedream.topology import Cluster
from tests.tiny import tiny_model


def chain(times: list[tuple[float, float]]) -> LayerGraph:
    """An input (its data time left out of the shares) and one layer per ``(fwd_s, bwd_s)``, profiled at 8."""
    g = LayerGraph(minibatch_size=8)
    g.add_node(Node("node0", "Input", 5.0, 0.0, (0.0,), 0.0))
    for i, (f, b) in enumerate(times, start=1):
        g.add_node(Node(f"node{i}", "Linear", f, b, (0.0,), 0.0))
        g.add_edge(f"node{i - 1}", f"node{i}")
    return g


def test_shares_leave_the_input_out_and_factors_divide_by_the_share_of_the_whole() -> None:
    """Layers of 1+2, 1+1 and 2+3 s: 10 s in all (the input's 5 s of data not counted); stages [1] and [2, 3]
    hold 0.3 and 0.7. Alone 4 and 7 s against a 10 s whole step: 4 / 3 and 7 / 7."""
    g = chain([(1.0, 2.0), (1.0, 1.0), (2.0, 3.0)])
    assert layer_shares(g, [["node0", "node1"], ["node2", "node3"]]) == pytest.approx([0.3, 0.7])
    assert factors([4.0, 7.0], 10.0, [0.3, 0.7]) == pytest.approx([4 / 3, 1.0])
    with pytest.raises(ValueError, match="one positive share per stage"):
        factors([4.0, 7.0], 10.0, [0.0, 1.0])
    with pytest.raises(ValueError, match="no time"):
        layer_shares(chain([(0.0, 0.0)]), [["node1"]])


def test_the_steps_take_turns_in_blocks_reversed_every_other_round_on_the_clock_given() -> None:
    """Two rounds of blocks of 2 after one warm-up call each: a b | b a, so the calls run a a b b b b a a after a b;
    each call of ``a`` advances the fake clock 3 s and of ``b`` 1 s (then 5 s from the third on)."""
    now, calls = [0.0], []

    def make(name: str, cost: list[float]):  # type: ignore[no-untyped-def]
        def step() -> None:
            calls.append(name)
            now[0] += cost[min(len([c for c in calls if c == name]) - 1, len(cost) - 1)]
        return step

    med = interleaved_medians({"a": make("a", [3.0]), "b": make("b", [1.0, 1.0, 5.0])}, rounds=2, block=2,
                              warmup=1, clock=lambda: now[0])
    assert "".join(calls) == "ab" + "aabb" + "bbaa"
    assert med == {"a": 3.0, "b": 5.0}  # b's timed calls: 1 (its second), then 5, 5, 5
    with pytest.raises(ValueError, match="at least 1"):
        interleaved_medians({}, rounds=0, block=1)


def test_a_step_that_times_itself_is_taken_at_its_own_time() -> None:
    """A step returning 2 s while the clock moves 5 s a call is taken at 2 s (the part it counts, say without
    evicting the caches); one returning nothing at the clock's 5 s."""
    now = [0.0]

    def costly() -> float:
        now[0] += 5.0
        return 2.0

    def plain() -> None:
        now[0] += 5.0

    assert interleaved_medians({"own": costly, "clock": plain}, rounds=2, block=2, warmup=0,
                               clock=lambda: now[0]) == {"own": 2.0, "clock": 5.0}


def tiny_task(n: int = 8) -> SimpleNamespace:
    torch.manual_seed(0)
    x, y = torch.randn(n, 3, 32, 32), torch.randint(0, 10, (n,))
    return SimpleNamespace(model=tiny_model(), example=x[:1], criterion=torch.nn.functional.cross_entropy,
                           train=SimpleNamespace(batch=lambda rows: (x[rows], y[rows])), input_batch=lambda k: x[:k])


def test_each_stage_steps_on_the_stages_before_it_as_the_whole_model_does() -> None:
    """Stage 1 of the tiny model (its last 4 layers: 2 Linear layers, 4 tensors) on stage 0's output for the same
    minibatch takes the whole step's gradients of those tensors; stage 0 the gradients of its output against the
    gradient it was given, as autograd computes them on the model's first 4 layers."""
    task = tiny_task()
    steps = stage_steps(task, straight_plan("t", 8, [4, 4]), 8)
    for step in steps.values():
        step()
    whole = steps["whole"].grads
    assert len(steps["stage1"].grads) == 4
    for mine, ref in zip(steps["stage1"].grads, whole[4:], strict=True):
        torch.testing.assert_close(mine, ref)
    x, _ = task.train.batch(list(range(8)))
    first = list(task.model[:4].parameters())
    ref = torch.autograd.grad(task.model[:4](x), first, grad_outputs=steps["stage0"].grad_out[0])
    for mine, r in zip(steps["stage0"].grads, ref, strict=True):
        torch.testing.assert_close(mine, r)
    assert [p.grad for p in task.model.parameters()] == [None] * 8  # the model itself untouched


def test_a_cold_stage_evicts_the_caches_before_its_forward_and_its_backward_outside_its_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``evict_bytes`` each call of a stage evicts twice (one buffer of that many bytes), the evictions cost
    100 s each on the fake clock and the step returns the clock's time without them; the gradients are the
    whole model's as warm; without ``evict_bytes`` nothing is evicted."""
    now, evicted = [0.0], []

    def fake_evict(buffer: torch.Tensor) -> None:
        evicted.append(buffer.numel())
        now[0] += 100.0

    monkeypatch.setattr(stage_probe, "evict", fake_evict)
    task = tiny_task()
    steps = stage_steps(task, straight_plan("t", 8, [4, 4]), 8, evict_bytes=4096, clock=lambda: now[0])
    steps["whole"]()
    assert evicted == []
    for s in ("stage0", "stage1"):
        before = now[0]
        assert steps[s]() == 0.0  # the fake clock moves only in the evictions
        assert now[0] - before == 200.0
    assert evicted == [4096] * 4
    for mine, ref in zip(steps["stage1"].grads, steps["whole"].grads[4:], strict=True):
        torch.testing.assert_close(mine, ref)
    warm = stage_steps(task, straight_plan("t", 8, [4, 4]), 8)
    warm["stage0"]()
    assert evicted == [4096] * 4


def test_the_probe_evicts_twice_the_last_level_cache_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host with a 1 MiB last level: 2 MiB written before each stage's forward and backward (64 MiB where the
    host does not say); 0 times the stages warm; a negative count is refused."""
    g = LayerGraph(minibatch_size=8)
    for i in range(9):
        g.add_node(Node(f"node{i}", "Input" if i == 0 else "Layer", 1.0, 1.0, (0.0,), 0.0))
        if i:
            g.add_edge(f"node{i - 1}", f"node{i}")
    monkeypatch.setattr(stage_probe, "last_level_cache_bytes", lambda: 1 << 20)
    plan = straight_plan("t", 8, [4, 4])
    assert probe(tiny_task(), plan, g, 8, rounds=1, block=1).evict_bytes == 2 << 20
    assert probe(tiny_task(), plan, g, 8, rounds=1, block=1, evict_bytes=0).as_dict()["evict_bytes"] == 0
    monkeypatch.setattr(stage_probe, "last_level_cache_bytes", lambda: None)
    assert stage_probe.default_evict_bytes() == 64 << 20
    with pytest.raises(ValueError, match="evict_bytes must be at least 0"):
        probe(tiny_task(), plan, g, 8, rounds=1, block=1, evict_bytes=-1)


def test_the_probe_gives_one_positive_factor_per_stage_keeps_freed_memory_and_restores_the_threads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The factors are the stages' medians over their shares of the whole step's; the process keeps the memory
    it frees, as the workers do (else the allocator's page faults land on the whole step's large blocks)."""
    kept = []
    monkeypatch.setattr(stage_probe, "keep_freed_memory", lambda: kept.append(True) or True)
    g = LayerGraph(minibatch_size=8)
    for i in range(9):
        g.add_node(Node(f"node{i}", "Input" if i == 0 else "Layer", 1.0, 1.0, (0.0,), 0.0))
        if i:
            g.add_edge(f"node{i - 1}", f"node{i}")
    before = torch.get_num_threads()
    res = probe(tiny_task(), straight_plan("t", 8, [4, 4]), g, 8, rounds=1, block=1, threads=1)
    assert torch.get_num_threads() == before and kept == [True]
    assert res.shares == pytest.approx([0.5, 0.5]) and len(res.factors) == 2 and min(res.factors) > 0
    assert res.factors == pytest.approx([a / (0.5 * res.whole_s) for a in res.alone_s])


def test_the_prediction_scales_each_stage_as_its_layers_scaled_by_hand() -> None:
    """Stage factors 2 and 0.5 on a 2-stage pipeline predict what the profile with stage 0's layers twice as long
    and stage 1's half as long predicts (on 2 cores shared, the composition 1.3 on both)."""
    base = chain([(1.0, 2.0), (1.0, 2.0), (2.0, 2.0)])
    scaled = chain([(2.0, 4.0), (0.5, 1.0), (1.0, 1.0)])
    scaled.nodes["node0"].fwd_s = base.nodes["node0"].fwd_s
    nodes, ranks = [["node0", "node1"], ["node2", "node3"]], [[0], [1]]
    shape, cluster = EpochShape("1f1b", 8, 1, 6, 48), Cluster("c", [(2, 1e9)])
    got = predict_epoch(base, nodes, ranks, cluster, shape, cores=2, composition=1.3, stage_factors=[2.0, 0.5])
    ref = predict_epoch(scaled, nodes, ranks, cluster, shape, cores=2, composition=1.3)
    assert got.epoch_s == pytest.approx(ref.epoch_s, rel=1e-12)
    assert got.compute_s == pytest.approx(ref.compute_s, rel=1e-12)
    assert got.to_dict()["stage_factors"] == [2.0, 0.5]
    with pytest.raises(PipeDreamError, match="stage_factors must be one positive factor per stage"):
        predict_epoch(base, nodes, ranks, cluster, shape, cores=2, stage_factors=[1.0])
