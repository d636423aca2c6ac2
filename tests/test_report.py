"""Table 1 report: speedups and time-to-accuracy computed by hand from synthetic runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pipedream.planner.plan import Plan, Stage
from pipedream.table1.measured import epochs_to_accuracy, time_to_accuracy, write_speedup
from pipedream.table1.table import write_report
from tests.conftest import REPO


def _epochs(times: list[float], accs: list[float]) -> list[dict[str, float]]:
    wall = 0.0
    out = []
    for i, (t, a) in enumerate(zip(times, accs, strict=True), start=1):
        wall += t
        out.append({"epoch": i, "epoch_time_s": t, "wall_time_s": wall, "val_accuracy": a, "train_loss": 1.0,
                    "val_loss": 10.0})
    return out


def test_time_to_accuracy() -> None:
    e = _epochs([10, 10, 10], [0.5, 0.7, 0.8])
    assert time_to_accuracy(e, 0.7) == 20
    assert math.isnan(time_to_accuracy(e, 0.9))
    assert epochs_to_accuracy(e, 0.75) == 3
    assert time_to_accuracy(e, 70.0, "top1") == 20
    e[1]["val_loss"] = math.log(90.0)
    assert epochs_to_accuracy(e, 98.0, "perplexity") == 2
    assert math.isnan(epochs_to_accuracy(e, 0.9))


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
        "models": {"vgg16": {"preset": "reduced",
                             "threshold": {"metric": "top1", "value": 80.0},
                             "train": {"epochs": 2, "batch_size": 32, "lr": 0.01}}},
    }
    (res / "table1_predicted.csv").write_text(
        "model,hardware,predicted_config,predicted_speedup,rel_error\nvgg16,A 4x4,15-1,4.0,-0.24\n")
    speedup = write_speedup("vgg16", cfg, res / "speedup" / "vgg16.json")
    assert speedup["measured_speedup_epoch_time"] == pytest.approx(8 / 4)  # mean(10, 6) / mean(4, 4)
    assert speedup["measured_speedup_tta"] == pytest.approx(16 / 8)        # both reach 0.8 in epoch 2
    assert speedup["measured_epochs_to_accuracy_dp"] == 2
    df = write_report(cfg)
    assert len(df) == 14  # every row of the paper's Table 1
    vgg = df[df["model"] == "vgg16"].set_index("hardware")
    assert list(vgg.index) == ["A 4x4", "B 2x8"]
    assert vgg.loc["A 4x4", "paper_config"] == "15-1" and vgg.loc["A 4x4", "paper_speedup_epoch_time"] == 5.28
    assert vgg.loc["A 4x4", "predicted_speedup_epoch_time"] == 4.0
    assert math.isnan(vgg.loc["B 2x8", "predicted_speedup_epoch_time"])
    assert (vgg["measured_config"] == "3-1").all()
    assert list(vgg["measured_speedup_epoch_time"]) == pytest.approx([2.0, 2.0])
    assert df[df["model"] == "gnmt8"]["measured_config"].isna().all()
    assert (res / "table1.md").read_text().startswith("# Table 1")
    html = (res / "report.html").read_text()
    assert "vgg16_accuracy_vs_time.png" in html and "table1_speedups.png" in html
    for png in ("vgg16_accuracy_vs_time.png", "table1_speedups.png"):
        assert (res / "plots" / png).stat().st_size > 1000
