"""A parameter read by two stages (tied weights): each stage holds a copy, their gradients are summed before
every step, and training equals one process (pipedream.runtime.shared)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from pipedream.errors import PipeDreamError
from pipedream.runtime import shared
from pipedream.runtime.stage import straight_plan
from tests.test_runtime_pipeline import reference, run
from tests.tiny import build, reference_batches, tied_model

TIED = ("3.weight", "5.weight")  # the names of the tied weight in stage 0 and stage 1


def _check_equal_to_sgd(dumps: list[dict], model: torch.nn.Module, first: dict[str, torch.Tensor]) -> None:
    ref = dict(model.named_parameters(remove_duplicate=False))
    for d in dumps:
        for n, p in d["params"].items():
            torch.testing.assert_close(p, ref[n].detach(), rtol=1e-5, atol=1e-6)
            # the tied weight's first gradient is the sum over both of its uses, in both stages
            torch.testing.assert_close(d["first_grads"][n], first[TIED[0] if n in TIED else n], rtol=1e-5, atol=1e-7)
    assert {n for d in dumps for n in d["params"]} >= set(TIED)


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [[1, 1], [2, 1]])
def test_gpipe_with_tied_weights_across_stages_equals_sgd(tmp_path: Path, replicas: list[int]) -> None:
    """Three minibatches of GPipe (SGD with momentum and weight decay) on stages [0-3] and [4-7]: every copy of
    the tied weight ends where single-process SGD puts the one weight (without the sum across the two stages
    each copy would follow only its own stage's gradient and this fails)."""
    dumps = run(tmp_path, sum(replicas), factory=tied_model, plan=straight_plan("t", 8, [4, 4], replicas),
                schedule="gpipe", microbatches=2, max_minibatches=3, momentum=0.9, weight_decay=5e-4)
    model, first = reference(reference_batches(tmp_path / "data", 8, 0, 0), 3, momentum=0.9, wd=5e-4,
                             factory=tied_model)
    _check_equal_to_sgd(dumps, model, first)


@pytest.mark.slow
def test_1f1b_replicated_stages_sum_the_tied_gradient_of_their_round(tmp_path: Path) -> None:
    """1F1B-RR on a 2-2 plan: each replica's first step covers minibatches 0 and 1 at the initial weights, so
    its gradient of the tied weight is the mean over those two minibatches of the sum over both uses."""
    dumps = run(tmp_path, 4, factory=tied_model, plan=straight_plan("t", 8, [4, 4], [2, 2]), max_minibatches=2)
    model = build(tied_model)
    x, y = (torch.cat(t) for t in zip(*reference_batches(tmp_path / "data", 8, 0, 0)[:2], strict=True))
    F.cross_entropy(model(x), y).backward()  # the mean over 16 samples: the mean of the two minibatches' means
    for d in dumps:
        name = TIED[d["stage"]]
        torch.testing.assert_close(d["first_grads"][name], model[3].weight.grad, rtol=1e-5, atol=1e-7)
    finals = [d["params"][TIED[d["stage"]]] for d in dumps]
    assert all(torch.equal(f, finals[0]) for f in finals)  # every copy took the same steps


def test_1f1b_needs_equal_replicas_on_the_stages_sharing_a_parameter() -> None:
    held = [shared.Shared((0, 1), TIED)]
    shared.check(held, [2, 2], "1f1b", 0.0)
    shared.check(held, [2, 1], "gpipe", 0.0)
    with pytest.raises(PipeDreamError, match="replicated \\[2, 1\\] times: under 1F1B"):
        shared.check(held, [2, 1], "1f1b", 0.0)
    with pytest.raises(PipeDreamError, match="--clip-norm"):
        shared.check(held, [1, 1], "gpipe", 1.0)


@pytest.mark.slow
def test_1f1b_weight_stashing_with_a_tied_weight_equals_a_one_process_replay(tmp_path: Path) -> None:
    """Six minibatches of 1F1B on 2 stages (stashing: stage 0 runs minibatch m on version max(m - 1, 0), stage
    1 on version m). Each stage reads the tied weight at its own version, the two uses' gradients are summed
    and the sum is applied to the newest weights of both copies: the replay below, in one process."""
    from tests.test_runtime_pipeline import STASH_VERSIONS

    lr = 0.1
    dumps = run(tmp_path, 2, factory=tied_model, plan=straight_plan("t", 8, [4, 4]), max_minibatches=6, lr=lr)
    model = build(tied_model)
    history = [{n: p.detach().clone() for n, p in model.named_parameters()}]  # "3.weight" is the tied one
    stage_of = {"1.weight": 0, "1.bias": 0, "3.weight": 0, "3.bias": 0, "5.bias": 1, "7.weight": 1, "7.bias": 1}
    for m, (x, y) in enumerate(reference_batches(tmp_path / "data", 8, 0, 0)[:6]):
        w = {n: history[STASH_VERSIONS[s][m]][n].clone().requires_grad_() for n, s in stage_of.items()}
        tied_late = history[STASH_VERSIONS[1][m]]["3.weight"].clone().requires_grad_()  # stage 1's copy
        h = torch.tanh(F.linear(torch.tanh(F.linear(x.flatten(1), w["1.weight"], w["1.bias"])), w["3.weight"], w["3.bias"]))
        h = torch.tanh(F.linear(h, tied_late, w["5.bias"]))
        loss = F.cross_entropy(F.linear(h, w["7.weight"], w["7.bias"]), y)
        grads = dict(zip([*w, "tied_late"], torch.autograd.grad(loss, [*w.values(), tied_late]), strict=True))
        grads["3.weight"] = grads["3.weight"] + grads.pop("tied_late")
        history.append({n: history[-1][n] - lr * grads[n] for n in history[-1]})
    for d in dumps:
        for n, p in d["params"].items():
            torch.testing.assert_close(p, history[-1]["3.weight" if n in TIED else n], rtol=1e-5, atol=1e-6)
