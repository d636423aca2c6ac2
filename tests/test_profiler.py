"""Profiler: exact sizes and real DAG edges from torch.fx, positive times, graph.txt round trip."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from pipedream.graph import LayerGraph, read_meta
from pipedream.models import build_model, example_input, layer_node_id
from pipedream.profiler import ProfileSettings, profile_module, whole_step_s, write_profile

FAST = ProfileSettings(warmup=0, iters=1)


class Skip(nn.Module):
    """y = relu(fc(x)) + x: one skip connection."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x)) + x


def test_chain_sizes_and_edges() -> None:
    model = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))
    g = profile_module(model, torch.randn(8, 4), FAST)
    assert list(g.nodes) == ["node0", "node1", "node2", "node3"]
    assert g.edges == [("node0", "node1"), ("node1", "node2"), ("node2", "node3")]
    assert g.minibatch_size == 8
    # fp32: output bytes = 4 * batch * features; parameter bytes = 4 * (in*out + out)
    assert [n.activation_bytes for n in g.nodes.values()] == [(128.0,), (160.0,), (160.0,), (96.0,)]
    assert [n.param_bytes for n in g.nodes.values()] == [0.0, 4.0 * 25, 0.0, 4.0 * 18]
    assert all(n.fwd_s > 0 and n.bwd_s > 0 for n in list(g.nodes.values())[1:])
    assert g.nodes["node1"].desc.startswith("Linear(in_features=4")


def test_skip_connection_gives_a_dag() -> None:
    g = profile_module(Skip(), torch.randn(2, 6), FAST, granularity="op")
    assert [n.desc for n in g.nodes.values()][:3] == ["Input", "Linear(in_features=6, out_features=6, bias=True)", "ReLU()"]
    assert g.nodes["node3"].desc == "add"
    assert sorted(g.edges) == sorted([("node0", "node1"), ("node1", "node2"), ("node2", "node3"), ("node0", "node3")])
    assert not g.is_chain()


def test_vgg16_reduced_profile_matches_layers(tmp_path) -> None:
    model = build_model("vgg16")
    g = profile_module(model, example_input("vgg16", 4), FAST)
    assert len(g.nodes) == len(model) + 1
    for i, layer in enumerate(model):
        node = g.nodes[layer_node_id(i)]
        assert node.param_bytes == sum(4 * p.numel() for p in layer.parameters())
    assert g.nodes[layer_node_id(len(model) - 1)].activation_bytes == (4 * 4 * 10.0,)
    write_profile(g, tmp_path, {"model": "vgg16"})
    back = LayerGraph.read(tmp_path / "graph.txt")
    assert back.totals()["param_bytes"] == g.totals()["param_bytes"]
    assert read_meta(tmp_path / "graph.txt") == {"minibatch_size": 4, "model": "vgg16",
                                                 "modules": {layer_node_id(i): str(i) for i in range(len(model))}}


def test_hidden_matrix_bytes_are_recorded_per_layer_and_read_back(tmp_path) -> None:
    """The reduced GPT at layer granularity: each block holds 12 h^2 fp32 bytes of hidden matrices (h = 128: qkv,
    proj, fc, out); the embedding and the head (its projection is the output layer) none; graph.json keeps them."""
    model = build_model("gpt")
    g = profile_module(model, example_input("gpt", 2), FAST, name="gpt")
    assert g.hidden == {"node0": 0.0, "node1": 0.0, **{layer_node_id(b): 4.0 * 12 * 128**2 for b in range(1, 9)},
                        "node10": 0.0}
    write_profile(g, tmp_path, {"model": "gpt"})
    back = LayerGraph.read(tmp_path / "graph.txt")
    assert back.hidden == g.hidden
    assert back.hidden_bytes_of(["node9", "node10"]) == 4.0 * 12 * 128**2
    (tmp_path / "graph.json").unlink()  # a profile taken before the bytes were recorded
    assert LayerGraph.read(tmp_path / "graph.txt").hidden_bytes_of(["node9"]) is None


def test_layer_granularity_keeps_blocks_whole() -> None:
    """'layer': one node per child of the sequence (the runtime's slices); 'op': the block's DAG."""
    model = nn.Sequential(nn.Linear(6, 6), Skip(), nn.Linear(6, 2))
    layer = profile_module(model, torch.randn(3, 6), FAST, granularity="layer")
    assert [n.desc.split("(")[0] for n in layer.nodes.values()] == ["Input", "Linear", "Skip", "Linear"]
    assert layer.is_chain() and layer.nodes["node2"].param_bytes == 4 * 42
    op = profile_module(model, torch.randn(3, 6), FAST, granularity="op")
    assert len(op.nodes) == 6 and not op.is_chain()  # input, linear, block's linear, relu, add, linear


