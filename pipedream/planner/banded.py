"""The innermost level's all-rows solve, restricted to the splits that can still win (same values as
:func:`pipedream.planner.recurrence.solve_rows`, much less work).

At the innermost level a stage's time is at least its compute divided by its replicas, so for row ``r``
(the segment starts after state ``r - 1``), end state ``j``, ``m + 1`` workers and a last stage on
``m'`` replicas, a split after ``k`` can only beat the current value ``U`` if

* the last stage is faster than ``U``: ``(C_j - C_k) / m' < U``, and
* the prefix on ``m + 1 - m'`` workers is: ``(C_k - C_{r-1} + d_r) / (m + 1 - m') < U``,

where ``C`` is the cumulative compute and ``d_r <= 0`` bounds how far a negative parameter difference
can lower a prefix's weight-sync term (only the release's splits after states that do not contain the
segment's start have one; see :mod:`pipedream.planner`, difference 5). The prefix bound holds
because the replica-weighted mean of the stage times of any split is at least the total compute over
the workers. So ``C_k`` must lie in a window around the balanced split; with the splits of each end
state sorted by ``C`` the window is two binary searches, and only the candidates inside it are priced.
``U`` starts as the unsplit value; where that is infinite (a memory limit) the window is open.
"""

from __future__ import annotations

import numpy as np

from pipedream.planner.compat import data_parallel_communication_time
from pipedream.planner.recurrence import LevelInput, LevelRules, best_splits, combo_groups, initial_table, last_stage

_SLACK = 1e-9  # relative widening of the window, against rounding in the bounds
_DENSE_BELOW = 40_000  # candidate-rows below which pricing everything is cheaper than the window
_BANDED_GAIN = 12  # pricing one windowed candidate costs about this many dense ones (scattered gathers)
_CACHE_BYTES = 16 * 2**20  # tables larger than this are priced densely (see below)


def solve_rows_banded(inp: LevelInput, rules: LevelRules, cols: list[np.ndarray], compute: np.ndarray,
                      ) -> np.ndarray:
    """``A[r, j, M - 1]`` for all rows, shape ``(n + 1, n)``, seconds; ``inp.table`` must be the compute
    differences ``C_j - C_{r-1}`` (the innermost level). Arguments as for ``solve_rows``."""
    n, big_m = inp.n, rules.workers
    table = initial_table(inp, rules, np.arange(n + 1))  # A[m, j, r]
    if big_m == 1 or n == 1:
        return np.ascontiguousarray(table[-1].T)
    m_of, mp_of, prefix_m, group_starts, ms = combo_groups(rules)
    c_prev = np.concatenate(([0.0], compute))
    # d_r: the most negative weight-sync contribution a prefix of row r can get (0 unless P can drop).
    p_prev = np.concatenate(([0.0], inp.params))
    suffix_min_p = np.minimum.accumulate(inp.params[::-1])[::-1]
    drop = np.minimum(0.0, np.r_[suffix_min_p, np.inf][: n + 1] - p_prev)
    # Only the release's weight sync goes negative with P (default mode's ring allreduce is 0 for P <= 0), at
    # most at its steepest slope, per byte: that of the largest replica count and the smallest divisor.
    slope = data_parallel_communication_time(1.0, big_m, rules.bandwidth_Bps, min(rules.group_init, rules.group_split))
    d = drop * slope if rules.compat else np.zeros_like(drop)
    slack = _SLACK * max(float(np.max(np.abs(compute))), 1e-30)
    n_combos = len(m_of)
    # Windowed pricing gathers scattered entries of the table; once the table no longer fits in the
    # cache that costs more than pricing every candidate from contiguous rows (GNMT-16: 72 MB).
    big = table.nbytes > _CACHE_BYTES
    for j in range(1, n):
        ks = cols[j]
        if not len(ks):
            continue
        top = int(ks.max()) + 1
        last = last_stage(inp, rules, ks[None, :], j, m_of[:, None], mp_of[:, None])  # (combos, K)
        order = np.argsort(compute[ks], kind="stable")
        distinct = 1 + int(np.count_nonzero(np.diff(compute[ks[order]])))  # few: a window would not narrow it
        if big or n_combos * len(ks) * top <= _DENSE_BELOW or distinct * 4 < len(ks):
            best = best_splits(table, ks, top, last, prefix_m)
        else:
            best = _banded(table, ks[order], compute[ks[order]], top, j, last[:, order], m_of, mp_of, prefix_m,
                           compute, c_prev, d, slack)
        best = np.minimum.reduceat(best, group_starts, axis=0)
        table[ms, j, :top] = np.minimum(table[ms, j, :top], best)
    return np.ascontiguousarray(table[-1].T)


def _price(table: np.ndarray, ks: np.ndarray, last: np.ndarray, prefix_m: np.ndarray, combo: np.ndarray,
           row: np.ndarray, pos: np.ndarray) -> np.ndarray:
    price: np.ndarray = np.maximum(table[prefix_m[combo], ks[pos], row], last[combo, pos])
    return price


def _banded(table: np.ndarray, ks: np.ndarray, cs: np.ndarray, top: int, j: int,  # noqa: PLR0913 (private kernel)
            last: np.ndarray, m_of: np.ndarray, mp_of: np.ndarray, prefix_m: np.ndarray, compute: np.ndarray,
            c_prev: np.ndarray, d: np.ndarray, slack: float) -> np.ndarray:
    """As :func:`~pipedream.planner.recurrence.best_splits`, ``ks`` sorted by compute, pricing only the window."""
    n_combos, n_k = last.shape
    rows = np.arange(top)
    grid_combo = np.repeat(np.arange(n_combos), top)
    grid_row = np.tile(rows, n_combos)
    # An upper bound better than the unsplit value: price the split nearest the balanced one.
    share = ((prefix_m + 1) / (m_of + 1))[:, None]
    target = c_prev[rows][None, :] + (compute[j] - c_prev[rows][None, :]) * share
    mid = np.searchsorted(cs, target).ravel()
    bound: np.ndarray = table[m_of, j, :top].ravel()
    probe = np.minimum(mid, n_k - 1)
    bound = np.minimum(bound, _price(table, ks, last, prefix_m, grid_combo, grid_row, probe))
    bound = bound.reshape(n_combos, top)
    lo_val = compute[j] - mp_of[:, None] * bound - slack
    hi_val = c_prev[rows][None, :] - d[rows][None, :] + (prefix_m + 1)[:, None] * bound + slack
    lo = np.searchsorted(cs, np.where(np.isfinite(lo_val), lo_val, -np.inf), side="right").ravel()
    hi = np.searchsorted(cs, np.where(np.isfinite(hi_val), hi_val, np.inf), side="left").ravel()
    lengths = np.maximum(hi - lo, 0)
    total = int(lengths.sum())
    if total * _BANDED_GAIN > n_combos * n_k * top:
        dense: np.ndarray = np.minimum(bound, best_splits(table, ks, top, last, prefix_m))
        return dense
    best = bound.ravel().copy()
    if total:
        seg = np.flatnonzero(lengths)
        seg_len = lengths[seg]
        starts = np.concatenate(([0], np.cumsum(seg_len)[:-1]))
        seg_rep = np.repeat(seg, seg_len)
        pos = np.repeat(lo[seg] - starts, seg_len) + np.arange(total)
        vals = _price(table, ks, last, prefix_m, grid_combo[seg_rep], grid_row[seg_rep], pos)
        best[seg] = np.minimum(best[seg], np.minimum.reduceat(vals, starts))
    return best.reshape(n_combos, top)
