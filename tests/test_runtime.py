"""Runtime pieces in one process: stage slicing, boundary shapes, weight versions, config round trip."""

from __future__ import annotations

import argparse

import pytest
import torch

from pipedream.errors import PipeDreamError
from pipedream.models import layer_node_id
from pipedream.plan import Plan, Stage
from pipedream.runtime.config import TrainConfig, add_arguments, from_args
from pipedream.runtime.lr import stage_lr_factor
from pipedream.runtime.stage import build_stages, stage_layer_ranges, straight_plan
from pipedream.runtime.versions import Policy, WeightVersions
from tests.tiny import SkipNet, op_plan, tiny_model, tuple_model


def test_stages_slice_the_chain_and_compose_to_the_model() -> None:
    model = tiny_model()
    plan = straight_plan("tiny", 8, [3, 1, 2, 2])
    assert [list(r) for r in stage_layer_ranges(plan, 8)] == [[0, 1, 2], [3], [4, 5], [6, 7]]
    x = torch.randn(5, 3, 32, 32)
    stages = build_stages(model, plan, x[:1])
    y = stages.modules[0](x)
    for module in stages.modules[1:]:
        assert isinstance(y, tuple)  # a flat tuple of tensors crosses every boundary
        y = module(*y)
    assert torch.equal(y, model(x))
    assert [b.specs for b in stages.boundaries] == [(((256,), torch.float32),), (((16,), torch.float32),),
                                                    (((16,), torch.float32),), (((10,), torch.float32),)]
    # stage modules keep the whole model's parameter names
    assert [n for n, _ in stages.modules[2].named_parameters()] == ["5.weight", "5.bias"]


def test_tuple_boundaries_keep_integer_passengers() -> None:
    model = tuple_model()
    b = build_stages(model, straight_plan("t", 4, [1, 1, 1, 1]), torch.randn(1, 3, 32, 32)).boundaries
    assert b[0].specs == (((16,), torch.float32), ((), torch.int64))  # the tuple crosses as its two tensors
    assert b[0].grad_items == [0]
    assert b[0].batched(5, grads=True) == [((5, 16), torch.float32)]
    assert b[3].specs == (((10,), torch.float32),)


def test_plan_with_gaps_or_foreign_layers_is_rejected() -> None:
    def plan(*nodes: list[int]) -> Plan:
        stages = [Stage(nodes=[layer_node_id(i) for i in ns], ranks=[k]) for k, ns in enumerate(nodes)]
        return Plan("tiny", "x", len(nodes), stages, 8, 1.0, 1.0)

    with pytest.raises(PipeDreamError, match="non-contiguous"):
        stage_layer_ranges(plan([0, 2], [1, 3, 4, 5, 6, 7]), 8)
    with pytest.raises(PipeDreamError, match="model has 8 layers"):
        stage_layer_ranges(plan([0, 1, 2, 3], [4, 5, 6, 7, 8]), 8)
    with pytest.raises(PipeDreamError, match="covers layers"):
        stage_layer_ranges(plan([0, 1, 2], [3, 4]), 8)
    full = plan([0, 1, 2, 3], [4, 5, 6, 7])
    full.stages[0].nodes.insert(0, "node0")  # the input node belongs to no layer
    assert [list(r) for r in stage_layer_ranges(full, 8)] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def _step(versions: WeightVersions, delta: float) -> None:
    with versions.stepping(), torch.no_grad():
        for p in versions.master:
            p.add_(delta)


def test_weight_stashing_keeps_a_version_per_inflight_minibatch() -> None:
    v = WeightVersions(torch.nn.Linear(2, 2), Policy.STASH)
    w0 = v.acquire(v.version_for(0, None))
    w1 = v.acquire(v.version_for(1, None))
    assert w0 is w1  # both forwards before any update use version 0
    _step(v, 1.0)
    assert v.version_for(2, None) == 1
    w2 = v.acquire(1)
    assert v.alive() == [0, 1]
    assert not torch.equal(w2["weight"], w0["weight"])
    v.release(0)
    v.release(0)
    assert v.alive() == [1]  # version 0 is dropped once its last backward is done
    v.release(1)


