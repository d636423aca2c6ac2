"""Every Table 1 model trains through our PipeDream runtime (2 stages) and the DDP baseline (2 ranks).

Two short epochs on a small subset of the real stand-in data each; the training loss of the second
epoch must be below the first (issue #6's "loss falling" through both trainers, not only one process).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipedream.baselines.ddp import train as dp_train
from pipedream.models import model_names
from pipedream.models.transformer import REDUCED_ALIASES
from pipedream.runtime.config import TrainConfig
from pipedream.runtime.launch import spawn_local

pytestmark = pytest.mark.slow
# Adam with a fixed small budget: 2 epochs x 6 minibatches of 16 samples, the same for every model
SETTINGS = {"epochs": 2, "batch_size": 16, "optimizer": "adam", "lr": 2e-3, "weight_decay": 0.0,
            "train_subset": 96, "val_subset": 32, "max_minibatches": 6, "progress": False, "comm_timeout_s": 60}


@pytest.mark.parametrize("mode", ["pipedream", "dp"])
@pytest.mark.parametrize("model", [m for m in model_names() if m not in REDUCED_ALIASES])  # each reduced model once
def test_loss_falls(model: str, mode: str, tmp_path: Path) -> None:
    cfg = TrainConfig(model=model, out_dir=str(tmp_path), **SETTINGS)
    spawn_local(cfg, 2, fn=dp_train if mode == "dp" else None, timeout_s=240)
    epochs = json.loads((tmp_path / "metrics.json").read_text())
    assert len(epochs) == 2
    assert epochs[1]["train_loss"] < epochs[0]["train_loss"], epochs
