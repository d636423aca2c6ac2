"""DP's effective link speed, fitted per cluster and tested leave-one-out.

The predicted Table 1 times data parallelism's allreduce at line rate; NCCL over TCP in 2019 did not reach it.
One fraction ``f`` of line rate per paper cluster (A, B, C: one network each) slows DP's allreduce between
servers (the outermost level of the row's cluster; none on a one-server row, whose links are PCIe or NVLink,
not TCP); PipeDream's simulation stays at line rate, so ``speedup(f) = DP epoch(f) / PipeDream epoch``.

``f`` minimises the squared log error against the paper, ``sum_rows (ln speedup_r(f) - ln paper_r)^2``, by a
log-spaced grid over ``[F_MIN, 1]`` refined by bounded Brent (``scipy.optimize.minimize_scalar``) between the
best grid point's neighbours. Each row is predicted with the fraction fitted on the *other* rows of its cluster
(leave-one-out), so no row's prediction has seen its own paper number.

The fit is generic (:class:`Row` holds a ``speedup_at`` callable, tests give made-up ones); the rows of the
predicted table are made by :func:`rows_of` from the simulator (:func:`pipedream.table1.predicted.dp_epoch_at`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import minimize_scalar

from pipedream.table1.explain import THRESHOLD

F_MIN = 1e-3  # lowest fraction of line rate searched (the bisection of dp_bandwidth_for starts there too)
GRID_POINTS = 25  # log-spaced grid over [F_MIN, 1]: 8 points a decade
LOO_COLUMNS = ("loo_fraction", "loo_predicted_speedup", "loo_rel_error", "loo_note")


@dataclass(frozen=True)
class Row:
    """One Table 1 row as the calibration sees it.

    Attributes:
        name: the row's label, e.g. ``"vgg16 A 4x4"``.
        group: the paper cluster whose fraction applies (``"A"``), or None where none does (a one-server row).
        paper_speedup: the paper's epoch-time speedup (DP time / PipeDream time).
        speedup_at: predicted speedup with DP's between-servers bandwidth at ``f`` x line rate; None when the
            row has no number.
        fits: whether the row takes part in fits: its speedup depends on ``f`` (not so when PipeDream's plan is
            itself data parallelism: both sides slow down alike).
    """

    name: str
    group: str | None
    paper_speedup: float
    speedup_at: Callable[[float], float] | None
    fits: bool = True


def squared_log_error(rows: Sequence[Row], f: float) -> float:
    """``sum_rows (ln speedup_r(f) - ln paper_r)^2`` (dimensionless) for rows with a ``speedup_at``."""
    return sum((math.log(r.speedup_at(f)) - math.log(r.paper_speedup)) ** 2 for r in rows if r.speedup_at)


def fit_fraction(rows: Sequence[Row], f_min: float = F_MIN) -> float:
    """The fraction ``f`` in ``[f_min, 1]`` of line rate minimising :func:`squared_log_error` over ``rows``.

    A log-spaced grid of :data:`GRID_POINTS` finds the basin; bounded Brent in ``ln f`` between the best grid
    point's neighbours refines it (to 1e-4 in ``ln f``); the better of the two is returned.

    Raises:
        ValueError: no row has a ``speedup_at``.
    """
    if not any(r.speedup_at for r in rows):
        raise ValueError("fit_fraction needs at least one row with a speedup_at")
    grid = np.linspace(math.log(f_min), 0.0, GRID_POINTS)
    losses = [squared_log_error(rows, math.exp(x)) for x in grid]
    i = int(np.argmin(losses))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    res = minimize_scalar(lambda x: squared_log_error(rows, math.exp(x)), bounds=(lo, hi), method="bounded",
                          options={"xatol": 1e-4})
    return math.exp(float(res.x)) if res.fun < losses[i] else math.exp(float(grid[i]))


@dataclass(frozen=True)
class Loo:
    """A row's leave-one-out prediction: ``fraction`` (of line rate, NaN where none applies), ``speedup``
    (NaN where none) and ``note`` (why there is no fraction or number; '' otherwise)."""

    fraction: float
    speedup: float
    note: str


def others(rows: Sequence[Row], row: Row) -> list[Row]:
    """The rows a fit for ``row`` may use: those of its group that fit, ``row`` itself left out."""
    return [r for r in rows if r.group == row.group and r is not row and r.fits and r.speedup_at]


def leave_one_out(rows: Sequence[Row]) -> list[Loo]:
    """Each row predicted with the fraction fitted on the other rows of its group (:func:`fit_fraction`)."""
    out = []
    for row in rows:
        if row.speedup_at is None:
            out.append(Loo(math.nan, math.nan, "no number to calibrate"))
        elif row.group is None:
            out.append(Loo(math.nan, row.speedup_at(1.0), "one server: no link between servers to calibrate; "
                                                          "line rate kept"))
        elif not (train := others(rows, row)):
            out.append(Loo(math.nan, math.nan, f"no other row of cluster {row.group} with a number to fit on"))
        else:
            f = fit_fraction(train)
            note = "" if row.fits else "PipeDream's plan is data parallelism: DP on both sides, the fraction cancels"
            out.append(Loo(f, row.speedup_at(f), note))
    return out


def loo_columns(rows: Sequence[Row]) -> pd.DataFrame:
    """:data:`LOO_COLUMNS` for ``rows`` (same order): ``loo_rel_error = loo_predicted / paper - 1``."""
    loo = leave_one_out(rows)
    return pd.DataFrame({
        "loo_fraction": [x.fraction for x in loo], "loo_predicted_speedup": [x.speedup for x in loo],
        "loo_rel_error": [x.speedup / r.paper_speedup - 1 for x, r in zip(loo, rows, strict=True)],
        "loo_note": [x.note for x in loo]})


def group_summary(rows: Sequence[Row], loo: pd.DataFrame) -> pd.DataFrame:
    """Per group: the rows fitted, the fraction fitted on all of them, and the spread of the leave-one-out
    fractions (:func:`loo_columns`) over the folds that left out one of them (min, max; NaN with fewer than
    2 rows)."""
    out = []
    for group in sorted({r.group for r in rows if r.group is not None}):
        fit = [r for r in rows if r.group == group and r.fits and r.speedup_at]
        folds = [f for r, f in zip(rows, loo["loo_fraction"], strict=True)
                 if any(r is q for q in fit) and not math.isnan(f)]
        out.append({"cluster": group, "rows_fitted": len(fit), "rows": "; ".join(r.name for r in fit) or "none",
                    "full_fraction": fit_fraction(fit) if fit else math.nan,
                    "loo_fraction_min": min(folds, default=math.nan), "loo_fraction_max": max(folds, default=math.nan)})
    return pd.DataFrame(out)


def within_counts(df: pd.DataFrame, threshold: float = THRESHOLD, speedup: str = "predicted_speedup",
                  rel: str = "rel_error", loo_rel: str = "loo_rel_error") -> dict[str, int]:
    """Rows of a predicted table: ``rows``, ``numbered`` (a line-rate prediction in column ``speedup``),
    ``within_line_rate`` and ``within_loo`` (``|rel. error| <= threshold`` in columns ``rel`` and ``loo_rel``;
    a NaN error is not within)."""
    def within(column: str) -> int:
        return int((df[column].abs() <= threshold).sum()) if column in df.columns else 0

    numbered = int(df[speedup].notna().sum()) if speedup in df.columns else 0
    return {"rows": len(df), "numbered": numbered, "within_line_rate": within(rel), "within_loo": within(loo_rel)}


def cached(fn: Callable[[float], float]) -> Callable[[float], float]:
    """``fn`` memoised per ``f`` (the grid points recur in every fold)."""
    return functools.lru_cache(maxsize=None)(fn)


def rows_of(df: pd.DataFrame, speedup_at: dict[Any, Callable[[float], float]]) -> list[Row]:
    """The calibration rows of a predicted Table 1 (:func:`pipedream.table1.predicted.build_tables`).

    ``speedup_at`` maps an index of ``df`` to its row's speedup with DP at ``f`` x line rate between servers
    (rows without one have no number). The group is the paper cluster (``hardware``'s first word) on rows with
    more than one server (one server has no link between servers to slow). Where our plan is data parallelism
    (a config of one number, e.g. ``"16"``), PipeDream runs DP's own allreduce, so its speedup stays
    ``predicted_speedup`` at every ``f`` and the row does not fit.
    """
    rows = []
    for i, r in df.iterrows():
        fn = speedup_at.get(i)
        servers = int(str(r["hardware"]).split()[1].split("x")[0])
        group = str(r["hardware"]).split()[0] if servers > 1 else None
        dp_plan = is_dp_config(str(r.get("predicted_config")))
        if fn is not None and dp_plan:
            fn = functools.partial(_constant, float(r["predicted_speedup"]))
        rows.append(Row(str(r["row"]), group, float(r["paper_speedup"]), fn, fits=not dp_plan))
    return rows


def _constant(value: float, f: float) -> float:
    """``value`` at every fraction ``f``."""
    return value


def is_dp_config(config: str) -> bool:
    """Whether a configuration string is data parallelism: one stage on every worker, e.g. ``"16"``."""
    return config.isdigit()


def pct(v: float) -> str:
    """A fraction as a percentage, ``"47%"``; NaN as an em dash."""
    return "—" if math.isnan(v) else f"{v:.0%}"


def spread(lo: float, hi: float) -> str:
    """The range of the leave-one-out fractions, ``"44%-100%"``; an em dash where there are none."""
    return "—" if math.isnan(lo) else f"{pct(lo)}-{pct(hi)}"


def markdown_section(summary: pd.DataFrame, counts: dict[str, int]) -> list[str]:
    """Markdown lines: the per-cluster fit (:func:`group_summary`) and the rows within 15% (:func:`within_counts`)."""

    lines = ["", "## DP's effective link speed, fitted per cluster (leave-one-out)", "",
             "DP's allreduce between servers at a fraction f of line rate, one f per paper cluster, PipeDream at line "
             "rate; f minimises sum (ln predicted(f) - ln paper)^2 over the cluster's multi-server rows whose plan is "
             "not DP. Each row's calibrated prediction uses the f fitted on the other rows (leave-one-out).", "",
             "| cluster | rows fitted | f, all rows | f over the folds (min-max) |", "|---|---|---|---|"]
    lines += [f"| {r.cluster} | {r.rows_fitted} ({r.rows}) | {pct(r.full_fraction)} | "
              f"{spread(r.loo_fraction_min, r.loo_fraction_max)} |" for r in summary.itertuples(index=False)]
    lines += ["", f"Rows within {THRESHOLD:.0%} of the paper: {counts['within_line_rate']} of {counts['numbered']} "
              f"with a number ({counts['rows']} rows) at line rate, {counts['within_loo']} calibrated leave-one-out."]
    return lines
