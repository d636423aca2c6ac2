"""Copies of the weights each schedule holds, counted by storage (PipeDream §3.3, PipeDream-2BW §3.1).

A flush schedule (GPipe) holds one copy of a stage's weights, 2BW two, and weight stashing one per
version an in-flight minibatch still needs, the newest being the live parameters themselves: copy on
write at the optimizer step. The counts come from the distinct ``untyped_storage().data_ptr()`` of the
parameter tensors alive after every action (master, stored versions, in-flight forwards' weights).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from pipedream.runtime.stage import straight_plan
from pipedream.runtime.versions import Policy, WeightVersions
from tests.test_runtime_pipeline import run
from tests.tiny import linear_model


def _storages(v: WeightVersions, *held: dict[str, torch.Tensor]) -> int:
    tensors = [v.master[0], *(v.params_of(k)["weight"] for k in v.alive()), *(h["weight"] for h in held)]
    return len({t.untyped_storage().data_ptr() for t in tensors})


def test_stashed_version_is_copied_on_write_and_its_backward_sees_the_old_weights() -> None:
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    w0 = layer.weight.detach().clone()
    x, y = torch.randn(4, 3), torch.randn(4, 2)
    v = WeightVersions(layer, Policy.STASH)
    params = v.acquire(v.version_for(0, None))
    assert _storages(v, params) == 1  # version 0 is the live parameters
    loss = F.mse_loss(torch.func.functional_call(layer, params, (x,)), y)
    opt = torch.optim.SGD(v.master, lr=0.5)
    layer.weight.grad = torch.ones_like(layer.weight)
    layer.bias.grad = torch.ones_like(layer.bias)
    with v.stepping(), torch.no_grad():
        opt.step()  # the in-flight forward still needs version 0: it keeps the old storage
    assert _storages(v, params) == 2
    torch.testing.assert_close(params["weight"].detach(), w0)
    torch.testing.assert_close(layer.weight.detach(), w0 - 0.5)
    (g,) = torch.autograd.grad(loss, [params["weight"]])  # no "modified by an inplace operation" error
    w = w0.clone().requires_grad_(True)
    (ref,) = torch.autograd.grad(F.mse_loss(F.linear(x, w, layer.bias.detach() + 0.5), y), [w])
    torch.testing.assert_close(g, ref)
    v.release(0)
    assert v.alive() == [1] and _storages(v) == 1


def test_a_step_with_no_version_in_flight_copies_nothing() -> None:
    layer = torch.nn.Linear(3, 2)
    ptr = layer.weight.untyped_storage().data_ptr()
    v = WeightVersions(layer, Policy.FLUSH)
    for _ in range(3):
        ver = v.version_for(0, None)
        v.acquire(ver)
        v.release(ver)  # every backward done before the step, as a flush schedule does
        with v.stepping(), torch.no_grad():
            layer.weight.add_(1.0)
        assert _storages(v) == 1
    assert layer.weight.untyped_storage().data_ptr() == ptr  # updated in place, never moved: one copy throughout


@pytest.mark.slow
@pytest.mark.parametrize("kw,expected", [
    ({"schedule": "gpipe", "microbatches": 4}, [1, 1, 1, 1]),
    ({"schedule": "1f1b"}, [4, 3, 2, 1]),  # stage s stashes NOAM - s versions; the output stage none
])
def test_copies_per_stage_on_four_stages(tmp_path: Path, kw: dict, expected: list[int]) -> None:
    dumps = run(tmp_path, 4, max_minibatches=8, **kw)
    assert [max(d["copies"]) for d in dumps] == expected


@pytest.mark.slow
def test_2bw_holds_two_copies(tmp_path: Path) -> None:
    dumps = run(tmp_path, 2, factory=linear_model, schedule="2bw", microbatches=2, max_minibatches=4, epochs=2,
                plan=straight_plan("t", 3, [2, 1]))
    assert [max(d["copies"]) for d in dumps] == [2, 2]
