"""The prediction check of the report: every run's measured against predicted epoch time, from made-up run.json
files, with the ratios and the summary computed by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from pipedream.table1.html import html_report
from pipedream.table1.prediction import COLUMNS, prediction_rows, summary, write_prediction_check

RUNS = {  # model, mode -> (measured mean epoch s, predicted s or None, config)
    ("vgg16", "pipedream"): (11.0, 10.0, "3-1"),   # ratio 1.1: within 15%
    ("vgg16", "dp"): (30.0, 20.0, "4"),            # ratio 1.5: outside
    ("alexnet", "pipedream"): (9.5, 10.0, "2-2"),  # ratio 0.95: within
    ("alexnet", "dp"): (8.0, None, "4"),           # no prediction: kept, NaN
}


def _results(tmp_path: Path) -> Path:
    for (model, mode), (measured, predicted, config) in RUNS.items():
        run = {"run_id": f"{model}-{mode}", "mode": mode, "config": config, "mean_epoch_time_s": measured}
        if predicted is None:
            run["prediction_error"] = "unknown cluster 'x'"
        else:
            run.update(predicted_epoch_time_s=predicted, prediction_ratio=measured / predicted)
        d = tmp_path / "runs" / model / mode
        d.mkdir(parents=True)
        (d / "run.json").write_text(json.dumps(run))
    return tmp_path


def test_rows_and_summary_by_hand(tmp_path: Path) -> None:
    df = prediction_rows(_results(tmp_path), ["vgg16", "alexnet", "resnet50"])  # resnet50 has no runs
    assert list(df.columns) == COLUMNS
    assert list(zip(df["model"], df["mode"], strict=True)) == [("vgg16", "pipedream"), ("vgg16", "dp"),
                                                                ("alexnet", "pipedream"), ("alexnet", "dp")]
    assert df["ratio"].iloc[:3].tolist() == pytest.approx([1.1, 1.5, 0.95])
    assert math.isnan(df["ratio"].iloc[3]) and math.isnan(df["predicted_epoch_s"].iloc[3])
    s = summary(df)
    # |ratio - 1| = 0.1, 0.5, 0.05: median 0.1, 2 of 3 within 25%, worst 0.5
    assert s == {"runs": 3, "within": 2, "median_abs_error": pytest.approx(0.1), "worst_abs_error": pytest.approx(0.5)}


def test_csv_plot_and_report_section(tmp_path: Path) -> None:
    results = _results(tmp_path)
    df = write_prediction_check(results, ["vgg16", "alexnet"])
    back = pd.read_csv(results / "prediction_check.csv")
    assert list(back.columns) == COLUMNS and len(back) == 4
    assert back["measured_epoch_s"].tolist() == [11.0, 30.0, 9.5, 8.0]
    png = results / "plots" / "prediction_check.png"
    assert png.is_file() and png.stat().st_size > 1000
    table = pd.DataFrame(columns=["task", "model", "hardware", "paper_config", "paper_speedup_epoch_time",
                                  "paper_speedup_tta"])
    page = html_report(table, [], results, prediction_check=df)
    assert "id='prediction-check'" in page
    assert "2 of 3 runs within ±25% of their prediction; median |ratio − 1| 10.0% (goal: at most 10%)" in page
    assert "differs from itself by a median of about 12%" in page  # the noise floors beside the result
    assert "profiled again minutes later predict it differently by a median of about 18%" in page
    assert page.count("fig-prediction_check") == 1  # in its own section, not again among the other plots
    assert "id='prediction-check'" not in html_report(table, [], results)


def test_memory_check_rows_by_hand(tmp_path: Path) -> None:
    from pipedream.table1.memory_check import COLUMNS as MEM_COLUMNS
    from pipedream.table1.memory_check import write_memory_check

    d = tmp_path / "runs" / "vgg16" / "pipedream"
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"predicted_memory_bytes_stage0": 1000.0, "measured_memory_bytes_stage0": 1100.0,
                                            "predicted_memory_bytes_stage1": 400.0, "measured_memory_bytes_stage1": 300.0}))
    d = tmp_path / "runs" / "vgg16" / "dp"  # DDP counts no memory: predicted only, no row
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"predicted_memory_bytes_stage0": 5000.0}))
    df = write_memory_check(tmp_path, ["vgg16"])
    assert list(df.columns) == MEM_COLUMNS
    assert df.values.tolist() == [["vgg16", "pipedream", 0, 1100.0, 1000.0, pytest.approx(1.1)],
                                  ["vgg16", "pipedream", 1, 300.0, 400.0, pytest.approx(0.75)]]
    assert pd.read_csv(tmp_path / "memory_check.csv").shape == (2, 6)


def test_compute_check_rows_by_hand(tmp_path: Path) -> None:
    from pipedream.table1.prediction import COMPUTE_COLUMNS, compute_rows

    d = tmp_path / "runs" / "gnmt8" / "pipedream"
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"measured_compute_s_stage0": 3.0, "predicted_compute_s_stage0": 2.0,
                                            "wait_s_stage0": 0.5, "measured_compute_s_stage1": 1.0,
                                            "predicted_compute_s_stage1": 1.25, "wait_s_stage1": 2.0,
                                            "predicted_wait_s_stage0": 0.25}))
    df = compute_rows(tmp_path, ["gnmt8"])
    assert list(df.columns) == COMPUTE_COLUMNS
    assert df.iloc[0].tolist() == ["gnmt8", "pipedream", 0, 3.0, 2.0, 1.5, 0.5, 0.25]
    assert df.iloc[1].tolist()[:7] == ["gnmt8", "pipedream", 1, 1.0, 1.25, 0.8, 2.0]
    assert math.isnan(df.iloc[1]["predicted_wait_s"])  # a run without the predicted wait


def test_the_check_compares_the_epochs_after_the_first(tmp_path: Path) -> None:
    """A run logs its warmed-up epochs' mean (``steady_epoch_time_s``) and its first epoch apart: the check takes
    the former (epochs 7, 5, 5 s: 5 s against a 4 s prediction, ratio 1.25; first epoch 7 s); a run of one epoch,
    or one logged before, has only its mean."""
    from pipedream.commands.train import steady_epochs

    epochs = [{"epoch_time_s": 7.0}, {"epoch_time_s": 5.0}, {"epoch_time_s": 5.0}]
    assert steady_epochs(epochs) == epochs[1:] and steady_epochs(epochs[:1]) == epochs[:1]
    d = tmp_path / "runs" / "gnmt8" / "pipedream"
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"mean_epoch_time_s": 17 / 3, "steady_epoch_time_s": 5.0,
                                            "first_epoch_time_s": 7.0, "predicted_epoch_time_s": 4.0}))
    d = tmp_path / "runs" / "gnmt8" / "dp"
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"mean_epoch_time_s": 6.0, "predicted_epoch_time_s": 5.0}))
    df = prediction_rows(tmp_path, ["gnmt8"])
    assert df[["measured_epoch_s", "ratio", "first_epoch_s"]].iloc[0].tolist() == pytest.approx([5.0, 1.25, 7.0])
    assert df[["measured_epoch_s", "ratio"]].iloc[1].tolist() == pytest.approx([6.0, 1.2])
    assert math.isnan(df["first_epoch_s"].iloc[1])


def test_the_check_shows_how_old_each_runs_profile_was(tmp_path: Path) -> None:
    """``profile_age_s``: from the profile's end (``meta.json`` ``profiled_at_unix_s``) to the run's launch, logged
    in ``run.json`` and shown beside the ratio; a profile that does not say its time (the release's) gives none."""
    from pipedream.commands.train import profile_age_s

    prof = tmp_path / "profiles" / "vgg16"
    prof.mkdir(parents=True)
    (prof / "meta.json").write_text(json.dumps({"minibatch_size": 32, "profiled_at_unix_s": 1000.0}))
    assert profile_age_s(prof / "graph.txt", 1150.5) == pytest.approx(150.5)
    (prof / "meta.json").write_text(json.dumps({"minibatch_size": 32}))
    assert profile_age_s(prof / "graph.txt", 1150.5) is None
    assert profile_age_s(None, 1150.5) is None
    assert profile_age_s(tmp_path / "nowhere" / "graph.txt", 1150.5) is None
    d = tmp_path / "runs" / "vgg16" / "dp"
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"steady_epoch_time_s": 5.0, "predicted_epoch_time_s": 4.0,
                                            "profile_age_s": 150.5}))
    df = prediction_rows(tmp_path, ["vgg16"])
    assert df["profile_age_s"].tolist() == [150.5]
    table = pd.DataFrame(columns=["task", "model", "hardware", "paper_config", "paper_speedup_epoch_time",
                                  "paper_speedup_tta"])
    page = html_report(table, [], tmp_path, prediction_check=df)
    assert "profile's age at launch (min)" in page
    assert "<td class='n'>2.5</td>" in page  # minutes


def test_the_ratio_panel_names_every_run_with_a_prediction(tmp_path: Path) -> None:
    """The plot's right panel: one row per run with a ratio, in the check's order, a PipeDream run named by its
    config and a DP run as DP; AlexNet's DP run (no prediction) has no row."""
    from pipedream.table1.plots import ratio_points

    results = _results(tmp_path)
    points = ratio_points(prediction_rows(results, ["vgg16", "alexnet"]))
    assert points["run"].tolist() == ["vgg16 3-1", "vgg16 DP", "alexnet 2-2"]
    assert points["mode"].tolist() == ["PipeDream", "DP", "PipeDream"]
    assert points["ratio"].tolist() == pytest.approx([1.1, 1.5, 0.95])
    assert ratio_points(prediction_rows(results, ["resnet50"])).empty  # no runs: nothing to draw
