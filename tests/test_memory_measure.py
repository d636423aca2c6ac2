"""Counting a stage's bytes (pipedream.runtime.memory_meter) against byte counts worked out from tensor shapes.

fp32 is 4 bytes an element, int64 8. The expected numbers below are written out from the layer sizes,
never obtained from the counting code itself.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from pipedream import schedules
from pipedream.runtime.actions import memory_window
from pipedream.runtime.comm import P2P
from pipedream.runtime.config import TrainConfig
from pipedream.runtime.executor import StageData, StageExecutor
from pipedream.runtime.memory_meter import CATEGORIES, MemoryMeter, SavedTensors, StageTally, bytes_by_category
from pipedream.runtime.optim import make_optimizer
from pipedream.runtime.stage import build_stages, straight_plan
from pipedream.runtime.versions import Policy, WeightVersions
from pipedream.schedules import Kind

IN, HID, OUT, B = 6, 5, 3, 4  # layer sizes and microbatch size of the single-stage model


def test_a_linear_forward_saves_its_input() -> None:
    lin = nn.Linear(IN, OUT)
    x = torch.randn(B, IN)
    saved = SavedTensors()
    with saved.hooks("u"):
        lin(x)
    counted = bytes_by_category([("weights", [lin.weight, lin.bias]), ("activations", saved.tensors())])
    assert counted == {"weights": 4 * (IN * OUT + OUT), "activations": 4 * B * IN}
    saved.drop("u")
    assert list(saved.tensors()) == []


def test_each_storage_is_counted_once_in_its_first_category() -> None:
    w = torch.zeros(10)
    view = w[2:5]  # a view holds the whole storage: 40 bytes, already counted as weights
    other = torch.zeros(3, dtype=torch.int64)
    counted = bytes_by_category([("weights", [w]), ("activations", [view, other, other])])
    assert counted == {"weights": 40, "activations": 24}


def _single_stage(optimizer: str, minibatches: int = 2, recompute: bool = False) -> StageExecutor:
    """Linear(IN, HID), Linear(HID, OUT) as one stage, loss mean(out^2), trained on ``minibatches``
    minibatches of B random samples with the memory counted after every action (``recompute``: the forward
    under torch.utils.checkpoint)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(IN, HID), nn.Linear(HID, OUT))
    stages = build_stages(model, straight_plan("t", 2, [2]), torch.randn(1, IN))
    module = stages.modules[0]
    versions = WeightVersions(module, Policy.STASH)
    cfg = TrainConfig(model="t", optimizer=optimizer, momentum=0.9, lr=0.1)
    opt = make_optimizer(cfg, versions.master)
    ex = StageExecutor(0, 1, module, versions, opt, P2P(10.0, torch.device("cpu")), None, stages.boundaries[0],
                       criterion=lambda out, y: (out ** 2).mean(), measure_memory=True, recompute=recompute)
    data = StageData(inputs=lambda m, j: torch.randn(B, IN), labels=lambda m, j: torch.zeros(B, dtype=torch.int64))
    sched = schedules.build("1f1b", [[0]], minibatches)
    ex.run(sched.order[0], sched, data, B)
    return ex


W = 4 * (IN * HID + HID + HID * OUT + OUT)  # bytes of the weights


