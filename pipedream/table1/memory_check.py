"""The memory check: every stage's measured peak bytes beside the memory model's prediction for it.

``pipedream train`` writes, per stage, ``measured_memory_bytes_stage<s>`` (the runtime's count of the
storages the stage holds, :mod:`pipedream.runtime.memory_meter`, largest replica) and
``predicted_memory_bytes_stage<s>`` (:func:`pipedream.sim.predict.predict_memory`, from the profile before
the run) to ``run.json``. ``results/memory_check.csv`` has one row per stage of every run that has both:
``model, mode, stage, measured_bytes, predicted_bytes, ratio`` (ratio = measured / predicted). A DP run is
one stage (stage 0) on every worker, counted by :mod:`pipedream.baselines.ddp` on rank 0.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from pipedream.io import atomic_write_text
from pipedream.table1.measured import finished_runs

COLUMNS = ["model", "mode", "stage", "measured_bytes", "predicted_bytes", "ratio"]
CSV_NAME = "memory_check.csv"
BAND = 0.10  # the goal: every stage within 10% of its prediction


def memory_rows(results: Path, models: list[str]) -> pd.DataFrame:
    """One row per stage with a measured and a predicted peak, for every finished run
    (``<results>/runs/<model>/<mode>/run.json``) of ``models``, in order. Columns: :data:`COLUMNS` (bytes)."""
    rows = []
    for model, mode, run in finished_runs(results, models):
        stage = 0
        while f"predicted_memory_bytes_stage{stage}" in run:
            predicted = float(run[f"predicted_memory_bytes_stage{stage}"])
            measured = run.get(f"measured_memory_bytes_stage{stage}")
            if measured is not None:
                rows.append({"model": model, "mode": mode, "stage": stage, "measured_bytes": float(measured),
                             "predicted_bytes": predicted,
                             "ratio": float(measured) / predicted if predicted > 0 else math.nan})
            stage += 1
    return pd.DataFrame(rows, columns=COLUMNS)


def write_memory_check(results: Path, models: list[str]) -> pd.DataFrame:
    """Write ``<results>/memory_check.csv``; returns the rows."""
    df = memory_rows(results, models)
    atomic_write_text(results / CSV_NAME, df.to_csv(index=False))
    return df
