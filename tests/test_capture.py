"""Any nn.Module as a graph of layers (pipedream.capture): torchvision models and a Hugging Face GPT-2, no surgery."""

from __future__ import annotations

import pytest
import torch
import torchvision
from torch import nn

from pipedream import capture
from pipedream import layers as layers_mod
from pipedream.errors import PipeDreamError
from pipedream.plan import Plan, Stage
from pipedream.runtime import split
from pipedream.runtime.stage import build_stages


def tiny_gpt2(seed: int = 0) -> nn.Module:
    """A randomly initialised GPT-2 with tied input and output embeddings (nothing is downloaded)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


MODELS = {
    "gpt2": (tiny_gpt2, lambda: torch.randint(0, 64, (4, 8))),
    "resnet18": (lambda: torchvision.models.resnet18(num_classes=10), lambda: torch.randn(4, 3, 32, 32)),
    "mobilenet_v2": (lambda: torchvision.models.mobilenet_v2(num_classes=10), lambda: torch.randn(4, 3, 32, 32)),
}


def _logits(out: object) -> torch.Tensor:
    return out.logits if hasattr(out, "logits") else out  # type: ignore[return-value,attr-defined]


def _halves(model: nn.Module, x: torch.Tensor, cut: float = 0.5) -> Plan:
    """A 2-stage plan cutting the layer graph after ``cut`` of its nodes."""
    gm = split.trace(model, "layer", x)
    ids = [i for n, i in split.node_ids(gm).items() if n.op in split.OPS]
    k = int(len(ids) * cut)
    return Plan(model="t", cluster="manual", workers=2, stages=[Stage(ids[:k], 1, [0]), Stage(ids[k:], 1, [1])],
                minibatch_size=0, time_per_sample_s=0.0, dp_time_per_sample_s=0.0)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_bare_module_is_captured_by_export_and_cut_into_stages_that_compute_the_model(name: str) -> None:
    """The layer graph and the two stages compute exactly the model's output, in evaluation mode (batch norm's
    running statistics, no dropout) and in training mode (the same dropout draws); the stages' parameters are
    the model's, under the model's names; gradients through the stages are the model's."""
    make, example = MODELS[name]
    torch.manual_seed(0)
    model, x = make(), example()
    ops, how = capture.capture_ops(model, x)
    assert how == "torch.export"
    layers = layers_mod.group_layers(ops, model)
    assert len(layers.graph.nodes) < len(ops.graph.nodes)
    stages = build_stages(model, _halves(model, x), x)
    names = dict(model.named_parameters())
    for module in stages.modules:
        for n, p in module.named_parameters():
            assert p is dict(model.named_parameters(remove_duplicate=False))[n]
    held = {id(p) for m in stages.modules for p in m.parameters()}
    assert held == {id(p) for p in names.values()}
    for training in (False, True):
        model.train(training)
        for m in (layers, *stages.modules):
            m.train(training)
        with torch.no_grad():
            torch.manual_seed(1)
            ref = _logits(capture.call_model(model, x))
            torch.manual_seed(1)
            whole = _logits(layers(x))
            torch.manual_seed(1)
            piped = _logits(stages.modules[1](*stages.modules[0](x)))
        assert torch.equal(whole, ref) and torch.equal(piped, ref)
    model.train()
    torch.manual_seed(2)
    _logits(capture.call_model(model, x)).square().mean().backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    torch.manual_seed(2)
    _logits(stages.modules[1](*stages.modules[0](x))).square().mean().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref_grads[n], rtol=1e-5, atol=1e-7)


def test_gpt2_tied_embeddings_are_held_by_the_first_and_last_stages() -> None:
    model, x = tiny_gpt2(), torch.randint(0, 64, (4, 8))
    stages = build_stages(model, _halves(model, x), x)
    assert len(stages.shared) == 1
    sh = stages.shared[0]
    assert sh.stages == (0, 1)
    tied = model.transformer.wte.weight
    assert stages.modules[0].get_parameter(sh.name_in(0)) is tied is stages.modules[1].get_parameter(sh.name_in(1))


def test_export_failure_falls_back_to_fx(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object) -> None:
        raise RuntimeError("export refused")

    monkeypatch.setattr(capture, "_export", refuse)
    model, x = MODELS["resnet18"][0](), torch.randn(2, 3, 32, 32)
    ops, how = capture.capture_ops(model, x)
    assert how == "torch.fx"
    model.eval()
    layers = layers_mod.group_layers(ops, model).eval()
    with torch.no_grad():
        assert torch.equal(layers(x), model(x))


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # a Python branch on a tensor's value: no graph can hold it
            return self.fc(x)
        return -x


def test_what_cannot_be_captured_is_one_line_naming_the_code() -> None:
    with pytest.raises(PipeDreamError) as e:
        capture.capture_ops(Branchy(), torch.randn(2, 4))
    message = str(e.value)
    assert "\n" not in message and "cannot capture Branchy" in message
    assert "test_capture.py" in message and "if x.sum() > 0" in message  # the failing line, for each tracer
    assert "torch.export:" in message and "torch.fx:" in message


