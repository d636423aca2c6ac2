"""torch.distributed.pipelining runs our plans (``--runtime torch``): each of torch's seven schedules trains like one
process doing the same minibatches (all seven are synchronous: one weight version, a flush per minibatch).

The workers (:mod:`pipedream.runtime.torch_worker`) cut :func:`tests.tiny.tiny_model` into the plan's stages, run
torch's schedule class on gloo and take SGD steps with momentum and weight decay; the final weights must be those of
plain SGD on the whole minibatches in one process (:func:`tests.test_runtime_pipeline.reference`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pipedream.errors import PipeDreamError
from pipedream.runtime.config import TORCH_SCHEDULES
from pipedream.runtime.stage import straight_plan
from pipedream.runtime.torch_worker import train as torch_train
from pipedream.torch_layout import layout, place
from tests.test_runtime_pipeline import reference, run
from tests.tiny import SkipNet, op_plan, reference_batches, tied_model, tiny_model

MINIBATCHES = 3
# SkipNet's skip value `a` (tanh of fc1) leaves stage 1 for stage 3, and fc2, in stage 1 too, saves it for its weight
# gradient
STAGES_OF_A_SAVED_OUTPUT = [["conv", "relu", "flatten"], ["fc1", "tanh", "fc2"], ["tanh_1", "fc3", "tanh_2"],
                            ["add", "head"]]


def _check(tmp_path: Path, dumps: list[dict], microbatches: int) -> None:
    model, _ = reference(reference_batches(tmp_path / "data", 8, 0, 0), MINIBATCHES, "sgd", 0.1, 0.9, 5e-4,
                         factory=tiny_model, microbatches=microbatches)
    ref = {n: p.detach() for n, p in model.named_parameters()}
    got: dict[str, torch.Tensor] = {}
    for d in dumps:
        for n, p in d["params"].items():
            torch.testing.assert_close(got.setdefault(n, p), p)  # replicas agree
    assert sorted(got) == sorted(ref)
    for n, p in ref.items():
        torch.testing.assert_close(got[n], p, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", TORCH_SCHEDULES)
def test_each_torch_schedule_equals_one_process(tmp_path: Path, schedule: str) -> None:
    """2 ranks, 4 microbatches of 2 samples: 2 stages, or 4 (2 chunks a rank) for the looped and V schedules."""
    dumps = run(tmp_path, 2, fn=torch_train, runtime="torch", schedule=schedule, microbatches=4,
                max_minibatches=MINIBATCHES, momentum=0.9, weight_decay=5e-4)
    assert len({n for d in dumps for n in d["params"]}) == 8  # 4 linear or conv layers, weight and bias
    assert [d["stages"] for d in dumps] == ([[0], [1]] if schedule in ("gpipe", "pipedream_flush") else
                                            [[0, 3], [1, 2]] if schedule in ("zbv", "dualpipev") else [[0, 2], [1, 3]])
    _check(tmp_path, dumps, 4)


@pytest.mark.slow
def test_two_pipelines_average_their_gradients_and_validate_every_sample(tmp_path: Path) -> None:
    """4 ranks as 2 pipelines of 2 stages (Schedule1F1B): each pipeline trains half of every minibatch in 2
    microbatches, the replicas average their gradients, and validation covers the 32 samples once (loss and accuracy
    as one process computes them with the final weights)."""
    plan = straight_plan("tiny", 8, [4, 4], replicas=[2, 2])  # stage 0 on ranks 0 and 1, stage 1 on 2 and 3
    assert layout(plan, "pipedream_flush").pipelines == [[0, 2], [1, 3]]
    dumps = run(tmp_path, 4, plan=plan, fn=torch_train, runtime="torch", schedule="pipedream_flush", microbatches=2,
                max_minibatches=MINIBATCHES, momentum=0.9, weight_decay=5e-4)
    _check(tmp_path, dumps, 4)
    model, _ = reference(reference_batches(tmp_path / "data", 8, 0, 0), MINIBATCHES, "sgd", 0.1, 0.9, 5e-4,
                         factory=tiny_model, microbatches=4)
    from pipedream.data import fashion_mnist as fm

    _, val = fm.datasets(tmp_path / "data", None, None, 0)
    x, y = val.batch(torch.arange(len(val)))
    with torch.no_grad():
        out = model(x)
    (row,) = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert row["val_loss"] == pytest.approx(float(torch.nn.functional.cross_entropy(out, y)), rel=1e-5)
    assert row["val_accuracy"] == pytest.approx(float((out.argmax(1) == y).float().mean()))
    assert row["train_samples"] == 8 * MINIBATCHES and row["iteration_s"] > 0


def test_layout_refuses_what_torch_cannot_run() -> None:
    with pytest.raises(PipeDreamError, match="unevenly"):
        layout(straight_plan("t", 8, [4, 4], replicas=[2, 1]), "gpipe")
    with pytest.raises(PipeDreamError, match="puts it on position"):  # loop placement on V-placed ranks
        layout(place(straight_plan("t", 8, [2, 2, 2, 2]), "zbv", 2), "interleaved_1f1b")
    with pytest.raises(PipeDreamError, match="increasing order"):
        plan = straight_plan("t", 8, [4, 4])
        plan.stages[0].ranks, plan.stages[1].ranks = [1], [0]
        layout(plan, "gpipe")
    v = layout(place(straight_plan("t", 8, [2, 2, 2, 2]), "dualpipev", 2), "ScheduleDualPipeV")
    assert (v.position, v.stages_of(0), v.stages_of(1), v.torch_class) == ([0, 1, 1, 0], [0, 3], [1, 2],
                                                                             "ScheduleDualPipeV")


@pytest.mark.slow
def test_tied_weights_on_two_ranks_take_the_one_weights_step(tmp_path: Path) -> None:
    """Interleaved 1F1B on 2 ranks with layer 3's weight tied to layer 5's: stage 1 (rank 1) and stage 2 (rank 0)
    hold a copy each; summing their gradients before every step keeps both where one process puts the weight."""
    plan = place(straight_plan("t", 8, [2, 2, 2, 2]), "interleaved_1f1b", 2)
    dumps = run(tmp_path, 2, factory=tied_model, plan=plan, fn=torch_train, runtime="torch",
                schedule="interleaved_1f1b", microbatches=4, max_minibatches=MINIBATCHES, momentum=0.9,
                weight_decay=5e-4)
    model, _ = reference(reference_batches(tmp_path / "data", 8, 0, 0), MINIBATCHES, "sgd", 0.1, 0.9, 5e-4,
                         factory=tied_model, microbatches=4)
    ref = dict(model.named_parameters(remove_duplicate=False))
    held = {n: p for d in dumps for n, p in d["params"].items()}
    assert {"3.weight", "5.weight"} <= held.keys() and sorted(held) == sorted(ref)
    for n, p in held.items():
        torch.testing.assert_close(p, ref[n].detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["zbv", "interleaved_zb"])
def test_split_backward_of_a_stage_whose_output_it_saved(tmp_path: Path, schedule: str) -> None:
    """The skip value of :class:`tests.tiny.SkipNet` leaves stage 1 for stage 3 and feeds stage 1's fc2, which saves
    it for its weight gradient: torch's I detaches a stage's outputs in place, so without the copy of
    :class:`pipedream.runtime.torch_worker.FreshOutputs` the W after it fails."""
    plan = place(op_plan(SkipNet(), STAGES_OF_A_SAVED_OUTPUT), schedule, 2)
    dumps = run(tmp_path, 2, factory=SkipNet, plan=plan, fn=torch_train, runtime="torch", schedule=schedule,
                microbatches=4, max_minibatches=MINIBATCHES, momentum=0.9, weight_decay=5e-4)
    model, _ = reference(reference_batches(tmp_path / "data", 8, 0, 0), MINIBATCHES, "sgd", 0.1, 0.9, 5e-4,
                         factory=SkipNet, microbatches=4)
    held = {n: p for d in dumps for n, p in d["params"].items()}
    assert sorted(held) == sorted(n for n, _ in model.named_parameters())
    for n, p in model.named_parameters():
        torch.testing.assert_close(held[n], p.detach(), rtol=1e-5, atol=1e-6)
