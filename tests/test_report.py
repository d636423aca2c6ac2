"""Table 1 report: speedups and time-to-accuracy computed by hand from synthetic runs; report.html."""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest

from pipedream.errors import PipeDreamError
from pipedream.plan import Plan, Stage
from pipedream.table1.measured import MODES, epochs_to_accuracy, metric_value, time_to_accuracy, write_speedup
from pipedream.table1.table import read_explanations, write_report
from pipedream.tracking import UI_URL, experiment_of_run
from tests.conftest import REPO, log_training_run


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


def test_time_to_accuracy_on_bleu_scored_per_epoch() -> None:
    """BLEU of every epoch's saved model is a key of its row (`pipedream train` adds it after training)."""
    e = _epochs([10, 10, 10], [0.9, 0.9, 0.9])
    for row, score in zip(e, [1.3, 12.4, 9.0], strict=True):
        row["bleu4"] = score
    assert time_to_accuracy(e, 9.5, "bleu4") == 20 and epochs_to_accuracy(e, 9.5, "bleu4") == 2  # the first crossing
    assert math.isnan(time_to_accuracy(e, 13.0, "bleu4"))  # never crossed: not reached
    with pytest.raises(PipeDreamError, match="epoch 1 of the run has no 'bleu' score"):
        time_to_accuracy(e, 1.0, "bleu")  # a run that did not score its epochs: no number made up


def _log_runs(res: Path, model: str, with_experiment_id: bool) -> dict[str, str]:
    """Log both modes of ``model`` to MLflow and write their run.json as ``pipedream train`` does (or as it did
    before run.json carried the experiment id); returns mode -> run id."""
    ids = {}
    for mode in MODES:
        rid = log_training_run(f"{model}/cpu4", mode, {"model": model}, [{"val_accuracy": 0.5}])
        run = {"run_id": rid, "mode": mode, **({"experiment_id": experiment_of_run(rid)} if with_experiment_id else {})}
        (res / "runs" / model / mode / "run.json").write_text(json.dumps(run))
        ids[mode] = rid
    return ids


def test_metric_value_is_in_the_thresholds_unit(tmp_path: Path) -> None:
    """What the accuracy-vs-time plot draws and the threshold is compared with, per metric."""
    e = {"epoch": 1, "val_accuracy": 0.615, "val_loss": math.log(700.0), "bleu4": 9.75}
    assert metric_value(e, "accuracy") == 0.615
    assert metric_value(e, "top1") == pytest.approx(61.5) and metric_value(e, "token_accuracy") == pytest.approx(61.5)
    assert metric_value(e, "perplexity") == pytest.approx(700.0)
    assert metric_value(e, "bleu4") == 9.75
    from pipedream.table1.plots import accuracy_vs_time

    runs = {"pipedream": [{**e, "wall_time_s": 3.0}], "dp": [{**e, "wall_time_s": 4.0}]}
    accuracy_vs_time("s2vt", runs, 4, tmp_path / "curve.png", "bleu4", 9.5)
    assert (tmp_path / "curve.png").stat().st_size > 0


