"""DP's link speed fitted per cluster, leave-one-out (pipedream/table1/calibration.py), and the rule that only a
V100-scale profile gives a predicted Table 1 row numbers (issue #23)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from pipedream.graph import LayerGraph, Node
from pipedream.table1 import calibration as C
from pipedream.table1.html import html_report
from pipedream.table1.predicted import NO_PROFILE, V100_SCALE_KEY, _speedup_at, build_tables, find_profile
from pipedream.table1.predicted_files import write_predicted
from pipedream.table1.table import build_table as report_table
from pipedream.table1.table import read_calibration
from pipedream.topology import get_cluster
from tests.conftest import REPO

CLUSTERS = REPO / "experiments" / "clusters.yaml"
HEADER = (REPO / "experiments" / "paper_table1.csv").read_text().splitlines()[0]


def _row(name: str, c: float, paper: float, group: str | None = "A", fits: bool = True) -> C.Row:
    """A made-up row whose predicted speedup is ``c / f``: ``ln speedup - ln paper = ln(c / paper) - ln f``, so the
    least-squares fraction over rows is the geometric mean of their ``c / paper`` (clipped to [F_MIN, 1])."""
    return C.Row(name, group, paper, lambda f: c / f, fits)


def test_fit_is_the_geometric_mean_of_the_rows_needs() -> None:
    rows = [_row("a", 0.2, 1.0), _row("b", 0.4, 1.0), _row("c", 0.8, 1.0)]
    assert C.fit_fraction(rows) == pytest.approx(0.4, rel=1e-3)  # (0.2 * 0.4 * 0.8) ** (1 / 3)
    assert C.fit_fraction([_row("x", 3.0, 1.0), _row("y", 2.0, 1.0)]) == 1.0  # would need DP faster than the link
    assert C.fit_fraction([_row("z", 1e-5, 1.0)]) == pytest.approx(C.F_MIN)
    with pytest.raises(ValueError, match="at least one row"):
        C.fit_fraction([C.Row("n", "A", 1.0, None)])


def test_leave_one_out_never_sees_the_held_out_rows_paper_number() -> None:
    rows = [_row("a", 0.2, 1.0), _row("b", 0.4, 1.0), _row("c", 0.8, 1.0)]
    loo = C.loo_columns(rows)
    assert list(loo.columns) == list(C.LOO_COLUMNS)
    held = math.sqrt(0.4 * 0.8)  # row a: fitted on b and c only
    assert loo["loo_fraction"][0] == pytest.approx(held, rel=1e-3)
    assert loo["loo_predicted_speedup"][0] == pytest.approx(0.2 / held, rel=1e-3)
    assert loo["loo_rel_error"][0] == pytest.approx(0.2 / held / 1.0 - 1, rel=1e-3)
    # a's paper number changes: a's fraction does not, b's and c's (which a's number trains) do
    moved = C.loo_columns([_row("a", 0.2, 5.0), *rows[1:]])
    assert moved["loo_fraction"][0] == loo["loo_fraction"][0]
    assert moved["loo_predicted_speedup"][0] == loo["loo_predicted_speedup"][0]
    assert moved["loo_fraction"][1] != pytest.approx(loo["loo_fraction"][1], rel=1e-2)
    summary = C.group_summary(rows, loo).iloc[0]
    assert summary["full_fraction"] == pytest.approx(0.4, rel=1e-3) and summary["rows_fitted"] == 3
    assert summary["loo_fraction_min"] == pytest.approx(math.sqrt(0.2 * 0.4), rel=1e-3)  # c left out
    assert summary["loo_fraction_max"] == pytest.approx(held, rel=1e-3)


def test_rows_without_a_fraction_say_why() -> None:
    rows = [_row("a", 0.2, 1.0), _row("b", 0.4, 1.0, group="B"), _row("one server", 1.2, 1.5, group=None),
            C.Row("no profile", "A", 3.0, None), _row("dp plan", 1.0, 1.0, fits=False), _row("b2", 1e3, 1.0, "B", False)]
    loo = C.loo_columns(rows).set_index(pd.Index([r.name for r in rows]))
    # a's cluster has no other fitting row ("dp plan" does not fit, "no profile" has no number)
    assert math.isnan(loo.loc["a", "loo_fraction"]) and math.isnan(loo.loc["a", "loo_predicted_speedup"])
    assert loo.loc["a", "loo_note"] == "no other row of cluster A with a number to fit on"
    assert "no other row of cluster B" in loo.loc["b", "loo_note"]
    assert math.isnan(loo.loc["one server", "loo_fraction"])
    assert loo.loc["one server", "loo_predicted_speedup"] == 1.2 and "one server" in loo.loc["one server", "loo_note"]
    assert math.isnan(loo.loc["no profile", "loo_predicted_speedup"]) and math.isnan(loo.loc["no profile", "loo_rel_error"])
    assert loo.loc["dp plan", "loo_fraction"] == pytest.approx(0.2 / 1.0, rel=1e-3)  # fitted on a alone
    assert C.within_counts(pd.DataFrame({"predicted_speedup": [1.0, 2.0, math.nan], "rel_error": [0.1, -0.5, math.nan],
                                         "loo_rel_error": [0.2, 0.15, math.nan]})) == {
        "rows": 3, "numbered": 2, "within_line_rate": 1, "within_loo": 1}


def test_rows_of_a_predicted_table() -> None:
    df = pd.DataFrame({"row": ["v A 4x4", "r A 4x4", "g A 1x4", "s C 4x1"],
                       "hardware": ["A 4x4", "A 4x4", "A 1x4", "C 4x1"], "paper_speedup": [5.0, 1.0, 1.5, 3.0],
                       "predicted_config": ["15-1", "16", "straight", NO_PROFILE],
                       "predicted_speedup": [2.0, 1.0, 1.1, math.nan]})
    rows = C.rows_of(df, {0: lambda f: 2.0 / f, 1: lambda f: 1.0 / f, 2: lambda f: 1.1 / f})
    assert [r.group for r in rows] == ["A", "A", None, "C"]
    assert [r.fits for r in rows] == [True, False, True, True]
    assert rows[1].speedup_at is not None and rows[1].speedup_at(0.1) == 1.0  # DP plan: DP on both sides
    assert rows[3].speedup_at is None


def _profile(root: Path, model: str, param_bytes: float, meta: dict[str, object]) -> None:
    """A 6-layer chain profiled at 8 samples: 10 ms forward and 20 ms backward a layer."""
    g = LayerGraph(minibatch_size=8)
    for i in range(6):
        g.add_node(Node(f"n{i}", "Linear", 0.010, 0.020, (1e5,), param_bytes))
        if i:
            g.add_edge(f"n{i - 1}", f"n{i}")
    (root / model).mkdir(parents=True)
    g.write(root / model / "graph.txt")
    (root / model / "meta.json").write_text(json.dumps({"minibatch_size": 8, "device": "cpu", **meta}))


def _paper(path: Path, rows: list[str]) -> Path:
    path.write_text("\n".join([HEADER, *rows]) + "\n")
    return path


def test_only_a_v100_scale_profile_gives_numbers(tmp_path: Path) -> None:
    _profile(tmp_path / "profiles", "awd_lm", 1e6, {})
    _profile(tmp_path / "profiles", "s2vt", 200e6, {V100_SCALE_KEY: "measured on a V100 16 GB at the paper's size"})
    prof = find_profile("awd_lm", tmp_path / "profiles")
    assert prof is not None and not prof.v100_scale
    release = find_profile("vgg16", tmp_path / "profiles")
    assert release is not None and release.v100_scale
    paper = _paper(tmp_path / "paper.csv", ["language_model,awd_lm,penn_treebank,98 perplexity,1,4,A,straight,4.25,4.25",
                                            "video_captioning,s2vt,msvd,0.294 METEOR,4,1,C,2-1-1,3.01,3.01"])
    df, summary = build_tables(paper, CLUSTERS, tmp_path / "profiles", None)
    awd, s2vt = df.iloc[0], df.iloc[1]
    assert awd["prediction_status"] == awd["predicted_config"] == NO_PROFILE
    assert "cpu profile at 8 samples" in awd["profile"] and V100_SCALE_KEY in awd["profile"]
    for col in ("predicted_speedup", "rel_error", "loo_fraction", "loo_predicted_speedup", "loo_rel_error"):
        assert pd.isna(awd[col]), col
    assert s2vt["prediction_status"] == "predicted" and s2vt["predicted_speedup"] > 0
    assert s2vt["predicted_config"] == "1-1-2"  # a pipeline (DP stalls on 1.2 GB of weights): the row fits
    # C's only row: nothing else to fit on
    assert pd.isna(s2vt["loo_predicted_speedup"]) and s2vt["loo_note"] == "no other row of cluster C with a number to fit on"
    assert list(summary["cluster"]) == ["C"] and summary["rows_fitted"].iloc[0] == 1
    counts = C.within_counts(df)
    assert counts["rows"] == 2 and counts["numbered"] == 1  # the CPU profile's row is out of the counts


def test_loo_columns_of_a_simulated_cluster(tmp_path: Path) -> None:
    """Three multi-server rows of cluster A (models with large weights, so DP waits on its allreduce)."""
    for model in ("m1", "m2", "m3"):
        _profile(tmp_path / "profiles", model, 200e6, {V100_SCALE_KEY: True})
    lines = [f"image_classification,{m},imagenet,,4,4,A,15-1,{s},{s}" for m, s in (("m1", 8.0), ("m2", 10.0), ("m3", 12.0))]
    df, summary = build_tables(_paper(tmp_path / "paper.csv", lines), CLUSTERS, tmp_path / "profiles", None)
    for col in C.LOO_COLUMNS:
        assert col in df.columns
    cluster = get_cluster("A_4x4", CLUSTERS)
    prof = find_profile("m1", tmp_path / "profiles")
    assert prof is not None
    r = df.iloc[0]
    at = [_speedup_at(prof.graph, cluster, r["dataset_samples"], r["pipedream_epoch_time_s"], f) for f in (1.0, 0.5)]
    assert at[0] == pytest.approx(r["predicted_speedup"], rel=1e-9)  # line rate: the predicted speedup
    assert at[1] > at[0]  # a slower DP allreduce
    assert r["loo_predicted_speedup"] == pytest.approx(
        _speedup_at(prof.graph, cluster, r["dataset_samples"], r["pipedream_epoch_time_s"], r["loo_fraction"]))
    assert summary["cluster"].tolist() == ["A"] and summary["rows_fitted"].iloc[0] == 3
    assert 0.01 < r["loo_fraction"] < 1 and r["loo_predicted_speedup"] > r["predicted_speedup"]  # DP slowed
    # m1's own paper number does not move m1's fraction
    lines[0] = lines[0].replace(",8.0,8.0", ",20.0,20.0")
    moved, _ = build_tables(_paper(tmp_path / "paper2.csv", lines), CLUSTERS, tmp_path / "profiles", None)
    assert moved["loo_fraction"].iloc[0] == r["loo_fraction"]
    assert moved["loo_fraction"].iloc[1] != df["loo_fraction"].iloc[1]  # m2's fit uses m1's number

    # the files: table1_calibration.csv, the markdown section, the report's headline column and section
    write_predicted(df, tmp_path, CLUSTERS, calibration=summary)
    assert read_calibration(tmp_path) is not None
    md = (tmp_path / "table1_predicted.md").read_text()
    assert "leave-one-out" in md and "| A | 3 (m1 A 4x4; m2 A 4x4; m3 A 4x4) |" in md
    cfg = {"results_dir": str(tmp_path), "paper_table": str(tmp_path / "paper.csv"), "models": {}}
    table = report_table(cfg)
    assert table["predicted_loo_speedup_epoch_time"].iloc[0] == pytest.approx(r["loo_predicted_speedup"])
    page = html_report(table, [], tmp_path, calibration=read_calibration(tmp_path))
    assert "id='calibration-table'" in page and "calibrated, LOO" in page
    assert f"{r['loo_predicted_speedup']:.2f}×" in page and f"{r['loo_fraction']:.0%} of line rate" in page


def test_rows_predicted_in_parallel_give_the_same_table(tmp_path: Path) -> None:
    """Three rows of cluster A and one without a V100-scale profile, predicted by 2 processes and by this one: the
    same table, row for row and column for column (the rows are independent; their order is the paper's)."""
    for model in ("m1", "m2", "m3"):
        _profile(tmp_path / "profiles", model, 200e6, {V100_SCALE_KEY: True})
    _profile(tmp_path / "profiles", "awd_lm", 1e6, {})
    lines = [f"image_classification,{m},imagenet,,4,4,A,15-1,{s},{s}" for m, s in (("m1", 8.0), ("m2", 10.0), ("m3", 12.0))]
    lines.insert(1, "language_model,awd_lm,penn_treebank,98 perplexity,1,4,A,straight,4.25,4.25")
    paper = _paper(tmp_path / "paper.csv", lines)
    serial, serial_summary = build_tables(paper, CLUSTERS, tmp_path / "profiles", None, jobs=1)
    parallel, parallel_summary = build_tables(paper, CLUSTERS, tmp_path / "profiles", None, jobs=2)
    assert list(serial["row"]) == ["m1 A 4x4", "awd_lm A 1x4", "m2 A 4x4", "m3 A 4x4"]
    pd.testing.assert_frame_equal(serial, parallel)
    pd.testing.assert_frame_equal(serial_summary, parallel_summary)