def test_vertical_sync_uses_the_carried_version() -> None:
    v = WeightVersions(torch.nn.Linear(2, 2), Policy.VERTICAL)
    v.acquire(v.version_for(0, 0))
    _step(v, 1.0)
    _step(v, 1.0)
    assert v.version_for(1, 0) == 0  # upstream still on version 0: use our version 0, not our newest
    assert v.version_for(2, 2) == 2
    with pytest.raises(PipeDreamError, match="not available"):
        v.version_for(3, 7)


def test_vertical_sync_on_a_replicated_stage_maps_update_counts_to_versions() -> None:
    """A stage whose steps average 2 minibatches holds updates of minibatches < 2k in version k."""
    v = WeightVersions(torch.nn.Linear(2, 2), Policy.VERTICAL)
    v.acquire(v.version_for(0, 0, 2))
    _step(v, 1.0)
    _step(v, 1.0)
    assert [v.version_for(m, c, 2) for m, c in [(1, 1), (2, 2), (3, 3), (4, 4)]] == [0, 1, 1, 2]
    assert v.version_for(5, 2) == 2  # unreplicated: the carried count is the version
    with pytest.raises(PipeDreamError, match="not available"):
        v.version_for(6, 6, 2)


def test_2bw_keeps_two_versions_and_uses_the_previous_one() -> None:
    v = WeightVersions(torch.nn.Linear(2, 2), Policy.TWO_BW)
    for t in range(5):
        ver = v.version_for(t, None)
        assert ver == max(t - 1, 0)
        v.acquire(ver)
        v.release(ver)
        _step(v, 1.0)
        assert len(v.alive()) <= 2
    assert v.alive() == [4, 5]


def test_config_round_trips_through_the_command_line() -> None:
    cfg = TrainConfig(model="vgg16", schedule="2bw", microbatches=4, batch_size=32, train_subset=100,
                      emulate_bandwidth_Bps=1e9, checkpoint=True, progress=False)
    flush = TrainConfig(model="vgg16", schedule="pipedream_flush", microbatches=4, recompute=True)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert from_args(parser.parse_args(flush.to_args())) == flush
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    back = from_args(parser.parse_args(cfg.to_args()))
    assert back == cfg


def test_the_release_per_stage_learning_rate_applies_to_1f1b_sgd_by_default() -> None:
    """lr x replicas(s) / replicas(0) (the release's get_adjusted_learning_rate): SGD under 1F1B-RR by default,
    Adam only with --stage-lr all or --compat, never GPipe (its replicas share a minibatch)."""
    reps = [3, 1, 2]
    assert [stage_lr_factor(TrainConfig(), reps, s) for s in range(3)] == [1.0, 1 / 3, 2 / 3]
    assert [stage_lr_factor(TrainConfig(optimizer="adam"), reps, s) for s in range(3)] == [1.0, 1.0, 1.0]
    assert stage_lr_factor(TrainConfig(optimizer="adam", stage_lr="all"), reps, 1) == 1 / 3
    assert stage_lr_factor(TrainConfig(optimizer="adam", compat=True), reps, 2) == 2 / 3
    assert stage_lr_factor(TrainConfig(stage_lr="none"), reps, 1) == 1.0
    assert stage_lr_factor(TrainConfig(schedule="gpipe", microbatches=6), reps, 1) == 1.0


@pytest.mark.parametrize("kwargs,match", [
    ({"schedule": "pipe"}, "--schedule"), ({"batch_size": 30, "microbatches": 4, "schedule": "gpipe"}, "multiple"),
    ({"batch_size": 30, "microbatches": 4, "schedule": "pipedream_flush"}, "multiple"),
    ({"microbatches": 2}, "1F1B"), ({"emulate_bandwidth_Bps": -1.0}, "bandwidth"), ({"stage_lr": "adam"}, "--stage-lr"),
])
def test_bad_config_is_explained(kwargs: dict, match: str) -> None:
    with pytest.raises(PipeDreamError, match=match):
        TrainConfig(**kwargs).validate()


def test_link_throttle_serialises_messages_on_a_link() -> None:
    from pipedream.costmodel import ring_allreduce_s
    from pipedream.runtime.comm import link_ready_s

    bw = 1e6  # bytes/s
    first = link_ready_s(sent_at_s=10.0, link_free_s=0.0, nbytes=500_000, bandwidth_Bps=bw)
    assert first == pytest.approx(10.5)
    second = link_ready_s(sent_at_s=10.1, link_free_s=first, nbytes=1_000_000, bandwidth_Bps=bw)
    assert second == pytest.approx(11.5)  # waits for the first message to leave the link
    assert link_ready_s(20.0, second, 0, bw) == 20.0
    assert ring_allreduce_s(1_000_000, 4, bw) == pytest.approx(1.5)  # 2 (4 - 1) / 4 of 1 MB at 1 MB/s
    assert ring_allreduce_s(1_000_000, 1, bw) == 0.0


