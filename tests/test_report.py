"""Table 1 report: speedups and time-to-accuracy computed by hand from synthetic runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pipedream.plan import Plan, Stage
from pipedream.report import time_to_accuracy, write_report
from tests.conftest import REPO


def _epochs(times: list[float], accs: list[float]) -> list[dict[str, float]]:
    wall = 0.0
    out = []
    for i, (t, a) in enumerate(zip(times, accs, strict=True), start=1):
        wall += t
        out.append({"epoch": i, "epoch_time_s": t, "wall_time_s": wall, "val_accuracy": a, "train_loss": 1.0})
    return out


def test_time_to_accuracy() -> None:
    e = _epochs([10, 10, 10], [0.5, 0.7, 0.8])
    assert time_to_accuracy(e, 0.7) == 20
    assert math.isnan(time_to_accuracy(e, 0.9))


def test_report_from_runs(tmp_path: Path) -> None:
    res = tmp_path / "results"
    for mode, times, accs in [("pipedream", [4, 4], [0.6, 0.8]), ("dp", [10, 6], [0.7, 0.8])]:
        (res / "runs" / "vgg16" / mode).mkdir(parents=True)
        (res / "runs" / "vgg16" / mode / "metrics.json").write_text(json.dumps(_epochs(times, accs)))
    stages = [Stage(nodes=["node0", "node1"], replicas=3, ranks=[0, 1, 2]), Stage(nodes=["node2"], ranks=[3])]
    Plan("vgg16", "cpu4", 4, stages, 32, 1.0, 2.0).save(res / "plans" / "vgg16" / "cpu4.json")
    cfg = {
        "results_dir": str(res), "cluster": "cpu4", "workers": 4,
        "paper_table": str(REPO / "experiments" / "paper_table1.csv"),
        "models": {"vgg16": {"preset": "reduced", "paper_rows": [{"cluster": "A", "servers": 4}],
                             "train": {"epochs": 2, "batch_size": 32, "lr": 0.01, "threshold": 0.8}}},
    }
    df = write_report(cfg)
    assert len(df) == 1
    row = df.iloc[0]
    assert row["paper_config"] == "15-1" and row["paper_speedup_epoch_time"] == 5.28
    assert row["measured_config"] == "3-1"
    assert row["measured_speedup_epoch_time"] == pytest.approx(8 / 4)  # mean(10, 6) / mean(4, 4)
    assert row["measured_speedup_tta"] == pytest.approx(16 / 8)        # both reach 0.8 in epoch 2
    assert (res / "table1.md").read_text().startswith("# Table 1")
    assert (res / "plots" / "vgg16_accuracy_vs_time.png").stat().st_size > 1000
