"""torch.distributed.pipelining runs our plans (``--runtime torch``): each of torch's seven schedules trains like one
process doing the same minibatches (all seven are synchronous: one weight version, a flush per minibatch).

The workers (:mod:`pipedream.runtime.torch_worker`) cut :func:`tests.tiny.tiny_model` into the plan's stages, run
torch's schedule class on gloo and take SGD steps with momentum and weight decay; the final weights must be those of
plain SGD on the whole minibatches in one process (:func:`tests.test_runtime_pipeline.reference`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipedream.errors import PipeDreamError
from pipedream.runtime.config import TORCH_SCHEDULES, TrainConfig
from pipedream.runtime.stage import straight_plan
from pipedream.runtime.torch_layout import layout, place
from pipedream.runtime.torch_worker import train as torch_train
from pipedream.torch_schedules import TORCH_CLASSES
from tests.test_runtime_pipeline import reference, run
from tests.tiny import reference_batches, tiny_model

MINIBATCHES = 3


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


def test_the_config_names_torchs_seven() -> None:
    assert TORCH_SCHEDULES == tuple(TORCH_CLASSES)


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