def test_a_layer_time_is_the_median_of_its_timed_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """One call slowed down by another process (100 units against 1) does not move the layer's time; a
    mean would make it 20.8. The clock is fake, so nothing here depends on this machine's speed."""
    from pipedream import profiler

    clock = [0.0]
    durations = iter([7.0, 7.0, 1.0, 1.0, 100.0, 1.0, 1.0])  # 2 warm-up calls, then 5 timed ones

    def call() -> None:
        clock[0] += next(durations)

    monkeypatch.setattr(profiler.time, "perf_counter", lambda: clock[0])
    assert profiler._timed(call, profiler.ProfileSettings(warmup=2, iters=5)) == 1.0


def test_what_each_layer_saves_for_its_backward() -> None:
    """Linear saves its input (and its weight: a parameter), ReLU its output, BatchNorm1d its input plus
    the batch mean and inverse std (2 features x 4 bytes each); nothing else is saved."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    g = profile_module(model, torch.randn(5, 4), ProfileSettings(warmup=0, iters=1))
    assert g.saved == {"node1": (0.0, True, False), "node2": (0.0, False, True), "node3": (0.0, True, False),
                       "node4": (16.0, True, False)}


class _Probe(nn.Module):
    """A linear layer that records, at every call, whether its input requires grad."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.fc = nn.Linear(n, n)
        self.seen: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(x.requires_grad)
        return self.fc(x)


def test_backward_differentiates_only_what_depends_on_a_parameter() -> None:
    first, second = _Probe(4), _Probe(4)
    g = profile_module(nn.Sequential(nn.ReLU(), first, second), torch.randn(8, 4), FAST)
    assert g.nodes["node1"].bwd_s == 0.0  # the ReLU on the data: nothing of it needs a gradient in training
    assert first.seen and not any(first.seen)  # the model's input never gets a gradient, as in the runtime
    # a stage boundary's input does (the last call is the whole-model forward, without gradients, that finds the
    # hidden matrices after the layers are timed: pipedream.runtime.optim.hidden_matrices)
    assert len(second.seen) > 1 and all(second.seen[:-1]) and not second.seen[-1]


class _SlowSum(torch.autograd.Function):
    """``x.sum()`` that sleeps 10 ms in its forward and 20 ms in its backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.shape = x.shape
        time.sleep(0.01)
        return x.sum()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        time.sleep(0.02)
        return grad.expand(ctx.shape)


def test_the_loss_is_timed_into_the_node_that_produces_the_output() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    g = profile_module(model, torch.randn(8, 4), FAST, loss=_SlowSum.apply)
    last = g.nodes["node3"]
    assert last.fwd_s >= 0.01 and last.bwd_s >= 0.02  # the loss's sleeps: 10 ms forward, 20 ms backward
    assert all(n.fwd_s < 0.005 and n.bwd_s < 0.005 for n in list(g.nodes.values())[:3])  # microseconds each


def test_a_slow_call_is_timed_fewer_times_within_a_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a budget of 2 s (the optimizer steps'): a call of 8 s is warmed up once and timed twice (3 calls,
    not 2 + 10); a call of 0.1 s keeps its 2 warm-ups and 10 timed calls (1 s in all, under the budget); calls
    of 0.5 s stop at the fourth timed one (2 s). Fake clock."""
    from pipedream import profiler

    clock, calls = [0.0], [0]

    def timed(seconds: float) -> float:
        calls[0] = 0

        def call() -> None:
            calls[0] += 1
            clock[0] += seconds

        return profiler._timed(call, profiler.ProfileSettings(warmup=2, iters=10), budget_s=2.0)

    monkeypatch.setattr(profiler.time, "perf_counter", lambda: clock[0])
    assert timed(8.0) == 8.0 and calls[0] == 3
    assert timed(0.1) == pytest.approx(0.1) and calls[0] == 12
    assert timed(0.5) == 0.5 and calls[0] == 6
    calls[0] = 0
    assert profiler._timed(lambda: calls.__setitem__(0, calls[0] + 1) or clock.__setitem__(0, clock[0] + 8.0),
                           profiler.ProfileSettings(warmup=2, iters=10)) == 8.0 and calls[0] == 12  # no budget


def test_whole_step_is_the_median_of_the_timed_calls() -> None:
    """A step that sleeps 10 ms after 2 warm-up calls that sleep 200 ms: the median of 5 timed calls, not the
    warm-up (scheduler slack allowed above)."""
    calls = iter([0.2, 0.2] + [0.01] * 5)
    step_s = whole_step_s(lambda: time.sleep(next(calls)), ProfileSettings(warmup=2, iters=5))
    assert 0.01 <= step_s < 0.05


