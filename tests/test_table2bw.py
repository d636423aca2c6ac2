"""PipeDream-2BW's table (pipedream/table2bw): measured rows from run folders, predicted rows at paper scale,
the files it writes, and the workflow that builds it (dry run)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import yaml

from pipedream.table2bw import table
from tests.conftest import REPO
from tests.test_workflow import _dry_run, _job_counts


def _fake_run(folder: Path, samples_per_epoch: int, epoch_s: float, val_losses: list[float], peak: float) -> None:
    folder.mkdir(parents=True)
    epochs = [{"epoch": k + 1, "epoch_time_s": epoch_s, "train_samples": samples_per_epoch, "val_loss": v,
               "train_loss": v + 0.1, "wall_time_s": (k + 1) * epoch_s} for k, v in enumerate(val_losses)]
    (folder / "metrics.json").write_text(json.dumps(epochs))
    (folder / "run.json").write_text(json.dumps({"config": "straight", "prediction_ratio": 1.25,
                                                 "measured_memory_bytes_stage0": peak,
                                                 "measured_memory_bytes_stage1": peak / 2,
                                                 "predicted_memory_bytes_stage0": peak}))


def test_measured_rows_and_files(tmp_path: Path) -> None:
    runs = tmp_path / "runs_2bw" / "gpt"
    _fake_run(runs / "2bw", 1000, 5.0, [5.0, 4.5], 2e6)
    _fake_run(runs / "dp", 1000, 10.0, [5.0, 4.4], 3e6)
    rows, curve = table.measured_rows(runs, "gpt", 32, 4, 4, 4)
    two, dp = rows
    assert (two["schedule"], dp["schedule"]) == ("2bw", "dp")
    assert two["samples_per_s"] == 200 and dp["samples_per_s"] == 100 and dp["twobw_speedup"] == 2
    assert two["predicted_samples_per_s"] == 250  # measured x (measured / predicted epoch time)
    assert two["peak_memory_bytes_max_stage"] == 2e6 and two["weight_copies"] == 2 and dp["weight_copies"] == 1
    assert two["config"] == "w=1 d=4 b=8" and dp["config"] == "dp x4, 8 each"
    assert math.isclose(two["final_val_perplexity"], math.exp(4.5))
    assert [(r["schedule"], r["epoch"]) for r in curve] == [("2bw", 1), ("2bw", 2), ("dp", 1), ("dp", 2)]
    written = table.write(tmp_path, rows, curve)
    assert all(p.is_file() for p in written) and (tmp_path / "plots" / "2bw_val_loss.png") in written
    header = (tmp_path / "table_2bw.csv").read_text().splitlines()[0].split(",")
    assert header[:6] == ["scope", "model", "batch_size", "schedule", "config", "samples_per_s"]
    assert {"peak_memory_bytes_max_stage", "weight_copies", "paper_depth"} <= set(header)
    assert "19.28" in (tmp_path / "table_2bw.md").read_text()


def test_loss_check_rows_compare_2bw_with_dp_per_optimizer(tmp_path: Path) -> None:
    """The loss check's runs (<schedule>-<optimizer>) become rows of their own optimizer; 2BW's final validation
    loss is compared with DP's of the same optimizer: 4.5 / 4.4 - 1 = +2.27% (outside 2%), 4.45 / 4.40 - 1 = +1.14%."""
    runs = tmp_path / "runs_2bw" / "gpt"
    _fake_run(runs / "2bw", 1000, 5.0, [5.0, 4.5], 2e6)
    _fake_run(runs / "dp", 1000, 10.0, [5.0, 4.4], 3e6)
    _fake_run(runs / "2bw-muon", 1000, 4.0, [4.9, 4.45], 2e6)
    _fake_run(runs / "dp-muon", 1000, 8.0, [4.9, 4.40], 3e6)
    rows, curve = table.measured_rows(runs, "gpt", 32, 4, 4, 4, "adam", "muon")
    got = {(r["schedule"], r["optimizer"]): r for r in rows}
    assert list(got) == [("2bw", "adam"), ("dp", "adam"), ("2bw", "muon"), ("dp", "muon")]
    assert math.isclose(got["2bw", "adam"]["val_loss_vs_dp"], 4.5 / 4.4 - 1)
    assert math.isclose(got["2bw", "muon"]["val_loss_vs_dp"], 4.45 / 4.40 - 1)
    assert got["dp", "muon"]["val_loss_vs_dp"] == 0 and got["dp", "muon"]["twobw_speedup"] == 2  # 250 / 125
    assert [(r["schedule"], r["optimizer"], r["epoch"]) for r in curve][-2:] == [("dp", "muon", 1), ("dp", "muon", 2)]
    lines = table.loss_lines(rows)
    assert len(lines) == 2 and "+2.3%; outside 2%" in lines[0] and "+1.1%; within 2%" in lines[1]
    table.write(tmp_path, rows, curve)
    assert "With muon" in (tmp_path / "table_2bw.md").read_text()
    assert (tmp_path / "table_2bw_val_loss.csv").read_text().splitlines()[0].startswith("schedule,optimizer,epoch")


