"""One optimizer step over a copy's parameters (pipedream.step_rates.update_step), as the host probe times it."""

from __future__ import annotations

import pytest
import torch

from pipedream.commands.profile import runtime_step, worker_step
from pipedream.errors import PipeDreamError
from pipedream.runtime.config import TrainConfig
from pipedream.step_rates import update_step


def test_an_sgd_step_updates_the_leaves_in_place_and_zeroes_their_gradients() -> None:
    """SGD at TrainConfig's defaults (lr 0.01, momentum 0.9, weight decay 5e-4), first step: the momentum buffer is
    g + 5e-4 p, so p = [1, 2], g = [0.5, -1] gives [1 - 0.01 x 0.5005, 2 + 0.01 x 0.999] = [0.994995, 2.00999];
    the gradient buffers are zero after it. Second step with g = [1, 1]: buffer 0.9 x [0.5005, -0.999] + [1, 1] +
    5e-4 p."""
    p = torch.tensor([1.0, 2.0], requires_grad=True)
    g = torch.tensor([0.5, -1.0])
    update = update_step([p], [g], "sgd")
    update()
    assert p.detach().tolist() == pytest.approx([0.994995, 2.00999])
    assert g.tolist() == [0.0, 0.0]
    g.add_(1.0)
    before = p.detach().clone()
    buf = 0.9 * torch.tensor([0.5005, -0.999]) + 1.0 + 5e-4 * before
    update()
    assert p.detach().tolist() == pytest.approx((before - 0.01 * buf).tolist())


def test_only_sgd_and_adam_are_timed_in_copies_and_every_parameter_needs_a_gradient() -> None:
    p = torch.zeros(2, requires_grad=True)
    with pytest.raises(PipeDreamError, match="muon"):
        update_step([p], [torch.zeros(2)], "muon")
    with pytest.raises(PipeDreamError, match="1 parameters but 0 gradients"):
        update_step([p], [], "adam")


def test_a_profile_copy_carries_the_optimizer_steps_it_was_asked_for_over_its_own_model() -> None:
    """`worker_step` with ("adam",): its Adam step moves the weights its training step computes with (the aliases
    share the model's storage) and zeroes the gradients that step added up; without optimizers it carries none."""
    cfg = TrainConfig(model="alexnet", preset="reduced", data="synthetic", train_subset=8, val_subset=4,
                      batch_size=4)
    step = worker_step(cfg, [0, 1, 2, 3], 1, ("adam",))
    assert set(step.updates) == {"adam"}  # type: ignore[attr-defined]
    step()
    assert any(g.abs().sum() > 0 for g in step.grads)  # type: ignore[attr-defined]
    before = [p.detach().clone() for p in step.params]  # type: ignore[attr-defined]
    step.updates["adam"]()  # type: ignore[attr-defined]
    assert all(g.abs().sum() == 0 for g in step.grads)  # type: ignore[attr-defined]
    moved = [not torch.equal(a, p) for a, p in zip(before, step.params, strict=True)]  # type: ignore[attr-defined]
    assert all(moved)
    assert worker_step(cfg, [0, 1, 2, 3], 1).updates == {}  # type: ignore[attr-defined]


def test_the_runtime_step_names_its_leaves_in_the_order_of_its_gradients() -> None:
    model = torch.nn.Linear(3, 2)
    step = runtime_step(model, torch.nn.functional.mse_loss, torch.ones(4, 3), torch.zeros(4, 2))
    assert [p.shape for p in step.params] == [g.shape for g in step.grads] == [(2, 3), (2,)]  # type: ignore[attr-defined]
    assert step.params[0].data_ptr() == model.weight.data_ptr()  # type: ignore[attr-defined]
