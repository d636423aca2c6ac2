"""GPT and BERT (pipedream/models/transformer.py): shapes, causality, parameter counts of the paper's
configurations (meta device), the FLOP-costed profile, masking, and that the reduced presets learn."""

from __future__ import annotations

import pytest
import torch

from pipedream.models import build_model, example_input, get_spec
from pipedream.models.transformer import IGNORE, config_of

NAMES = ["gpt", "gpt_2.2b", "gpt_3.8b", "bert"]


@pytest.mark.parametrize("name", ["gpt", "bert"])
def test_shapes_and_layers(name: str) -> None:
    cfg = config_of(name, "reduced")
    model = build_model(name).eval()
    x = example_input(name, 3)
    assert x.shape == (3, cfg.seq) and x.dtype == torch.int64
    assert model(x).shape == (3, cfg.seq, cfg.vocab)
    assert len(model) == cfg.layers + 2  # embedding, blocks, head: what the 2BW planner cuts


def test_gpt_is_causal_and_bert_is_not() -> None:
    for name, causal in (("gpt", True), ("bert", False)):
        model = build_model(name).eval()
        x = example_input(name, 2)
        y = x.clone()
        y[:, -1] = (y[:, -1] + 1) % 100  # change the last token only
        same = torch.allclose(model(x)[:, :-1], model(y)[:, :-1], atol=1e-5)
        assert same == causal, name


@pytest.mark.parametrize(("name", "billions"), [("gpt", 1.3), ("gpt_2.2b", 2.2), ("gpt_3.8b", 3.9), ("bert", 0.33)])
def test_full_presets_have_the_papers_sizes(name: str, billions: float) -> None:
    """12 L h^2 + 13 L h + (V + s) h + h V + 2 h as built; the paper's totals count the vocabulary once."""
    cfg = config_of(name, "full")
    with torch.device("meta"):
        model = build_model(name, "full")
    h, L, V, s = cfg.hidden, cfg.layers, cfg.vocab, cfg.seq
    assert sum(p.numel() for p in model.parameters()) == 12 * L * h**2 + 13 * L * h + (V + s) * h + h * V + 2 * h
    tied = cfg.parameters() - h * V  # the head shares the embedding matrix
    assert round(tied / 1e9, 2 if billions < 1 else 1) == billions
    assert cfg.seq == 512


@pytest.mark.parametrize("name", NAMES)
def test_flop_profile_matches_the_model(name: str) -> None:
    from pipedream.planner.twobw import find_blocks
    from pipedream.table2bw.paper import V100_PEAK_FLOPS, transformer_graph

    cfg = config_of(name, "full")
    g = transformer_graph(cfg, samples=2)
    with torch.device("meta"):
        model = build_model(name, "full")
    for i, layer in enumerate(model):
        assert g.nodes[f"node{i + 1}"].param_bytes == 4 * sum(p.numel() for p in layer.parameters())
    blocks = find_blocks(g)
    assert blocks.count == cfg.layers and (blocks.start, blocks.stop) == (2, 2 + cfg.layers)
    block = g.nodes["node2"]
    flops = 2 * (24 * cfg.seq * cfg.hidden**2 + 4 * cfg.seq**2 * cfg.hidden)  # 2 samples
    assert block.fwd_s == pytest.approx(flops / (0.3 * V100_PEAK_FLOPS)) and block.bwd_s == pytest.approx(2 * block.fwd_s)


def test_bert_masks_15_percent_deterministically() -> None:
    spec = get_spec("bert")
    train, _ = spec.make_datasets("reduced", 64, 16, 0)  # type: ignore[misc]
    x, y = train.batch(range(64))
    masked = y != IGNORE
    assert masked.float().mean().item() == pytest.approx(0.15, abs=0.02)
    mask_id = config_of("bert", "reduced").vocab - 1
    assert bool((x[masked] == mask_id).all()) and not bool((x[~masked] == mask_id).any())
    assert torch.equal(train.batch(range(64))[0], x)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt", "bert"])
def test_reduced_preset_learns_on_ptb(name: str) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    spec = get_spec(name)
    train, _ = spec.make_datasets("reduced", 64, 16, 0)  # type: ignore[misc]
    batches = [train.batch(range(i * 16, (i + 1) * 16)) for i in range(4)]
    model = build_model(name)
    opt = torch.optim.Adam(model.parameters(), 3e-3)

    def loss() -> float:
        model.eval()
        with torch.no_grad():
            out = sum(float(spec.criterion(model(x), y)) for x, y in batches) / len(batches)
        model.train()
        return out

    before = loss()
    for step in range(12):
        x, y = batches[step % len(batches)]
        opt.zero_grad()
        spec.criterion(model(x), y).backward()
        opt.step()
    assert loss() < 0.8 * before


def test_profile_of_the_reduced_gpt_has_its_blocks() -> None:
    """The profiler's chain of the reduced GPT is what the 2BW planner cuts: input, embedding, 8 identical
    blocks, head."""
    from pipedream.planner.twobw import find_blocks, stage_nodes
    from pipedream.profiler import ProfileSettings, profile_module

    model = build_model("gpt")
    g = profile_module(model, example_input("gpt", 2), ProfileSettings(warmup=0, iters=1), name="gpt")
    blocks = find_blocks(g)
    assert (blocks.start, blocks.stop) == (2, 10)
    assert stage_nodes(blocks, 4) == [["node0", "node1", "node2", "node3"], ["node4", "node5"], ["node6", "node7"],
                                      ["node8", "node9", "node10"]]