SKIP_STAGES = [["conv", "relu", "flatten", "fc1", "tanh"], ["fc2", "tanh_1"], ["fc3", "tanh_2"], ["add", "head"]]


def test_fx_split_carries_a_skip_connection_through_the_stages_it_jumps() -> None:
    model = SkipNet()
    x = torch.randn(5, 3, 32, 32)
    stages = build_stages(model, op_plan(model, SKIP_STAGES), x[:1])
    # `a` (tanh of fc1, 16 features) leaves stage 0 and rides through stages 1 and 2 to the add in stage 3
    assert [len(b.specs) for b in stages.boundaries] == [1, 2, 2, 1]
    assert [[n for n, _ in m.named_parameters()] for m in stages.modules] == [
        ["conv.weight", "conv.bias", "fc1.weight", "fc1.bias"], ["fc2.weight", "fc2.bias"],
        ["fc3.weight", "fc3.bias"], ["head.weight", "head.bias"]]
    y = stages.modules[0](x)
    for module in stages.modules[1:]:
        y = module(*y)
    torch.testing.assert_close(y, model(x), rtol=0, atol=0)
    y.sum().backward()  # gradients through the pieces reach every parameter of the model
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


@pytest.mark.parametrize("stages,match", [
    ([["conv", "relu", "flatten", "fc1", "tanh"], ["fc2", "tanh_1", "fc3"], ["tanh_2", "head"]], "in no stage"),
    ([["conv", "relu", "flatten", "fc1", "tanh", "add"], ["fc2", "tanh_1", "fc3", "tanh_2", "head"]], "later stage"),
    ([["conv", "relu", "flatten", "fc1", "tanh"], ["tanh", "fc2", "tanh_1", "fc3", "tanh_2", "add", "head"]],
     "belongs to one stage"),
])
def test_fx_split_rejects_plans_that_do_not_cut_the_graph(stages: list[list[str]], match: str) -> None:
    model = SkipNet()
    with pytest.raises(PipeDreamError, match=match):
        build_stages(model, op_plan(model, stages), torch.randn(1, 3, 32, 32))


def test_tied_weights_across_stages_are_held_by_both() -> None:
    from pipedream.runtime.shared import Shared

    model = tiny_model()
    model[7] = torch.nn.Linear(16, 16)
    model[7].weight = model[5].weight  # layer 7 (stage 1) reuses layer 5's weight (stage 0)
    stages = build_stages(model, straight_plan("t", 8, [6, 2]), torch.randn(1, 3, 32, 32))
    assert stages.shared == [Shared((0, 1), ("5.weight", "7.weight"))]
    assert stages.modules[0].get_parameter("5.weight") is stages.modules[1].get_parameter("7.weight")


def test_token_accuracy_skips_padding_as_the_loss_does() -> None:
    from pipedream.runtime.task import count_correct

    # 2 sequences x 3 positions over 4 classes; PAD = 1 fills the last position of the first sequence
    target = torch.tensor([[0, 2, 1], [3, 3, 1]])
    pred = torch.tensor([[0, 0, 1], [3, 2, 1]])  # argmax per position
    logits = torch.nn.functional.one_hot(pred, 4).float()
    assert count_correct(logits, target) == (4, 6)  # the two PAD positions count as hits without ignore_index
    assert count_correct(logits, target, ignore_index=1) == (2, 4)


@pytest.mark.parametrize("model", ["gnmt8", "gnmt16", "s2vt"])
def test_padded_models_ignore_their_pad_in_loss_and_accuracy(model: str) -> None:
    from pipedream.models import get_spec

    spec = get_spec(model)
    assert spec.ignore_index is not None
    target = torch.tensor([[2, spec.ignore_index]])
    logits = torch.zeros(1, 2, 8)
    logits[0, 1, 5] = 100.0  # a confident wrong answer at the padded position must cost nothing
    logits[0, 0, 2] = 100.0
    assert float(spec.criterion(logits, target)) == pytest.approx(0.0, abs=1e-6)