def test_report_from_runs(tmp_path: Path, mlflow_store: Path) -> None:
    res = tmp_path / "results"
    models = {"vgg16": ([4, 4], [0.6, 0.8], [10, 6], [0.7, 0.8]), "gnmt8": ([5, 5], [0.3, 0.4], [6, 6], [0.3, 0.4])}
    bleu = {"pipedream": [3.0, 6.0], "dp": [2.0, 5.0]}  # gnmt8's BLEU of each epoch's model
    for model, (tp, ap, td, ad) in models.items():
        for mode, times, accs in [("pipedream", tp, ap), ("dp", td, ad)]:
            (res / "runs" / model / mode).mkdir(parents=True)
            rows = _epochs(times, accs)
            for row, score in zip(rows, bleu[mode] if model == "gnmt8" else [], strict=False):
                row["bleu"] = score
            (res / "runs" / model / mode / "metrics.json").write_text(json.dumps(rows))
        stages = [Stage(nodes=["node0", "node1"], replicas=3, ranks=[0, 1, 2]), Stage(nodes=["node2"], ranks=[3])]
        Plan(model, "cpu4", 4, stages, 32, 1.0, 2.0).save(res / "plans" / model / "cpu4.json")
    run_ids = {"vgg16": _log_runs(res, "vgg16", True), "gnmt8": _log_runs(res, "gnmt8", False)}
    cfg = {
        "results_dir": str(res), "cluster": "cpu4", "workers": 4, "emulate_bandwidth_Bps": 1.25e8,
        "paper_table": str(REPO / "experiments" / "paper_table1.csv"),
        "models": {m: {"preset": "reduced", "threshold": {"metric": "top1", "value": 80.0} if m == "vgg16" else
                       {"metric": "bleu", "value": 5.0},
                       "train": {"epochs": 2, "batch_size": 32, "lr": 0.01}} for m in models},
    }
    why = {"vgg16 A 4x4": ["planner: ours picked 15-1 <because> it's faster.", "profile: V100 (release) profile."]}
    pd.DataFrame({"row": ["vgg16 A 4x4", "vgg16 B 2x8"], "model": ["vgg16"] * 2, "hardware": ["A 4x4", "B 2x8"],
                  "predicted_config": ["15-1", "8-8"], "predicted_speedup": [4.0, 2.9], "rel_error": [-0.24, -0.03],
                  "explanation": [json.dumps(why["vgg16 A 4x4"]), "[]"]}).to_csv(res / "table1_predicted.csv", index=False)
    speedup = write_speedup("vgg16", cfg, res / "speedup" / "vgg16.json")
    assert speedup["measured_speedup_epoch_time"] == pytest.approx(8 / 4)  # mean(10, 6) / mean(4, 4)
    assert speedup["measured_speedup_tta"] == pytest.approx(16 / 8)        # both reach 0.8 in epoch 2
    assert speedup["measured_epochs_to_accuracy_dp"] == 2
    speedup = write_speedup("gnmt8", cfg, res / "speedup" / "gnmt8.json")
    assert speedup["measured_threshold_metric"] == "bleu" and speedup["measured_speedup_tta"] == pytest.approx(12 / 10)
    df = write_report(cfg, "experiments/ci.yaml")
    assert len(df) == 14  # every row of the paper's Table 1
    vgg = df[df["model"] == "vgg16"].set_index("hardware")
    assert list(vgg.index) == ["A 4x4", "B 2x8"]
    assert vgg.loc["A 4x4", "paper_config"] == "15-1" and vgg.loc["A 4x4", "paper_speedup_epoch_time"] == 5.28
    assert vgg.loc["A 4x4", "predicted_speedup_epoch_time"] == 4.0
    assert (vgg["measured_config"] == "3-1").all()
    assert list(vgg["measured_speedup_epoch_time"]) == pytest.approx([2.0, 2.0])
    assert df[df["model"] == "alexnet"]["measured_config"].isna().all()
    # one reduced run stands for both VGG-16 rows: named on both, the second marked as a repeat
    assert list(vgg["measured_run"]) == ["vgg16/cpu4"] * 2
    assert pd.isna(vgg.loc["A 4x4", "measured_note"]) and vgg.loc["B 2x8", "measured_note"] == "same run as vgg16 A 4x4"
    gnmt = df[df["model"] == "gnmt8"]["measured_note"]
    assert gnmt.isna().tolist() == [True, False, False] and set(gnmt.dropna()) == {"same run as gnmt8 A 1x4"}
    md = (res / "table1.md").read_text()
    assert md.startswith("# Table 1") and "| same run as vgg16 A 4x4 |" in md and "measured_note" in md
    assert pd.read_csv(res / "table1.csv")["measured_note"].notna().sum() == 3

    page = (res / "report.html").read_text()
    assert re.findall(r"<img src='([^']*)'", page) and all(
        src.startswith("data:image/png;base64,") for src in re.findall(r"<img src='([^']*)'", page))
    assert not re.search(r"<img src=(?!'data:)", page) and "<link" not in page and "<script" not in page
    # 2 accuracy curves + speedup bars + the prediction check (measured against predicted epoch time)
    assert page.count("<img ") == len(list((res / "plots").glob("*.png"))) == 4
    order = ["id='headline'", "id='fig-table1_speedups'", "id='why'", "id='table1'",  # headline first, details after
             "id='prediction-check'"]
    check = pd.read_csv(res / "prediction_check.csv")  # run.json files without a prediction: rows with NaN
    assert len(check) == 4 and check["ratio"].isna().all()
    assert [page.index(x) for x in order] == sorted(page.index(x) for x in order)
    for field in ("commit", "date", "experiments/ci.yaml", "workers", "cpu4", "1 Gbps", "host", "CPUs", "torch",
                  "CUDA device"):
        assert field in page.split("id='headline'")[0], field  # in the header box, before the tables
    for line in why["vgg16 A 4x4"]:
        assert html.escape(line, quote=False) in page
    for ids in run_ids.values():  # gnmt8's run.json predates experiment_id: looked up in the store
        for rid in ids.values():
            assert f"{UI_URL}/#/experiments/{experiment_of_run(rid)}/runs/{rid}'" in page
    assert "same run as <a href='#row-1'>#1</a> (vgg16 A 4x4)" in page
    assert "same run as <a href='#row-10'>#10</a> (gnmt8 A 1x4)" in page and "make ui" in page