def gpt_without_dropout():  # type: ignore[no-untyped-def]
    """The reduced GPT without dropout on its PTB data, as a user model (``tests.test_transformer:gpt_without_dropout``):
    deterministic, so a pipeline's weights can be compared with a one-process replay."""
    from dataclasses import replace

    from pipedream.models import ModelSpec
    from pipedream.models import transformer as T

    cfg = replace(config_of("gpt", "reduced"), dropout=0.0)
    return ModelSpec(name="gpt0", task="language_model", build=lambda p: T.build_transformer(cfg),
                     input_shape=lambda p: (cfg.seq,), dataset="penn_treebank", criterion=T.lm_loss,
                     make_datasets=lambda p, tr, va, seed: T._lm_data(cfg, tr, va, seed),
                     example=lambda p, b, s: T._example(cfg, b, s))


def _2bw_run_and_replay(tmp_path, optimizer: str) -> tuple[dict, dict]:  # type: ignore[no-untyped-def]
    """4 stages, 4 microbatches of 8, two epochs of 8 minibatches of the GPT without dropout under 2BW with
    ``optimizer`` (lr 3e-4, no weight decay): the runtime's final weights and those of
    W(t+1) = W(t) - lr * step(grad f_t(W(t-1))) computed in one process with the optimizer the runtime builds
    (:func:`pipedream.runtime.optim.make_optimizer`, Muon's matrices chosen on the whole model as the workers do)."""
    from pipedream.data.base import minibatches
    from pipedream.runtime.config import TrainConfig
    from pipedream.runtime.launch import spawn_local
    from pipedream.runtime.optim import hidden_matrices, make_optimizer
    from pipedream.runtime.stage import straight_plan

    name = "tests.test_transformer:gpt_without_dropout"
    straight_plan(name, 10, [4, 2, 2, 2]).save(tmp_path / "plan.json")
    cfg = TrainConfig(model=name, out_dir=str(tmp_path / "out"), progress=False, debug_dump=True, comm_timeout_s=60,
                      plan=str(tmp_path / "plan.json"), schedule="2bw", microbatches=4, epochs=2, batch_size=32,
                      lr=3e-4, optimizer=optimizer, weight_decay=0.0, train_subset=512, val_subset=64,
                      max_minibatches=8, measure_memory=False)
    spawn_local(cfg, 4, timeout_s=300)
    final = {k: v for r in range(4) for k, v in
             torch.load(tmp_path / "out" / "debug" / f"rank{r}.pt", weights_only=False)["params"].items()}
    spec = get_spec(name)
    train, _ = spec.make_datasets("reduced", 512, 64, 0)  # type: ignore[misc]
    model = build_model(name, "reduced", 0)
    hidden = hidden_matrices(model, train.batch([0])[0]) if optimizer == "muon" else []
    opt = make_optimizer(cfg, list(model.parameters()), hidden)
    previous = None
    for epoch in range(2):
        for i, (x, y) in minibatches(train, 32, 0, epoch):
            if i == 8:
                break
            current = [p.detach().clone() for p in model.parameters()]
            with torch.no_grad():  # the gradient at the previous version W(t - 1) ...
                for p, old in zip(model.parameters(), previous or current, strict=True):
                    p.copy_(old)
            opt.zero_grad()
            for xm, ym in zip(x.chunk(4), y.chunk(4), strict=True):  # the runtime's microbatches, summed in order
                (spec.criterion(model(xm), ym) / 4).backward()
            with torch.no_grad():  # ... applied to the current weights W(t)
                for p, now in zip(model.parameters(), current, strict=True):
                    p.copy_(now)
            opt.step()
            previous = current
    return final, {n: p.detach() for n, p in model.named_parameters()}


@pytest.mark.slow
def test_2bw_pipeline_of_the_gpt_equals_its_update_rule_with_adam(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The runtime's final weights are those of W(t+1) = W(t) - lr * Adam(grad f_t(W(t-1))) computed in one process
    (so 2BW's slower start against DP in results/table_2bw is the update rule's, not the runtime's)."""
    final, reference = _2bw_run_and_replay(tmp_path, "adam")
    assert final.keys() == reference.keys()
    for n, w in final.items():
        torch.testing.assert_close(w, reference[n], rtol=1e-4, atol=2e-5)


@pytest.mark.slow
def test_2bw_pipeline_of_the_gpt_equals_its_update_rule_with_muon(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The same with Muon on the blocks' matrices and Adam on the rest, each stage holding its share of both.

    torch's Muon runs its Newton-Schulz iterations in bfloat16, so the last-bit differences between the pipeline's
    gradients and the replay's (the Adam test's tolerance) become bfloat16 ones in Muon's updates: compared by the
    distance each tensor moved from its initial value, the pipeline ends about 1% from the replay (measured: at most
    1.2% on a block's matrix, 0.2% on the embedding), where the rule without the delay, W(t+1) = W(t) - lr *
    step(grad f_t(W(t))), ends 13-23% from it."""
    final, reference = _2bw_run_and_replay(tmp_path, "muon")
    model = build_model("tests.test_transformer:gpt_without_dropout", "reduced", 0)
    initial = {n: p.detach() for n, p in model.named_parameters()}
    assert final.keys() == reference.keys()
    for n, w in final.items():
        moved = float((reference[n] - initial[n]).norm())
        assert float((w - reference[n]).norm()) <= 0.03 * moved, n