def test_predicted_rows_at_paper_scale() -> None:
    from pipedream.topology import get_cluster

    rows = table.predicted_rows(get_cluster("B_8x8"), [512], {"GPT-2.2B": "gpt_2.2b"}, dataset_batches=4, rerank=1)
    by = {r["schedule"]: r for r in rows}
    assert {"2bw", "gpipe"} <= set(by) and all(r["scope"] == "predicted" for r in rows)
    assert by["2bw"]["weight_copies"] == 2 and by["gpipe"]["weight_copies"] == 1
    assert by["2bw"]["paper_depth"] == 8 and by["2bw"]["config"].startswith("w=")
    assert all(r["peak_memory_bytes_max_stage"] <= 16e9 for r in rows)
    assert by["2bw"]["twobw_speedup"] == 1 and by["gpipe"]["twobw_speedup"] > 1  # no flush, no bubble per batch


def test_workflow_dry_run(tmp_path: Path) -> None:
    from pipedream.runtime.config import SCHEDULES

    cfg = yaml.safe_load((REPO / "experiments" / "2bw.yaml").read_text())
    proc = _dry_run(cfg, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    counts = _job_counts(proc.stdout)
    runnable = [s for s in cfg["twobw"]["schedules"] if s == "dp" or s in SCHEDULES]
    loss = cfg["twobw"].get("loss_check", {}).get("schedules", [])
    n = len(runnable) + len([s for s in loss if s == "dp" or s in SCHEDULES])
    assert n == len(runnable) + 2  # the loss check: 2bw-muon, dp-muon
    assert counts == {"profile": 1, "plan_2bw": 1, "train_2bw": n, "table_2bw": 1, "all": 1, "total": 4 + n}


def test_check_refuses_a_bad_twobw_section() -> None:
    from pipedream.commands.check import twobw_problem

    cfg = yaml.safe_load((REPO / "experiments" / "2bw.yaml").read_text())
    assert twobw_problem(cfg) is None
    assert "is not one of models" in twobw_problem({**cfg, "twobw": {**cfg["twobw"], "model": "vgg16"}})  # type: ignore[operator]
    assert "does not divide workers" in twobw_problem({**cfg, "twobw": {**cfg["twobw"], "depth": 3}})  # type: ignore[operator]
    assert "not a multiple of microbatch" in twobw_problem({**cfg, "twobw": {**cfg["twobw"], "microbatch": 5}})  # type: ignore[operator]


def test_report_section_and_page_show_the_measured_rows_the_loss_gap_and_the_plot(tmp_path: Path) -> None:
    """report.html's 2BW section (and report_2bw.html) carry the measured rows, 2BW's loss gap to DP per optimizer
    (+2.3% for 4.5 vs 4.4) and the loss plot inlined; without table_2bw.csv there is no section."""
    from pipedream.table2bw import html

    assert html.section(tmp_path) == ""
    runs = tmp_path / "runs_2bw" / "gpt"
    _fake_run(runs / "2bw", 1000, 5.0, [5.0, 4.5], 2e6)
    _fake_run(runs / "dp", 1000, 10.0, [5.0, 4.4], 3e6)
    rows, curve = table.measured_rows(runs, "gpt", 32, 4, 4, 4, "adam")
    table.write(tmp_path, rows, curve)
    part = html.section(tmp_path)
    assert "<td class='n'>+2.3%</td>" in part and "With adam: 2BW's final validation loss 4.500 vs DP's 4.400" in part
    assert part.count("data:image/png;base64,") == 1 and "<td>2bw</td>" in part and "<td class='n'>2 MB</td>" in part
    assert html.page(tmp_path).startswith("<!doctype html>") and part in html.page(tmp_path)