@pytest.mark.parametrize("optimizer, state_bytes", [("sgd", W), ("adam", 2 * W + 4 * 4)])  # Adam: 2 moments + 4 steps
def test_single_stage_peak_by_hand(optimizer: str, state_bytes: int) -> None:
    """F0 B0 STEP F1 B1 STEP: the peak is after F1, with the optimizer state the first step created.

    weights and the gradient bucket: W each, and no stored version beyond the live weights (the
    newest version aliases them; nothing is in flight at a step, so nothing is copied); buffers: the input (B x IN)
    and the scaled loss (one float); activations: what the forward saved beyond its input and weights:
    the first layer's output (B x HID, saved by the second matmul) and the model output (B x OUT, saved
    by the square)."""
    ex = _single_stage(optimizer)
    mem = ex.memory
    assert mem is not None
    assert mem.breakdown == {"weights": W, "versions": 0, "gradients": W, "optimizer": state_bytes,
                             "buffers": 4 * B * IN + 4, "activations": 4 * B * (HID + OUT)}
    assert mem.peak_bytes == 2 * W + state_bytes + 4 * B * (IN + HID + OUT) + 4
    assert mem.max_copies == 1
    assert mem.counts == 6  # one count after every action
    assert ex.saved.by_unit == {}  # every backward dropped its unit's saved tensors


def test_a_muon_stage_holds_the_optimizer_state_the_memory_model_counts() -> None:
    """A small GPT (width 16, 2 blocks, vocabulary 50, 8 tokens) trained as one stage with Muon: the meter's
    optimizer bytes are Muon's momentum for the blocks' 2 x 12 x 16^2 matrix parameters and Adam's two moments for
    the other parameters, plus Adam's 4-byte step scalar for each of its 21 tensors (8 a block, 2 embeddings, the
    head's LayerNorm and projection), which the memory model leaves out; the memory model, from the profile, has
    the rest."""
    from pipedream.memory import plan_memory
    from pipedream.models.transformer import TransformerConfig, build_transformer, lm_loss
    from pipedream.profiler import ProfileSettings, profile_module
    from pipedream.runtime.optim import hidden_matrices

    gpt = TransformerConfig(vocab=50, seq=8, hidden=16, heads=2, layers=2, causal=True, dropout=0.0)
    torch.manual_seed(0)
    model = build_transformer(gpt)
    x = torch.randint(0, gpt.vocab, (B, gpt.seq))
    stages = build_stages(model, straight_plan("t", 4, [4]), x)
    module = stages.modules[0]
    versions = WeightVersions(module, Policy.STASH)
    opt = make_optimizer(TrainConfig(model="t", optimizer="muon", lr=1e-3), versions.master, hidden_matrices(model, x))
    ex = StageExecutor(0, 1, module, versions, opt, P2P(10.0, torch.device("cpu")), None, stages.boundaries[0],
                       criterion=lm_loss, measure_memory=True)
    sched = schedules.build("1f1b", [[0]], 2)
    ex.run(sched.order[0], sched, StageData(inputs=lambda m, j: x, labels=lambda m, j: x), B)
    hidden, params = 4 * 2 * 12 * 16**2, 4 * gpt.parameters()
    assert ex.memory is not None
    assert ex.memory.category_max["optimizer"] == hidden + 2 * (params - hidden) + 4 * 21
    graph = profile_module(model, x, ProfileSettings(warmup=0, iters=1))
    (need,) = plan_memory(graph, [list(graph.nodes)], [1], optimizer="muon")
    assert need.optimizer == hidden + 2 * (params - hidden)


