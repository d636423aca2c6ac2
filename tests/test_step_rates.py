"""The optimizer step as the profile times it (pipedream.step_rates): its cost per call, per tensor and per byte,
and a stage's share."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import pipedream.step_rates as step_rates
from pipedream import costmodel
from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph, Node
from pipedream.profiler import ProfileSettings, profile_module, write_profile
from pipedream.runtime.config import TrainConfig
from pipedream.sim.costs import stage_costs
from pipedream.step_rates import OVERHEAD_TENSORS, split_step


def test_a_step_costs_its_call_each_tensor_and_each_byte() -> None:
    """1 MB in 10 tensors at 0.4 ms a call, 20 us a tensor and 1 ns a byte: 0.4 + 0.2 + 1.0 = 1.6 ms; copy on write
    adds SGD's 2 of 6 bytes of traffic to the per-byte part only (1.0 -> 1.333 ms); no bytes, no step."""
    kw = dict(s_per_param_byte=1e-9, tensors=10, s_per_tensor=2e-5, s_per_call=4e-4)
    assert costmodel.optimizer_step_s(1e6, "sgd", **kw) == pytest.approx(1.6e-3)
    assert costmodel.optimizer_step_s(1e6, "sgd", copy_on_write=True, **kw) == pytest.approx(0.6e-3 + 1e-3 * 8 / 6)
    assert costmodel.optimizer_step_s(0.0, "sgd", **kw) == 0.0


def test_step_rates_price_a_stage_as_the_formula_and_refuse_negative_rates() -> None:
    """:class:`StepRates` is the one step price the simulator takes: the 1.6 ms above; its record is what a plan
    keeps; a negative rate and an unknown optimizer are one error each, from the simulator as ``PipeDreamError``."""
    rates = costmodel.StepRates("sgd", 1e-9, 4e-4, 2e-5)
    assert rates.seconds(1e6, 10) == pytest.approx(1.6e-3)
    assert rates.seconds(1e6, 10, copy_on_write=True) == pytest.approx(0.6e-3 + 1e-3 * 8 / 6)
    assert costmodel.StepRates("adam", memory_Bps=1e11).seconds(1e9) == pytest.approx(8 * 1e9 / 1e11)
    assert costmodel.StepRates(memory_Bps=None).seconds(1e9) == 0.0
    assert rates.record() == {"optimizer": "sgd", "step_s_per_param_byte": 1e-9, "step_overhead_s": [4e-4, 2e-5],
                              "memory_Bps": costmodel.V100_MEMORY_BPS}
    with pytest.raises(ValueError, match="must not be negative"):
        costmodel.StepRates(s_per_tensor=-1e-6).seconds(1.0)
    g = LayerGraph(minibatch_size=1)
    g.add_node(Node("node1", "Linear", 1.0, 1.0, (8.0,), 1000.0))
    with pytest.raises(PipeDreamError, match="must not be negative"):
        stage_costs(g, [["node1"]], 1, step=costmodel.StepRates(s_per_param_byte=-1e-9))
    with pytest.raises(PipeDreamError, match="unknown optimizer 'lamb'.*--optimizer"):
        stage_costs(g, [["node1"]], 1, step=costmodel.StepRates("lamb"))


def test_the_whole_step_splits_into_call_tensors_and_the_rest_per_byte() -> None:
    """A 10 ms step over 1 MB in 100 tensors, 1 ms a call and 20 us a tensor: 7 ms are left for the bytes, 7 ns a
    byte, and the whole model's step is 10 ms again. Overheads of 3 ms against a 2 ms step are scaled by 2/3."""
    call_s, tensor_s, byte_s = split_step(0.010, 1e6, 100, 1e-3, 2e-5)
    assert (call_s, tensor_s, byte_s) == pytest.approx((1e-3, 2e-5, 7e-9))
    assert costmodel.optimizer_step_s(1e6, "adam", s_per_param_byte=byte_s, tensors=100, s_per_tensor=tensor_s,
                                      s_per_call=call_s) == pytest.approx(0.010)
    assert split_step(0.002, 1e6, 100, 1e-3, 2e-5) == pytest.approx((2e-3 / 3, 4e-5 / 3, 0.0))
    with pytest.raises(PipeDreamError, match="0 tensors"):
        split_step(0.010, 1e6, 0, 1e-3, 2e-5)


