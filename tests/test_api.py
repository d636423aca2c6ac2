"""pipedream as a library (pipedream.api): profile, plan and train a bare module with dict inputs and a tied
weight, no ModelSpec; the pipeline equals one process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import pipedream
from pipedream.data.fashion_mnist import minibatch_indices


class TwoInputs(nn.Module):
    """``{"image": (B, 12), "bias": (B, 4)}`` -> 3 logits; ``inp``'s weight is read again, transposed, before the
    head (a tie between a layer and the glue after the body)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 12, bias=False)
        self.body = nn.Sequential(nn.Linear(12, 12), nn.Tanh(), nn.Linear(12, 12), nn.Tanh())
        self.head = nn.Linear(4, 3)

    def forward(self, image: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        h = self.body(image + self.inp(bias))
        return self.head(F.linear(h, self.inp.weight.t()))  # the input projection, transposed, read again


def samples(n: int, seed: int) -> list[tuple[dict[str, torch.Tensor], torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    x, b = torch.randn(n, 12, generator=g), torch.randn(n, 4, generator=g)
    y = (x[:, 0] > b[:, 0]).long() + (x[:, 1] > 0).long()
    return [({"image": x[i], "bias": b[i]}, y[i]) for i in range(n)]


def _model() -> TwoInputs:
    torch.manual_seed(0)
    return TwoInputs()


@pytest.mark.slow
def test_profile_plan_train_from_python_equals_one_process(tmp_path: Path) -> None:
    train, val = samples(96, 1), samples(32, 2)
    model = _model()
    x = {"image": torch.stack([s[0]["image"] for s in train[:8]]), "bias": torch.stack([s[0]["bias"] for s in train[:8]])}
    y = torch.stack([s[1] for s in train[:8]])
    graph = pipedream.profile(model, x, target=y, warmup=0, iters=1)
    assert graph.minibatch_size == 8 and len(graph.nodes) > 4
    plan = pipedream.partition(graph, "2:1e9", straight=True)
    assert len(plan.stages) == 2
    config = pipedream.TrainConfig(epochs=1, batch_size=8, lr=0.1, momentum=0.9, schedule="gpipe", microbatches=2,
                                   train_subset=64, out_dir=str(tmp_path / "out"), progress=False, debug_dump=True,
                                   comm_timeout_s=60)
    rows = pipedream.train(model, plan, (train, val), config)
    assert len(rows) == 1 and rows[0]["train_samples"] == 64  # the harness drew 64 of the 96 samples
    dumps = [torch.load(tmp_path / "out/debug" / f"rank{r}.pt", weights_only=False) for r in range(2)]
    # one process on the same 64 samples in the same order
    from pipedream.data.base import as_sample_set, limit

    data = limit(as_sample_set(train), 64, 0)
    ref = _model()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    for rows_ in minibatch_indices(len(data), 8, 0, 0):
        xb, yb = data.batch(rows_)
        opt.zero_grad()
        F.cross_entropy(ref(**xb), yb).backward()
        opt.step()
    expected = dict(ref.named_parameters())
    assert {n for d in dumps for n in d["params"]} == set(expected)
    for d in dumps:
        for n, p in d["params"].items():
            torch.testing.assert_close(p, expected[n].detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_the_readme_example_runs(tmp_path: Path) -> None:
    """README's api_example.py as a user runs it: a torchvision ResNet-18 profiled, partitioned and trained."""
    import os
    import re
    import subprocess
    import sys

    from tests.conftest import REPO

    code = re.search(r"```python\n# api_example\.py\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    assert code is not None
    (tmp_path / "api_example.py").write_text(code.group(1))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "api_example.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    epoch, loss, accuracy = proc.stdout.split()[-3:]
    assert epoch == "1" and float(loss) > 0 and 0 <= float(accuracy) <= 1
    assert (tmp_path / "runs/resnet18/metrics.json").is_file()