def test_single_stage_recomputation_by_hand() -> None:
    """With recomputation the forward saves only its input (a buffer); the loss, outside the checkpoint, saves
    the output (B x OUT). Each backward is counted once more, when the recomputed first-layer output (B x HID) is
    alive, its unit's loss already consumed: the peak has the activations of the peak without recomputation,
    reached in the backward, and 2 counts more. No warning is raised."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ex = _single_stage("sgd", recompute=True)
    mem = ex.memory
    assert mem is not None
    assert mem.breakdown == {"weights": W, "versions": 0, "gradients": W, "optimizer": W,
                             "buffers": 4 * B * IN, "activations": 4 * B * (HID + OUT)}
    assert mem.counts == 6 + 2
    assert ex.saved.by_unit == {}


def test_the_tally_counts_what_a_full_count_counts_and_recounts_only_what_was_touched() -> None:
    w, v = torch.zeros(10), torch.zeros(5)  # fixed part: 40 bytes of weights, 20 of a stored version
    a_in, a_saved, b_in, posted = torch.zeros(3), [w, torch.zeros(7)], torch.zeros(2), [torch.zeros(4)]

    def fixed():  # noqa: ANN202
        return [("weights", [w]), ("versions", [v]), ("gradients", []), ("optimizer", [])]

    units = {"a": lambda: [("buffers", [a_in]), ("activations", a_saved)],  # unit a saved the weight, counted there
             "b": lambda: [("buffers", [b_in]), ("activations", [])]}
    tally = StageTally()
    expected = {**dict.fromkeys(CATEGORIES, 0), "weights": 40, "versions": 20, "buffers": 12 + 8 + 16, "activations": 28}
    assert tally.now(fixed, units, posted) == expected
    assert bytes_by_category([*fixed(), ("buffers", [a_in, b_in, *posted]), ("activations", a_saved)]) == expected
    a_saved.clear()  # unit a's backward freed its activations
    assert tally.now(fixed, units, posted)["activations"] == 28  # not touched: its count stands
    tally.touch("a")
    assert tally.now(fixed, units, posted)["activations"] == 0
    w = torch.zeros(20)  # a step moved the weights to a larger storage: fixed() sees it, counted after invalidate
    del units["b"]  # unit b left (its SEND_B popped it)
    tally.invalidate()
    assert tally.now(fixed, units, posted) == {**expected, "weights": 80, "buffers": 12 + 16, "activations": 0}


def test_meter_reset_forgets_the_peak() -> None:
    mem = MemoryMeter()
    mem.count([("weights", [torch.zeros(4)])], copies=2)
    assert (mem.peak_bytes, mem.max_copies) == (16, 2)
    mem.reset()
    assert mem.record()["peak_bytes"] == 0 and mem.record()["cuda_max_allocated_bytes"] is None


# tiny_model on 4 stages (tests.test_runtime_pipeline.LAYERS), fp32 weight bytes per stage from the layer shapes:
# conv 3->4 3x3 | linear 256->16 | linear 16->16 | linear 16->10
TINY_STAGE_WEIGHT_BYTES = [4 * (4 * 3 * 3 * 3 + 4), 4 * (256 * 16 + 16), 4 * (16 * 16 + 16), 4 * (16 * 10 + 10)]


@pytest.mark.slow
def test_1f1b_stages_hold_their_stashed_versions_beside_the_live_weights(tmp_path: Path) -> None:
    """1F1B with weight stashing on 4 stages: stage s holds 4 - s copies of its weights, the live ones
    among them (copy on write), so its stored versions beyond the live weights take 3 - s times its
    weight bytes: 3, 2, 1 and 0 copies. 24 minibatches: the meter counts over the first 10 only
    (:func:`memory_window`) and still sees the steady state's peak."""
    from tests.test_runtime_pipeline import run

    dumps = run(tmp_path, 4, max_minibatches=24)
    assert [max(d["copies"]) for d in dumps] == [4, 3, 2, 1] and dumps[0]["max_versions"] == 4
    for s, d in enumerate(dumps):
        mem = d["memory"]
        assert mem["breakdown"]["weights"] == TINY_STAGE_WEIGHT_BYTES[s]
        assert mem["category_max"]["versions"] == (3 - s) * TINY_STAGE_WEIGHT_BYTES[s]
        assert mem["max_copies"] == 4 - s
        assert mem["breakdown"]["optimizer"] == 0  # momentum 0: SGD keeps no state
    row = json.loads((tmp_path / "out" / "metrics.json").read_text())[-1]
    for s, d in enumerate(dumps):
        assert row[f"peak_memory_bytes_stage{s}"] == d["memory"]["peak_bytes"] == sum(d["memory"]["breakdown"].values())
        assert row[f"peak_versions_bytes_stage{s}"] == d["memory"]["breakdown"]["versions"]
    # the compute and the wait per stage: some compute on every stage, the last waits for its first input at least
    assert all(row[f"compute_s_stage{s}"] > 0 and row[f"wait_s_stage{s}"] >= 0 for s in range(4))
    assert row["wait_s_stage3"] > 0


