"""One level of the hierarchical dynamic program (paper §3.1, equations for T(i→j, m) and A(j, m)).

For one level with ``M`` workers (lower-level groups) joined at bandwidth ``B`` bytes/s, and a table
``T[r, j]`` of the time one group needs for the segment of the model between state ``r - 1`` and state
``j`` (row ``r = 0``: from the start), the level computes ``A[r, j, m]``, the best time per minibatch for
that segment on ``m + 1`` workers:

* one stage replicated ``m + 1`` times (no split)::

      (T[r, j] + 4 m P / (B (m + 1)) / g) / (m + 1)

  where ``P`` is the segment's parameter bytes and ``g`` the size of a lower-level group; the term is
  the data-parallel weight synchronisation, *added to* compute (not overlapped, as in the release);
* or a split after state ``k``: the best prefix on ``m + 1 - m'`` workers and a last stage
  ``(k, j]`` replicated ``m'`` times::

      max(A[r, k, m - m'], (T[k + 1, j] + 4 (m' - 1) P' / (B m') [/ g]) / m'
          [, 2 a_k / (B m' c), 2 a_j / (B m' c)])

  with the activation terms (``a`` the activation bytes crossing the split, ``c`` the compression
  ratio) only when activations are charged (see :class:`LevelRules`).

A stage is memory-feasible when ``versions * (activation bytes + parameter bytes)`` fits the device,
``versions = ceil((M - (m + 1)) / m')`` (+1 when the working copy is counted).

The rows are independent, so the final level solves row 0 only and a lower level all rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

INF = np.inf


@dataclass(frozen=True)
class LevelRules:
    """How one level charges costs; compat mode reproduces the release, default mode fixes it.

    Attributes:
        workers: ``M``, workers (lower-level groups) at this level.
        bandwidth_Bps: ``B``, bytes/s between them.
        group_init: divisor of the weight-sync term of an unsplit segment (the release: workers of the
            previous level; default: devices per group).
        group_split: the same divisor for the last stage of a split (release: 1, default: as above).
        memory_limit_bytes: per-device memory, or ``None`` for no limit.
        memory_divisor: divide a stage's bytes by this before the memory check (devices per group in
            default mode; 1 in the release).
        extra_version: 1 to count the working copy as a version (default mode), 0 (release).
        comm_ratio: activation compression ratio; ``None`` ignores activation transfers (release
            without ``--activation_compression_ratio``).
        straight: one replica per stage.
        nested_only: only split at states that contain the segment's start state (default mode); the
            release also accepts any later state in topological order.
    """

    workers: int
    bandwidth_Bps: float
    group_init: float = 1.0
    group_split: float = 1.0
    memory_limit_bytes: float | None = None
    memory_divisor: float = 1.0
    extra_version: int = 0
    comm_ratio: float | None = None
    straight: bool = False
    nested_only: bool = False


@dataclass
class LevelInput:
    """Per-state data shared by all levels (cumulative over each state's ideal).

    Attributes:
        table: ``T[r, j]`` seconds, shape ``(n + 1, n)``, ``inf`` where undefined.
        params: cumulative parameter bytes per state, shape ``(n,)``.
        acts: cumulative activation bytes per state, shape ``(n,)``.
        boundary: activation bytes crossing a split after each state, shape ``(n,)``.
        ancestors: ``ancestors[k, j]``: a split after ``k`` may end at ``j``, shape ``(n, n)``.
    """

    table: np.ndarray
    params: np.ndarray
    acts: np.ndarray
    boundary: np.ndarray
    ancestors: np.ndarray

    @property
    def n(self) -> int:
        return len(self.params)


def _prev(values: np.ndarray) -> np.ndarray:
    """``values`` shifted by one row: entry ``r`` is the value of state ``r - 1`` (0 for ``r = 0``)."""
    return np.concatenate(([0.0], values))


def initial_stage(inp: LevelInput, rules: LevelRules, rows: np.ndarray) -> np.ndarray:
    """``A[r, j, m]`` for the unsplit segment on ``m + 1`` replicas, shape ``(len(rows), n, M)``, seconds."""
    n, big_m = inp.n, rules.workers
    p = inp.params[None, :] - _prev(inp.params)[rows][:, None]
    mem = p + inp.acts[None, :] - _prev(inp.acts)[rows][:, None]
    t = inp.table[rows]
    out = np.full((len(rows), n, big_m), INF)
    for m in range(1 if rules.straight else big_m):
        value = (t + 4.0 * m * p / (rules.bandwidth_Bps * (m + 1)) / rules.group_init) / (m + 1)
        if rules.memory_limit_bytes is not None:
            versions = math.ceil((big_m - (m + 1)) / (m + 1)) + rules.extra_version
            value = np.where(versions * mem / rules.memory_divisor > rules.memory_limit_bytes, INF, value)
        out[:, :, m] = value
    return out


def last_stage(inp: LevelInput, rules: LevelRules, k: np.ndarray, j: np.ndarray, m: int, m_prime: int) -> np.ndarray:
    """Time of the last stage ``(k, j]`` on ``m_prime`` replicas when the prefix uses ``m + 1`` workers.

    Includes the weight sync, the memory check (``inf`` when it does not fit) and, when charged, the
    activation transfers into and out of the stage. ``k`` and ``j`` broadcast together. Seconds.
    """
    n, b = inp.n, rules.bandwidth_Bps
    p = inp.params[j] - inp.params[k]
    value = (inp.table[k + 1, j] + 4.0 * (m_prime - 1) * p / (b * m_prime) / rules.group_split) / m_prime
    if rules.memory_limit_bytes is not None:
        versions = math.ceil((rules.workers - (m + 1)) / m_prime) + rules.extra_version
        mem = versions * (inp.acts[j] - inp.acts[k] + p) / rules.memory_divisor
        value = np.where(mem > rules.memory_limit_bytes, INF, value)
    if rules.comm_ratio is not None:
        transfer_in = 2.0 * inp.boundary[k] / (b * m_prime) / rules.comm_ratio
        transfer_out = np.where(j < n - 1, 2.0 * inp.boundary[j] / (b * m_prime) / rules.comm_ratio, 0.0)
        value = np.maximum(value, np.maximum(transfer_in, transfer_out))
    return value


def solve_rows(inp: LevelInput, rules: LevelRules, rows: np.ndarray, nested: np.ndarray | None = None) -> np.ndarray:
    """``A[r, j, m]`` for every row in ``rows`` (no back-pointers), shape ``(len(rows), n, M)``.

    ``nested[r - 1, k]`` (default mode) says state ``k`` contains state ``r - 1``; without it a split
    may follow any state with a later topological index (the release).
    """
    n, big_m = inp.n, rules.workers
    table = initial_stage(inp, rules, rows)
    if big_m == 1 or n == 1:
        return table
    splits = [1] if rules.straight else None
    cols = [np.flatnonzero(inp.ancestors[:, j]) for j in range(n)]
    row_mask = None
    if rules.nested_only and nested is not None:
        prev = np.where(rows > 0, rows - 1, 0)
        row_mask = np.where((rows > 0)[:, None], nested[prev], True)
    first_row = int(rows.min())
    for m in range(1, big_m):
        for j in range(first_row + 1, n):
            ks = cols[j]
            ks = ks[ks >= first_row]
            if not len(ks):
                continue
            live = rows < j
            best = table[live, j, m]
            for m_prime in splits or range(1, m + 1):
                last = last_stage(inp, rules, ks, np.full(len(ks), j), m, m_prime)
                cand = np.maximum(table[np.ix_(live, ks, [m - m_prime])][:, :, 0], last[None, :])
                if row_mask is not None:
                    cand = np.where(row_mask[np.ix_(live, ks)], cand, INF)
                best = np.minimum(best, cand.min(axis=1))
            table[live, j, m] = best
    return table


@dataclass
class RowSolution:
    """One row of a level with back-pointers: ``time[j, m]``, ``split[j, m]`` (-1: one stage) and
    ``replicas[j, m]`` (replicas of the last stage)."""

    time: np.ndarray
    split: np.ndarray
    replicas: np.ndarray


def solve_row(inp: LevelInput, rules: LevelRules, r: int, nested: np.ndarray | None = None) -> RowSolution:
    """Row ``r`` with back-pointers, ties broken deterministically.

    Tie rule: an unsplit stage beats a split of equal time; between splits of equal time the one after
    the earliest state (smallest topological index) wins, then the fewest replicas in the last stage.
    """
    n, big_m = inp.n, rules.workers
    time = initial_stage(inp, rules, np.array([r]))[0]
    split = np.full((n, big_m), -1, dtype=np.int64)
    replicas = np.tile(np.arange(1, big_m + 1), (n, 1))
    if big_m == 1 or n == 1:
        return RowSolution(time, split, replicas)
    pk, pj = np.nonzero(inp.ancestors)
    order = np.lexsort((pk, pj))
    pk, pj = pk[order], pj[order]
    keep = (pk >= r) & (pj > r)
    if rules.nested_only and r > 0 and nested is not None:
        keep &= nested[r - 1, pk]
    pk, pj = pk[keep], pj[keep]
    if not len(pk):
        return RowSolution(time, split, replicas)
    heads = np.flatnonzero(np.r_[True, pj[1:] != pj[:-1]])
    seg_j = pj[heads]
    counts = np.diff(np.r_[heads, len(pj)])
    for m in range(1, big_m):
        best = time[seg_j, m].copy()
        best_k = np.full(len(seg_j), -1)
        best_mp = replicas[seg_j, m].copy()
        for m_prime in [1] if rules.straight else range(1, m + 1):
            cand = np.maximum(time[pk, m - m_prime], last_stage(inp, rules, pk, pj, m, m_prime))
            seg_min = np.minimum.reduceat(cand, heads)
            hit = np.flatnonzero(cand == np.repeat(seg_min, counts))
            seg_of_hit = np.searchsorted(heads, hit, side="right") - 1
            uniq, first = np.unique(seg_of_hit, return_index=True)
            arg_k = np.full(len(seg_j), -1)
            arg_k[uniq] = pk[hit[first]]
            better = (seg_min < best) | ((seg_min == best) & (best_k >= 0) & (arg_k >= 0) & (arg_k < best_k))
            better &= np.isfinite(seg_min)
            best = np.where(better, seg_min, best)
            best_k = np.where(better, arg_k, best_k)
            best_mp = np.where(better, m_prime, best_mp)
        time[seg_j, m] = best
        split[seg_j, m] = best_k
        replicas[seg_j, m] = best_mp
    return RowSolution(time, split, replicas)
