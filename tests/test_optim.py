"""The optimizers of pipedream.runtime.optim: which parameters Muon takes, and Muon with Adam acting as one optimizer."""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn

from pipedream.models import build_model, example_input
from pipedream.runtime.config import TrainConfig
from pipedream.runtime.optim import MuonAdam, hidden_matrices, make_optimizer
from pipedream.runtime.stage import build_stages, straight_plan

MUON = TrainConfig(optimizer="muon", lr=3e-4, weight_decay=0.0)


def _names(model: nn.Module, params: list[torch.Tensor]) -> set[str]:
    ids = {id(p) for p in params}
    return {n for n, p in model.named_parameters() if id(p) in ids}


def test_muon_takes_exactly_the_gpt_blocks_matrices_and_adam_the_rest() -> None:
    """The reduced GPT (Embedding, 8 Blocks, Head): Muon on each block's qkv, proj, fc and out weights (32 tensors);
    Adam on the token and position embeddings, the head's projection (the output layer: the last Linear called),
    the LayerNorms and every bias."""
    model = build_model("gpt")
    hidden = hidden_matrices(model, example_input("gpt", 2))
    expected = {f"{b}.{m}.weight" for b in range(1, 9) for m in ("qkv", "proj", "fc", "out")}
    assert len(hidden) == 32 and _names(model, hidden) == expected
    opt = make_optimizer(MUON, model.parameters(), hidden)
    assert isinstance(opt, MuonAdam)
    muon, adam = opt.parts
    assert isinstance(muon, torch.optim.Muon) and isinstance(adam, torch.optim.Adam)
    assert _names(model, muon.param_groups[0]["params"]) == expected
    rest = _names(model, adam.param_groups[0]["params"])
    assert rest == {n for n, _ in model.named_parameters()} - expected
    assert {"0.tokens.weight", "0.positions.weight", "9.proj.weight", "9.ln.weight", "1.ln1.bias", "1.qkv.bias"} <= rest


def test_forward_for_the_choice_changes_nothing_of_training() -> None:
    """One forward in eval mode under a forked RNG: dropout draws, BatchNorm statistics and modes are untouched."""
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 3))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(5, 4)
    rng = torch.get_rng_state()
    assert _names(model, hidden_matrices(model, x)) == {"0.weight"}
    assert torch.equal(torch.get_rng_state(), rng) and model.training
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())


class _Tied(nn.Module):
    """Embedding, a Linear, a Linear whose weight is also a second embedding's table, the output Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.mid, self.tied, self.out = nn.Embedding(10, 6), nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 10)
        self.side = nn.Embedding(6, 6)
        self.side.weight = self.tied.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.tied(self.mid(self.emb(ids))) + self.side(ids % 6))


def test_a_linear_tied_to_an_embedding_is_not_hidden() -> None:
    model = _Tied()
    assert _names(model, hidden_matrices(model, torch.tensor([[1, 2]]))) == {"mid.weight"}


def test_every_stage_of_a_pipeline_gets_the_models_choice() -> None:
    """Stages share the model's parameter objects, so the set chosen on the whole model splits over them: stage 0
    (input and embedding) has no hidden matrix and gets Adam alone, the others both parts; 32 in all."""
    model = build_model("gpt")
    example = example_input("gpt", 2)
    hidden = hidden_matrices(model, example)
    stages = build_stages(model, straight_plan("gpt", 10, [1, 3, 3, 3]), example)
    counts = []
    for module in stages.modules:
        opt = make_optimizer(MUON, module.parameters(), hidden)
        muon = [p for part in opt.parts if isinstance(part, torch.optim.Muon) for p in part.param_groups[0]["params"]]
        counts.append(len(muon))
    assert counts == [0, 12, 12, 8]


def _step(opt: torch.optim.Optimizer, model: nn.Module, x: torch.Tensor) -> None:
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()


@pytest.mark.parametrize("bias", [True, False], ids=["both-parts", "muon-only"])
def test_muon_adam_is_one_optimizer_whose_state_survives_a_checkpoint(bias: bool) -> None:
    """The learning rate set on ``param_groups`` reaches both parts; the state dict, saved and loaded as a
    checkpoint is (``torch.load(weights_only=True)``), makes a fresh optimizer continue bitwise like the first.
    Without biases the Adam part is empty (the output layer is not in ``hidden``, so Adam has it here: use
    every weight as hidden to leave Adam nothing)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8, bias=bias), nn.Tanh(), nn.Linear(8, 4, bias=bias))
    x = torch.randn(5, 6)
    hidden = hidden_matrices(model, x) if bias else [model[0].weight, model[2].weight]
    opt = make_optimizer(MUON, model.parameters(), hidden)
    assert len(opt.parts) == (2 if bias else 1)  # type: ignore[attr-defined]
    for group in opt.param_groups:
        group["lr"] = 1e-2
    assert all(g["lr"] == 1e-2 for part in opt.parts for g in part.param_groups)  # type: ignore[attr-defined]
    _step(opt, model, x)
    assert len(opt.state) == len(list(model.parameters()))
    buffer = io.BytesIO()
    torch.save({"optimizer": opt.state_dict(), "model": model.state_dict()}, buffer)
    _step(opt, model, x)
    after = [p.detach().clone() for p in model.parameters()]

    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    model.load_state_dict(saved["model"])
    fresh = make_optimizer(MUON, model.parameters(), hidden)
    fresh.load_state_dict(saved["optimizer"])
    assert fresh.param_groups[0]["lr"] == 1e-2
    _step(fresh, model, x)
    assert all(torch.equal(a, p) for a, p in zip(after, model.parameters(), strict=True))


def test_a_stage_without_parameters_still_gets_an_optimizer() -> None:
    opt = make_optimizer(MUON, [], [])
    opt.step()
    assert len(opt.param_groups) == 1