def test_explanations_of_an_older_predicted_table(tmp_path: Path) -> None:
    (tmp_path / "table1_predicted.csv").write_text("row,model,hardware,predicted_config\nvgg16 A 4x4,vgg16,A 4x4,15-1\n")
    assert read_explanations(tmp_path) == {}


def test_threshold_is_fixed_by_the_config_never_picked_from_the_runs() -> None:
    import math

    from pipedream.table1.measured import threshold_of

    assert threshold_of({"threshold": {"metric": "top1", "value": 52.0}}) == (52.0, "top1")
    assert threshold_of({"threshold": {"metric": "perplexity", "value": 750.0}}) == (750.0, "perplexity")
    curve = [{"val_accuracy": 0.10, "val_loss": 6.7, "wall_time_s": 4.0}, {"val_accuracy": 0.12, "val_loss": 6.5,
                                                                          "wall_time_s": 9.0}]
    assert time_to_accuracy(curve, *threshold_of({"threshold": {"metric": "token_accuracy", "value": 11.5}})) == 9.0
    assert time_to_accuracy(curve, 700.0, "perplexity") == 9.0  # exp(6.5) = 665 <= 700 < exp(6.7) = 812
    assert threshold_of({"threshold": {"metric": "bleu", "value": 0.3}}) == (0.3, "bleu")  # scored every epoch
    assert threshold_of({"threshold": {"metric": "bleu4", "value": 9.5}}) == (9.5, "bleu4")
    value, metric = threshold_of({"threshold": {"metric": "meteor", "value": 0.3}})  # needs Java: never scored
    assert math.isnan(value) and metric == "none"
    epochs = [{"val_accuracy": 0.9, "val_loss": 0.1, "wall_time_s": 5.0}]
    assert math.isnan(time_to_accuracy(epochs, value, metric))


def test_provenance_says_when_workers_oversubscribe_the_cores() -> None:
    from pipedream.table1.provenance import _workers

    assert _workers(4, 2) == "4 processes, 1 thread each (2.0x oversubscribed on 2 cores: epoch times are pessimistic)"
    assert _workers(4, 16) == "4 processes, 1 thread each"
