"""A DAG cut by torch.fx: a skip connection crossing stage boundaries trains exactly like one process.

:class:`tests.tiny.SkipNet` is cut into four stages at op granularity; the skip value leaves stage 0
and rides through stages 1 and 2 to the add in stage 3 (gradients flow back the same way). GPipe and
2BW with one minibatch must give the weights and gradients of plain SGD on the whole model.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.test_runtime import SKIP_STAGES
from tests.test_runtime_pipeline import reference, run
from tests.tiny import SkipNet, op_plan, reference_batches

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("schedule,microbatches,minibatches", [("gpipe", 2, 3), ("2bw", 4, 1)])
def test_skip_connection_across_stages_equals_sgd(tmp_path: Path, schedule: str, microbatches: int,
                                                  minibatches: int) -> None:
    dumps = run(tmp_path, 4, factory=SkipNet, plan=op_plan(SkipNet(), SKIP_STAGES), schedule=schedule,
                microbatches=microbatches, max_minibatches=minibatches)
    model, first = reference(reference_batches(tmp_path / "data", 8, 0, 0), minibatches, factory=SkipNet)
    ref = dict(model.named_parameters())
    assert sorted(n for d in dumps for n in d["params"]) == sorted(ref)  # every parameter in exactly one stage
    for d in dumps:
        for n, p in d["params"].items():
            torch.testing.assert_close(p, ref[n].detach(), rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(d["first_grads"][n], first[n], rtol=1e-5, atol=1e-7)