class Gate(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.mean() > 0 else x  # a Python branch on a tensor's value


class Gated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.gate = nn.Linear(4, 4), Gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gate(self.fc(x))


def test_what_cannot_be_captured_names_the_layer_the_reason_and_the_fix() -> None:
    with pytest.raises(PipeDreamError) as e:
        capture.capture_ops(Gated(), torch.randn(2, 4))
    message = str(e.value)
    assert "\n" not in message and message.startswith("cannot capture Gated as a graph (torch.export: ")
    assert message.count("in layer gate (Gate) at test_capture.py") == 2  # each tracer's reason names it
    assert "control flow" in message  # fx's reason
    assert message.endswith("; fix: make that code traceable: no Python branch on a tensor's value (torch.where "
                            "instead of if), or a config option that skips it")


class Cached(nn.Module):
    """Returns its logits with an object no graph can return (as a key/value cache is) and a flag."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> dict[str, object]:
        return {"logits": self.fc(x), "cache": object(), "flag": True}


def test_what_is_not_a_tensor_in_the_output_is_left_out() -> None:
    model, x = Cached(), torch.randn(2, 4)
    ops, how = capture.capture_ops(model, x)
    assert how == "torch.export"
    out = ops(x)
    assert out.keys() == {"logits", "cache", "flag"} and out["cache"] is None is out["flag"]
    assert torch.equal(out["logits"], model(x)["logits"])


class Heads(nn.Module):
    """Takes a dict of two inputs and returns a tuple: any structure goes through."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(3, 5), nn.Linear(2, 5)
        self.head = nn.Linear(5, 4)

    def forward(self, image: torch.Tensor, extra: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.a(image) + self.b(extra))
        return self.head(h), h


def test_dict_inputs_and_tuple_outputs() -> None:
    model = Heads()
    x = {"image": torch.randn(4, 3), "extra": torch.randn(4, 2)}
    gm = split.trace(model, "layer", x)
    assert len([n for n in gm.graph.nodes if n.op == "placeholder"]) == 2
    out = gm(*capture.flat_inputs(x))
    ref = model(**x)
    assert isinstance(out, tuple) and all(torch.equal(a, b) for a, b in zip(out, ref, strict=True))


def test_an_inplace_op_at_the_head_of_a_stage_trains() -> None:
    """Stage 1 starts with ``ReLU(inplace=True)`` on the tensor it receives (a leaf of autograd, which refuses
    in-place changes): its input is cloned, and the gradients are the whole model's."""
    from pipedream.runtime.stage import straight_plan

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(inplace=True), nn.Linear(8, 2))
    x = torch.randn(3, 4)
    stages = build_stages(model, straight_plan("t", 3, [1, 2]), x)
    received = stages.modules[0](x)[0].detach().requires_grad_()
    stages.modules[1](received).sum().backward()
    model.zero_grad()
    model(x).sum().backward()
    assert received.grad is not None
    w = model[2].weight.grad.clone()
    model.zero_grad()
    stages.modules[1](stages.modules[0](x)[0]).sum().backward()
    torch.testing.assert_close(model[2].weight.grad, w)


def test_layers_open_containers_and_large_modules() -> None:
    model = torchvision.models.resnet18(num_classes=10)
    layers = layers_mod.layer_paths(model)
    assert {"conv1", "bn1", "layer1.0", "layer1.1", "fc"} <= layers  # blocks holding <= 1/16 stay whole
    assert "layer4.0" not in layers and "layer4.0.conv1" in layers  # 4.7 M of 11.2 M parameters: opened


def test_shape_and_dtype_errors_name_the_layer() -> None:
    """A Sequential fed the wrong width names its layer, the input's shape and dtype; a GPT-2 fed float tokens
    names its embedding (the layer in the traceback of the capture)."""
    from pipedream.profiler import ProfileSettings, profile_module
    from tests.hf_gpt2 import gpt2

    settings = ProfileSettings(warmup=0, iters=1)
    with pytest.raises(PipeDreamError) as e:
        profile_module(nn.Sequential(nn.Flatten(), nn.Linear(8, 4)), torch.randn(4, 3, 2, 2), settings)
    assert str(e.value) == ("layer node2 (Linear(in_features=8, out_features=4, bias=True)) failed on (4, 12) float32: "
                            "mat1 and mat2 shapes cannot be multiplied (4x12 and 8x4)")
    with pytest.raises(PipeDreamError, match=r"float32 instead in layer transformer\.wte \(Embedding\) at modeling_gpt2"):
        profile_module(gpt2(), torch.randn(4, 16), settings)


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.out = nn.Embedding(10, 8), nn.Linear(8, 10)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.emb(input_ids)))


TinyLM.__module__ = "transformers.models.tiny"  # what the capture recognises a transformers model by


def test_a_transformers_model_falls_back_to_the_hugging_face_tracer(monkeypatch: pytest.MonkeyPatch) -> None:
    """When export and fx both fail, a transformers model goes to transformers.utils.fx (transformers < 5; here a
    stand-in that records how it is called), with the forward's argument names as input names."""
    import sys
    import types

    def refuse(*args: object) -> None:
        raise RuntimeError("refused")

    calls: list[list[str]] = []

    def hf_symbolic_trace(model: nn.Module, input_names: list[str]) -> torch.fx.GraphModule:
        calls.append(input_names)
        return torch.fx.symbolic_trace(model)

    monkeypatch.setattr(capture, "_export", refuse)
    monkeypatch.setattr(capture, "_fx", refuse)
    monkeypatch.setitem(sys.modules, "transformers.utils.fx", types.SimpleNamespace(symbolic_trace=hf_symbolic_trace))
    model, x = TinyLM(), torch.randint(0, 10, (3, 5))
    ops, how = capture.capture_ops(model, x)
    assert how == "transformers fx" and calls == [["input_ids"]]
    layers = layers_mod.group_layers(ops, model)
    assert torch.equal(layers(x), model(x))
