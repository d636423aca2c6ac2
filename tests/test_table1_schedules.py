"""The what-if table of every schedule at paper scale (pipedream.table1.schedules): its rows and the report's section."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from pipedream.planner.schedule_search import SEARCHED
from pipedream.table1 import schedules, schedules_html
from tests.conftest import REPO

CLUSTERS = REPO / "experiments" / "clusters.yaml"


def test_every_schedule_has_a_row_and_the_fastest_that_fits_is_marked(tmp_path: Path) -> None:
    df = schedules.write(tmp_path, CLUSTERS, models=("alexnet", "gpt"), clusters=("A_1x4",))
    assert list(df.columns) == schedules.COLUMNS
    for model in ("alexnet", "gpt"):
        rows = df[df["model"] == model]
        assert sorted(rows["schedule"]) == sorted(SEARCHED)
        best, fitting = rows[rows["best"]], rows[rows["fits"]]
        if fitting.empty:  # GPT-1.3B's Adam state and activations without recomputation: not on 4 x 16 GB
            assert best.empty
            continue
        assert len(best) == 1 and best["samples_per_s"].iloc[0] == fitting["samples_per_s"].max()
        assert (rows["depth"] * rows["width"] == 4).all()
        assert (rows[rows["fits"]]["peak_gb_per_gpu"] <= 16.0).all()
    assert pd.read_csv(tmp_path / schedules_html.CSV_NAME).shape == df.shape
    bests = int(df["best"].sum())
    assert bests >= 1  # AlexNet fits
    md = (tmp_path / "schedules_whatif.md").read_text()
    assert md.count("**") == 2 * bests  # the best of a model, in bold
    html = schedules_html.section(tmp_path)
    assert html.count("<b>") == 9 * bests and "alexnet" in html  # the best row's nine cells, in bold
    assert "No schedules_whatif.csv" in schedules_html.section(tmp_path / "nothing")
