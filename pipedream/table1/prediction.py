"""The prediction check: every run's measured mean epoch time beside the epoch time the simulator predicted
for it before it started (``pipedream train`` writes both to ``run.json``; :mod:`pipedream.sim.predict`).

``results/prediction_check.csv`` has one row per run (``model, mode, config, measured_epoch_s,
predicted_epoch_s, ratio``, ratio = measured / predicted); the report plots predicted against measured (the
paper's real-versus-predicted figure) and summarises the ratios: the median ``|ratio - 1|`` and how many
runs lie within :data:`BAND` of their prediction. Beside them: the first epoch's time (``first_epoch_s``; the
check uses the epochs after it), how long before the run its profile ended (``profile_age_s``: on a CPU host
whose speed drifts, an old profile predicts at the host's speed back then), and the run resimulated after it
ended with each stage's compute at its measured CPU, the cores shared fairly (that CPU already holds what the
sharing costs beyond a fair share) and everything else as predicted (``resimulated_epoch_s``,
``resimulated_ratio`` = measured / resimulated; :func:`pipedream.run_prediction.resimulation_factors`): the part
of a miss that the compute does not explain. That is a diagnosis, not a prediction: it reads the run.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from pipedream.io import atomic_write_text
from pipedream.table1.measured import finished_runs
from pipedream.table1.plots import predicted_vs_measured

BAND = 0.15  # a run "agrees" with its prediction when |measured / predicted - 1| <= BAND (issue #18's goal)
COLUMNS = ["model", "mode", "config", "measured_epoch_s", "predicted_epoch_s", "ratio", "first_epoch_s",
           "profile_age_s", "resimulated_epoch_s", "resimulated_ratio"]
CSV_NAME = "prediction_check.csv"
COMPUTE_COLUMNS = ["model", "mode", "stage", "measured_compute_s", "predicted_compute_s", "ratio", "wait_s",
                   "measured_cpu_s", "predicted_work_s", "cpu_ratio", "measured_compute_cpu_s",
                   "predicted_compute_work_s", "compute_cpu_ratio", "measured_step_cpu_s", "predicted_step_work_s",
                   "step_cpu_ratio", "stage_factor", "minor_faults"]
# compute_check.csv's measured CPU, the work the prediction gave it and their ratio: the whole process, the
# forwards and backwards, the optimizer steps
CPU_AGAINST_WORK = (("measured_cpu_s", "predicted_work_s", "cpu_ratio"),
                    ("measured_compute_cpu_s", "predicted_compute_work_s", "compute_cpu_ratio"),
                    ("measured_step_cpu_s", "predicted_step_work_s", "step_cpu_ratio"))
COMPUTE_CSV_NAME = "compute_check.csv"
PLOT_NAME = "prediction_check.png"


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan


def prediction_rows(results: Path, models: list[str]) -> pd.DataFrame:
    """One row per finished run (``<results>/runs/<model>/<mode>/run.json``) of ``models``, in order.

    A run without a prediction (``prediction_error`` in its ``run.json``) keeps its row with NaN predicted
    and ratio. Columns: :data:`COLUMNS` (seconds; ratio = measured / predicted).
    """
    rows = []
    for model, mode, run in finished_runs(results, models):
        measured = _number(run.get("steady_epoch_time_s", run.get("mean_epoch_time_s")))  # older runs: the mean
        predicted = _number(run.get("predicted_epoch_time_s"))
        ratio = measured / predicted if predicted > 0 else math.nan
        rows.append({"model": model, "mode": mode, "config": str(run.get("config", "")),
                     "measured_epoch_s": measured, "predicted_epoch_s": predicted, "ratio": ratio,
                     "first_epoch_s": _number(run.get("first_epoch_time_s")),
                     "profile_age_s": _number(run.get("profile_age_s")),
                     "resimulated_epoch_s": _number(run.get("resimulated_epoch_time_s")),
                     "resimulated_ratio": _number(run.get("resimulated_ratio"))})
    return pd.DataFrame(rows, columns=COLUMNS)


def compute_rows(results: Path, models: list[str]) -> pd.DataFrame:
    """Where an epoch's time goes, per stage of every finished run (DP: one stage): the compute seconds one of its
    ranks measured (``measured_compute_s_stage<s>``, mean over the epochs after the first and over replicas) beside
    the prediction's
    (``predicted_compute_s_stage<s>``), the seconds it waited on receives and allreduces, and the CPU
    seconds its process spent (every thread) beside the work the simulator gave it (forwards, backwards and
    optimizer steps at full speed, and its share of the allreduces' CPU): ``cpu_ratio`` above 1 is CPU the
    runtime spends that no prediction counts. ``compute_cpu_ratio`` splits it: the CPU of the main thread in the
    forwards and backwards (``measured_compute_cpu_s_stage<s>``) over their work at full speed
    (``predicted_compute_work_s_stage<s>``: the predicted compute seconds over the stage's ``f_s``), what
    sharing the host costs the compute itself beyond the wait for a core (caches evicted at every switch; the
    prediction assumes the profile's ``host.oversubscribed`` at most). A DDP run is one stage: its forwards and
    backwards up to the last bucket's launch, the rest of the backward its wait for the link
    (:class:`pipedream.baselines.ddp.Busy`). ``step_cpu_ratio``: the main thread's CPU in the optimizer steps
    (``measured_step_cpu_s_stage<s>``) over the steps' predicted work (``predicted_step_work_s_stage<s>``: the
    profile's step rate, with copy on write where the stage stashes weight versions). ``stage_factor``: the stage's
    step alone over its layers' share of the whole step, measured before the run and in its prediction
    (:mod:`pipedream.stage_probe`; NaN for DP and without the probe). ``minor_faults``: the process's minor page
    faults over an epoch's training (the kernel's CPU in memory the allocator handed out untouched, spent inside
    the compute; :mod:`pipedream.allocator`; NaN where the run did not log them).
    Columns: :data:`COMPUTE_COLUMNS` (seconds; ratio = measured /
    predicted compute; NaN where a run logged no CPU seconds)."""
    rows = []
    for model, mode, run in finished_runs(results, models):
        stage = 0
        while f"measured_compute_s_stage{stage}" in run:
            measured = float(run[f"measured_compute_s_stage{stage}"])
            predicted = _number(run.get(f"predicted_compute_s_stage{stage}"))
            rows.append({"model": model, "mode": mode, "stage": stage, "measured_compute_s": measured,
                         "predicted_compute_s": predicted,
                         "ratio": measured / predicted if predicted > 0 else math.nan,
                         "wait_s": _number(run.get(f"wait_s_stage{stage}"))})
            for cpu_key, work_key, ratio_key in CPU_AGAINST_WORK:
                cpu, work = _number(run.get(f"{cpu_key}_stage{stage}")), _number(run.get(f"{work_key}_stage{stage}"))
                rows[-1].update({cpu_key: cpu, work_key: work, ratio_key: cpu / work if work > 0 else math.nan})
            rows[-1]["stage_factor"] = _number(run.get(f"stage_factor_stage{stage}"))
            rows[-1]["minor_faults"] = _number(run.get(f"minor_faults_stage{stage}"))
            stage += 1
    return pd.DataFrame(rows, columns=COMPUTE_COLUMNS)


def summary(df: pd.DataFrame, band: float = BAND, column: str = "ratio") -> dict[str, float | int]:
    """``runs`` (with a ratio in ``column``), ``within`` (``|ratio - 1| <= band``), ``median_abs_error`` (median of
    ``|ratio - 1|``, NaN without runs) and ``worst_abs_error``."""
    err = (df[column].dropna() - 1).abs()
    return {"runs": int(err.size), "within": int((err <= band).sum()),
            "median_abs_error": float(err.median()) if err.size else math.nan,
            "worst_abs_error": float(err.max()) if err.size else math.nan}


def write_prediction_check(results: Path, models: list[str], plot: bool = True) -> pd.DataFrame:
    """Write ``<results>/prediction_check.csv``, ``<results>/compute_check.csv`` (:func:`compute_rows`) and
    (``plot``) ``<results>/plots/prediction_check.png``; returns the prediction check's rows."""
    df = prediction_rows(results, models)
    atomic_write_text(results / CSV_NAME, df.to_csv(index=False))
    atomic_write_text(results / COMPUTE_CSV_NAME, compute_rows(results, models).to_csv(index=False))
    if plot:
        s = summary(df)
        predicted_vs_measured(df, results / "plots" / PLOT_NAME, BAND,
                              title=f"{s['within']} of {s['runs']} runs within ±{BAND:.0%}; median |ratio − 1| "
                                    f"{s['median_abs_error']:.1%}")
    return df