def test_the_overheads_come_from_steps_over_one_and_64_one_element_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    """A clock on which SGD's step takes 0.4 ms + 20 us a tensor and Adam's 1 ms + 40 us: the two timed steps (over
    1 and 64 one-element tensors, right after a forward and backward of the model) give those back; Muon is not
    timed (its rate stays per byte)."""
    built: list[tuple[str, int, bool]] = []
    real = step_rates.make_optimizer

    def recording(cfg: TrainConfig, params: list[torch.Tensor], hidden: tuple[()] = ()) -> torch.optim.Optimizer:
        params = list(params)
        built.append((cfg.optimizer, len(params), all(p.numel() == 1 for p in params)))
        return real(cfg, params, hidden)

    net = torch.nn.Linear(3, 2)
    ran: list[bool] = []

    def clock(fn, settings, prepare=None, budget_s=None):  # type: ignore[no-untyped-def]
        prepare()
        ran.append(net.weight.grad is None)  # the model's backward ran, its gradients dropped
        fn(None)
        name, k, _ = built[-1]
        return {"sgd": 4e-4 + 2e-5 * k, "adam": 1e-3 + 4e-5 * k}[name]

    monkeypatch.setattr(step_rates, "make_optimizer", recording)
    monkeypatch.setattr(step_rates, "_timed", clock)
    out = step_rates.step_overheads(net, torch.ones(4, 3), optimizers=["sgd", "adam", "muon"])
    assert out == {"sgd": pytest.approx((4e-4, 2e-5)), "adam": pytest.approx((1e-3, 4e-5))}
    assert built == [("sgd", 1, True), ("sgd", OVERHEAD_TENSORS, True), ("adam", 1, True),
                     ("adam", OVERHEAD_TENSORS, True)]
    assert ran == [True] * 4


def _tied_model() -> torch.nn.Sequential:
    """Embedding(10, 4) (one tensor, 160 B), Linear(4, 4) (two, 80 B) and a head whose weight is the embedding's
    (its own bias: one more tensor, 40 B): 5 tensors over the layers, 4 distinct, 280 B."""
    torch.manual_seed(0)
    emb, head = torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10)
    head.weight = emb.weight
    return torch.nn.Sequential(emb, torch.nn.Linear(4, 4), head)


def test_a_stage_steps_over_its_tensors_each_tied_one_once(tmp_path: Path) -> None:
    """The profile counts each layer's tensors (graph.json ``param_tensors``); a stage holding both users of the
    tied weight steps over it once: the whole model 4 tensors, so its step is c + 4a + 280b and, split from a 10 ms
    step, 10 ms; the halves [embedding, linear] and [head] step over 3 and 2 tensors, 240 and 200 B."""
    g = profile_module(_tied_model(), torch.randint(0, 10, (2, 3)), ProfileSettings(warmup=0, iters=1))
    assert g.tensors == {"node1": 1, "node2": 2, "node3": 2}
    write_profile(g, tmp_path, {"device": "cpu"})
    back = LayerGraph.read(tmp_path / "graph.txt", minibatch_size=2)
    assert back.tensors == g.tensors and back.param_tensors_of(back.nodes) == 4
    c, a, b = split_step(0.010, 280.0, 4, 1e-3, 1e-4)
    kw = dict(step=costmodel.StepRates(s_per_param_byte=b, s_per_call=c, s_per_tensor=a))
    (whole,) = stage_costs(back, [list(back.nodes)], 2, **kw)
    assert whole.step_s == pytest.approx(0.010)
    halves = stage_costs(back, [["node0", "node1", "node2"], ["node3"]], 2, **kw)
    assert [h.step_s for h in halves] == pytest.approx([c + 3 * a + 240 * b, c + 2 * a + 200 * b])
    (tmp_path / "graph.json").unlink()  # a profile taken before the counts were recorded: all per byte
    assert LayerGraph.read(tmp_path / "graph.txt").param_tensors_of(["node1", "node2"]) == 0