def test_memory_window_ends_after_the_kth_minibatchs_last_backward() -> None:
    """The window of a 2-stage 1F1B rank list and of a GPipe list with 2 microbatches, by hand."""
    one_f_one_b = schedules.one_f_one_b([[0], [1]], 4)
    acts = one_f_one_b.order[1]  # last stage: RECV_F F B SEND_B per minibatch, then a STEP
    b_at = [i for i, a in enumerate(acts) if a.kind == Kind.B]
    assert memory_window(acts, 2) == b_at[1] + 1
    assert memory_window(acts, 4) == b_at[3] + 1
    assert memory_window(acts, 5) == len(acts)  # fewer minibatches than asked: every action
    gp = schedules.gpipe([[0], [1]], 3, 2).order[0]
    last_b_of_0 = max(i for i, a in enumerate(gp) if a.kind == Kind.B and a.minibatch == 0)
    assert memory_window(gp, 1) == last_b_of_0 + 1
    assert [a.minibatch for a in gp[:last_b_of_0 + 1] if a.kind == Kind.B] == [0, 0]


@pytest.mark.slow
def test_recomputation_keeps_one_microbatchs_activations_as_the_memory_model_says(tmp_path: Path) -> None:
    """PipeDream-Flush, 3 stages of :func:`tests.tiny.deep_model`, 4 microbatches of 2: stage s holds 3 - s of them.
    Without recomputation stage 0 saves, per microbatch, the copied flatten's output (2 x 3072 floats, for the
    linear's weight gradient); with it, only the microbatch being recomputed is saved, with its tanh output made
    again (2 x 32: the original was sent on and stays among the buffers). Stage 1: the tanh output (2 x 32) of
    2 microbatches, then of 1; the last stage holds one either way. Measured and modelled
    (:func:`pipedream.memory.plan_memory` on the profile) agree, but for the loss's own saved targets (2 int64) and
    4-byte total weight; the inputs held (``buffers``) do not change."""
    from pipedream import memory
    from pipedream.profiler import ProfileSettings, profile_module
    from tests.test_runtime_pipeline import run
    from tests.tiny import deep_model

    plan = straight_plan("t", 8, [3, 3, 2])
    graph = profile_module(deep_model(), torch.randn(2, 3, 32, 32), ProfileSettings(warmup=0, iters=1))
    measured, modelled, buffers = {}, {}, {}
    for recompute in (False, True):
        dumps = run(tmp_path / str(recompute), 3, factory=deep_model, plan=plan, schedule="pipedream_flush",
                    microbatches=4, max_minibatches=2, recompute=recompute)
        measured[recompute] = [d["memory"]["category_max"]["activations"] for d in dumps]
        modelled[recompute] = [m.activations for m in memory.plan_memory(
            graph, [s.nodes for s in plan.stages], [1, 1, 1], schedule="pipedream_flush", microbatches=4,
            recompute=recompute)]
        buffers[recompute] = [d["memory"]["category_max"]["buffers"] for d in dumps]
    assert buffers[True] == buffers[False]  # every in-flight microbatch's inputs are kept either way
    assert measured[False] == [3 * 4 * 2 * 3072, 2 * 4 * 2 * 32, 4 * 2 * (32 + 10) + 2 * 8 + 4]
    assert measured[True] == [4 * 2 * (3072 + 32), 4 * 2 * 32, 4 * 2 * (32 + 10) + 2 * 8 + 4]
    for recompute in (False, True):
        assert modelled[recompute][:2] == measured[recompute][:2]
        assert modelled[recompute][2] == measured[recompute][2] - 2 * 8 - 4
