"""Hugging Face models of five families with their default configs (``use_cache=True``; tests/hf_families.py) as a
user brings them: captured by torch.export with the key/value cache turned off and one note saying so; profiled,
planned into a 2-stage straight pipeline and trained one epoch in both modes (GPT-2: tests/test_gpt2.py)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

import pipedream
from pipedream import capture
from pipedream.models import logits_of
from tests import hf_families

NOTE = "use_cache turned off for capture (training needs no key/value cache)"


def _notes(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("note:")]


def _use_cache(model: nn.Module) -> set[bool]:
    return {m.config.use_cache for m in model.modules() if hasattr(getattr(m, "config", None), "use_cache")}


@pytest.mark.parametrize("family", sorted(hf_families.FAMILIES))
def test_a_default_config_is_captured_with_its_cache_turned_off_and_one_note(
        family: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Export captures the model as it comes; the cache is off in every config the model holds (T5's decoder has a
    copy of its own) and one line says so; the graph computes the model's logits."""
    model = hf_families.build(family)
    assert True in _use_cache(model)  # transformers' default (T5 turns its encoder's copy off itself)
    x, _ = hf_families.minibatch(hf_families.counting(family, 4, 0))
    ops, how = capture.capture_ops(model, x)
    assert how == "torch.export"
    assert _notes(capsys.readouterr().err) == [f"note: {type(model).__name__}: {NOTE}"]
    assert _use_cache(model) == {False}
    model.eval()
    ops.eval()
    with torch.no_grad():
        torch.testing.assert_close(logits_of(ops(*capture.flat_inputs(x))), logits_of(capture.call_model(model, x)))
    capture.capture_ops(model, x)  # the cache is off already: nothing more to say
    assert _notes(capsys.readouterr().err) == []


class LM(nn.Module):
    """A user's module around a Hugging Face model that returns its logits."""

    def __init__(self) -> None:
        super().__init__()
        self.lm = hf_families.build("gpt2")

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids).logits  # type: ignore[no-any-return]


def test_a_model_inside_the_users_module_has_its_cache_turned_off(capsys: pytest.CaptureFixture[str]) -> None:
    model = LM()
    x, _ = hf_families.minibatch(hf_families.counting("gpt2", 4, 0))
    ops, how = capture.capture_ops(model, x)
    assert how == "torch.export" and not model.lm.config.use_cache
    assert _notes(capsys.readouterr().err) == [f"note: LM: {NOTE}"]
    model.eval()
    ops.eval()
    with torch.no_grad():
        torch.testing.assert_close(ops(x), model(x))


def test_a_tensor_broadcast_over_the_batch_crosses_a_stage_boundary_whole() -> None:
    """Llama's rotary cosines and sines are ``(1, positions, head width)``: cut right after them, the boundary's
    shapes are the tensors' own (a receive buffer of ``(batch, ...)`` would be left mostly unwritten)."""
    from pipedream.plan import Plan, Stage
    from pipedream.runtime import split
    from pipedream.runtime.stage import build_stages

    model = hf_families.build("llama")
    x, _ = hf_families.minibatch(hf_families.counting("llama", 4, 0))
    gm = split.trace(model, "layer", x)
    ids = [(n.target, i) for n, i in split.node_ids(gm).items() if n.op in split.OPS]
    k = next(j for j, (target, _) in enumerate(ids) if target == "model_layers_0_input_layernorm")
    plan = Plan(model="llama", cluster="manual", workers=2, minibatch_size=4, time_per_sample_s=0.0,
                dp_time_per_sample_s=0.0, stages=[Stage([i for _, i in ids[:k]], 1, [0]),
                                                  Stage([i for _, i in ids[k:]], 1, [1])])
    stages = build_stages(model, plan, x)
    with torch.no_grad():
        sent = [(tuple(t.shape), t.dtype) for t in stages.modules[0](*capture.flat_inputs(x))]
    assert stages.boundaries[0].batched(4) == sent
    assert ((1, hf_families.LENGTH, 8), torch.float32) in sent


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "t5", "bert"])
def test_a_default_config_profiles_plans_and_trains_in_both_modes(family: str, tmp_path: Path) -> None:
    """Profiled on a minibatch of 8, planned into 2 straight stages, trained one epoch of 32 samples by a pipeline
    and by 2 data-parallel workers, each worker building the model from a copy with the cache still on."""
    train, val = hf_families.counting(family, 32, 1), hf_families.counting(family, 16, 2)
    x, y = hf_families.minibatch(train[:8])
    graph = pipedream.profile(hf_families.build(family), x, target=y, warmup=0, iters=1, in_situ=False)
    assert graph.minibatch_size == 8
    plan = pipedream.partition(graph, "2:1e9", straight=True)
    assert len(plan.stages) == 2
    config = pipedream.TrainConfig(epochs=1, batch_size=8, optimizer="adam", lr=0.01, progress=False,
                                   measure_memory=False, comm_timeout_s=60)
    for mode in ("pipedream", "dp"):
        rows = pipedream.train(hf_families.build(family), plan, (train, val),
                               replace(config, out_dir=str(tmp_path / mode)), mode=mode, workers=2, timeout_s=300)
        assert len(rows) == 1 and rows[0]["train_samples"] == 32, (mode, rows)
        assert math.isfinite(rows[0]["train_loss"]) and 0.0 <= rows[0]["val_accuracy"] <= 1.0