def test_the_profiled_step_adds_its_gradients_into_buffers_as_a_worker_does() -> None:
    """`pipedream profile`'s whole step (commands/profile.runtime_step): after two steps every buffer holds twice
    the gradient of one step computed with a plain ``loss.backward()`` on a copy (a worker's master gradient,
    never zeroed between the profile's steps); a frozen parameter gets no buffer, and the model's own ``.grad``
    stays empty (the step differentiates aliases of the weights)."""
    import copy

    from pipedream.commands.profile import runtime_step

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    model[0].bias.requires_grad_(False)
    x, y = torch.randn(5, 4), torch.tensor([0, 1, 1, 0, 1])
    reference = copy.deepcopy(model)
    nn.functional.cross_entropy(reference(x), y).backward()
    step = runtime_step(model, nn.functional.cross_entropy, x, y)
    step()
    step()
    expected = [2 * p.grad for p in reference.parameters() if p.requires_grad]
    assert len(step.grads) == 3
    for got, want in zip(step.grads, expected, strict=True):
        torch.testing.assert_close(got, want)
    assert all(p.grad is None for p in model.parameters())


class Jittery(nn.Module):
    """Passes its input through; every other call sleeps 5 ms (a layer whose timings another process disturbs)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls % 2:
            time.sleep(0.005)
        return x * 1.0


def test_the_spread_of_timed_calls_is_kept_and_noisy_layers_are_named() -> None:
    from pipedream import profiler

    spread: list[float] = []
    clock = [0.0]
    durations = iter([7.0, 7.0, 1.0, 1.0, 100.0, 1.0, 1.0, 9.0])

    def call() -> None:
        clock[0] += next(durations)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(profiler.time, "perf_counter", lambda: clock[0])
        assert profiler._timed(call, profiler.ProfileSettings(warmup=2, iters=5), spread=spread) == 1.0
        assert spread == [0.0]  # one slow call moves neither the median nor the interquartile range
        assert profiler.iqr([1.0, 2.0, 3.0, 4.0, 5.0]) == 2.0
    g = profile_module(nn.Sequential(nn.Linear(64, 64), Jittery()), torch.randn(8, 64),
                       profiler.ProfileSettings(warmup=0, iters=5))
    fwd_iqr, _ = g.spread["node2"]
    assert fwd_iqr > 0.004  # calls of ~0 and ~5 ms alternate
    assert "node2" in dict(profiler.noisy_layers(g))
    message = profiler.noise_warning(g)
    assert message is not None and "node2 (Jittery()) " in message and "profile on a quiet machine" in message


class _SleepBack(torch.autograd.Function):
    """The identity, whose backward sleeps ``seconds``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, seconds: float) -> torch.Tensor:  # type: ignore[override]
        ctx.seconds = seconds
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        time.sleep(ctx.seconds)
        return grad, None


class _Split(nn.Module):
    """``x + w``, whose backward to ``x`` sleeps 40 ms and to ``w`` 20 ms (autograd runs only the branch asked for)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _SleepBack.apply(x, 0.04) + _SleepBack.apply(self.w, 0.02)


def test_the_backward_halves_are_timed_apart_and_kept_in_graph_json(tmp_path) -> None:
    model = nn.Sequential(nn.Linear(4, 4), _Split(), nn.ReLU())
    g = profile_module(model, torch.randn(8, 4), ProfileSettings(warmup=1, iters=3, in_situ=False))
    i1, w1 = g.split["node1"]
    assert i1 == 0.0 and w1 > 0.0  # fed by the data: no input gradient, only the weights'
    i2, w2 = g.split["node2"]
    assert 0.04 <= i2 < 0.06 and 0.02 <= w2 < 0.04  # the sleeps of each half alone (20 ms of margin for noise)
    assert g.nodes["node2"].bwd_s >= 0.06  # the whole backward does both
    i3, w3 = g.split["node3"]
    assert w3 == 0.0 and i3 > 0.0  # no weights
    write_profile(g, tmp_path, {})
    back = LayerGraph.read(tmp_path / "graph.txt")
    assert back.split == g.split
    assert back.backward_split("node2") == pytest.approx((i2, w2))
    # a graph.json without the halves (older profiles) loads, and the halves fall back to B / 2 each for a layer
    # with weights and all of B for one without
    doc = (tmp_path / "graph.json").read_text().replace('"input_grad_s"', '"x"')
    (tmp_path / "graph.json").write_text(doc)
    old = LayerGraph.read(tmp_path / "graph.txt")
    assert not old.split
    b2, b3 = old.nodes["node2"].bwd_s, old.nodes["node3"].bwd_s
    assert old.backward_split("node2") == pytest.approx((b2 / 2, b2 / 2))
    assert old.backward_split("node3") == pytest.approx((b3, 0.0))
