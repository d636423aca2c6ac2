"""One level of the hierarchical dynamic program (paper §3.1, equations for T(i→j, m) and A(j, m)).

For one level with ``M`` workers (lower-level groups) joined at bandwidth ``B`` bytes/s, and a table
``T[r, j]`` of the time one group needs for the segment of the model between state ``r - 1`` and state
``j`` (row ``r = 0``: from the start), the level computes ``A[r, j, m]``, the best time per minibatch for
that segment on ``m + 1`` workers:

* one stage replicated ``m + 1`` times (no split)::

      (T[r, j] + S(P, N, v) + W(P / g, m + 1)) / (m + 1)

  where ``P`` is the segment's parameter bytes, ``g`` the size of a lower-level group and ``W`` the
  data-parallel weight synchronisation, *added to* compute (not overlapped, as in the release);
* or a split after state ``k``: the best prefix on ``m + 1 - m'`` workers and a last stage
  ``(k, j]`` replicated ``m'`` times::

      max(A[r, k, m - m'], (T[k + 1, j] + S(P', N', v') + W(P' [/ g], m')) / m' [, 2 X(a_k / c) / m', 2 X(a_j / c) / m'])

  with the activation terms (``a`` the activation bytes crossing the split, ``c`` the compression
  ratio, ``X`` one transfer) only when activations are charged (see :class:`LevelRules`).

Default mode prices ``W``, ``X`` and ``S`` with the one cost model (:mod:`pipedream.costmodel`): ``W(S, n)`` a
ring allreduce of ``S`` bytes over ``n`` groups at this level's bandwidth with the cluster's per-step latency
(dividing the bytes by ``g``: after the reduce inside a group, its ``g`` devices each carry ``1 / g`` of the
gradient over the level's links), ``X(S)`` a transfer ``latency + S / B``, and ``S(P, N, v)`` one optimizer
step of a replica over the segment's ``P`` bytes in ``N`` tensors (:class:`pipedream.costmodel.StepRates`; each
replica steps once per minibatch it trains, like its compute), with copy on write where the stage stashes
weight versions (``v > 0``, below). The step is charged at the innermost level only: a higher level's ``T``
is a lower level's best time, which holds it. Compat mode uses the release's ``W = 4 (n - 1) S / (B n)`` and
``X = S / B`` and no step (:mod:`pipedream.planner.compat`).

A stage is memory-feasible when what one replica holds fits the device: in default mode the one memory
model (:func:`pipedream.memory.stashing_total` with ``versions + 1`` minibatches in flight, the stage's
1F1B warm-up count), in compat mode the release's ``versions * (activation bytes + parameter bytes)``;
``versions = ceil((M - (m + 1)) / m')``, the downstream workers per replica.

The rows are independent, so the final level solves row 0 only and a lower level all rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from pipedream import costmodel, memory
from pipedream.planner.compat import data_parallel_communication_time, transfer_time

INF = np.inf
_BLOCK_BYTES = 2**20  # solve_row's candidates per block: (M x block) floats of about this size


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
        one_memory_model: check memory with :func:`pipedream.memory.stashing_total` (default mode: weight
            copies, gradients, momentum, stashed activations and received inputs); False: the release's
            ``versions * (activations + parameters)``.
        comm_ratio: activation compression ratio; ``None`` ignores activation transfers (release
            without ``--activation_compression_ratio``).
        straight: one replica per stage.
        compat: price weight sync and transfers with the release's formulas (:mod:`pipedream.planner.compat`)
            instead of :mod:`pipedream.costmodel`'s.
        latency_s: per-step latency of a ring allreduce and of a transfer, seconds (default mode only).
        step: the optimizer step ``S`` (default mode's innermost level); None: no step (compat mode, higher levels).
    """

    workers: int
    bandwidth_Bps: float
    group_init: float = 1.0
    group_split: float = 1.0
    memory_limit_bytes: float | None = None
    memory_divisor: float = 1.0
    one_memory_model: bool = False
    comm_ratio: float | None = None
    straight: bool = False
    compat: bool = False
    latency_s: float = 0.0
    step: costmodel.StepRates | None = None


def weight_sync_s(rules: LevelRules, param_bytes: float | np.ndarray, replicas: int | np.ndarray,
                  group: float) -> float | np.ndarray:
    """``W``: weight sync of ``param_bytes`` over ``replicas`` groups of this level (arrays broadcast), seconds."""
    if rules.compat:
        return data_parallel_communication_time(param_bytes, replicas, rules.bandwidth_Bps, group)
    return costmodel.ring_allreduce_s_array(param_bytes / group, replicas, rules.bandwidth_Bps, rules.latency_s)


def step_s(rules: LevelRules, param_bytes: float | np.ndarray, tensors: float | np.ndarray,
           versions: int | np.ndarray) -> float | np.ndarray:
    """``S``: one optimizer step of a replica over ``param_bytes`` bytes in ``tensors`` tensors, copying its weights
    first where it stashes ``versions > 0`` (arrays broadcast), seconds; 0 without ``rules.step``."""
    if rules.step is None:
        return 0.0
    return rules.step.seconds_array(np.asarray(param_bytes, dtype=np.float64), tensors, np.asarray(versions) > 0)


def activation_s(rules: LevelRules, boundary_bytes: float | np.ndarray,
                 replicas: int | np.ndarray) -> float | np.ndarray:
    """Sending a boundary's activations and receiving their gradients, per minibatch on one of ``replicas``
    replicas (arrays broadcast), seconds; requires ``rules.comm_ratio``."""
    assert rules.comm_ratio is not None
    if rules.compat:
        return transfer_time(boundary_bytes, replicas, rules.bandwidth_Bps, rules.comm_ratio)
    one_way = costmodel.transfer_s_array(boundary_bytes / rules.comm_ratio, rules.bandwidth_Bps, rules.latency_s)
    return 2.0 * one_way / replicas


@dataclass(frozen=True)
class ComputeTable:
    """The innermost level's ``T[r, j]``, computed where read: the compute of the states after ``r - 1``
    up to ``j``, ``C_j - C_{r-1}`` seconds (``C_{-1} = 0``), ``inf`` where that segment is not allowed.
    Stored it is ``(n + 1) x n`` floats (18 MB for GNMT-16), of which a one-level solve reads one row
    and the split candidates' last stages.

    Attributes:
        compute: ``C``, cumulative compute per state, seconds, shape ``(n,)``.
        nested: ``None`` (the release: a segment may end at any state at or after its start), or
            ``nested[k, j]``, state ``j`` contains state ``k``, shape ``(n, n)``: a segment after state
            ``r - 1`` ends only at states that contain it.

    Indexed like the stored table in the two ways the recurrences read it: ``table[rows]``, whole rows,
    shape ``(len(rows), n)``; ``table[r, j]``, integer arrays that broadcast.
    """

    compute: np.ndarray
    nested: np.ndarray | None = None

    def __getitem__(self, index: np.ndarray | tuple[np.ndarray | int, np.ndarray | int]) -> np.ndarray:
        if isinstance(index, tuple):
            r, j = np.asarray(index[0]), np.asarray(index[1])
            inside = None if self.nested is None else self.nested[np.maximum(r - 1, 0), j]
        else:
            rows = np.asarray(index)
            r, j = rows[:, None], np.arange(len(self.compute))[None, :]
            inside = None if self.nested is None else self.nested[np.maximum(rows - 1, 0)]
        allowed = j >= r
        if inside is not None:
            allowed = allowed & ((r == 0) | inside)
        return np.where(allowed, self.compute[j] - _prev(self.compute)[r], INF)


@dataclass
class LevelInput:
    """Per-state data shared by all levels (cumulative over each state's ideal).

    Attributes:
        table: ``T[r, j]`` seconds, shape ``(n + 1, n)``, ``inf`` where undefined (stored, or at the
            innermost level a :class:`ComputeTable`).
        params: cumulative parameter bytes per state, shape ``(n,)``.
        acts: cumulative activation bytes per state, shape ``(n,)``.
        boundary: activation bytes crossing a split after each state, shape ``(n,)``.
        ancestors: ``ancestors[k, j]``: a split after ``k`` may end at ``j``, shape ``(n, n)``.
        tied_users: per tied tensor, users in each state's ideal, shape ``(T, n)``
            (:attr:`pipedream.planner.states.StateGraph.tied_users`); none by default. With them a segment's
            parameter bytes count each tied tensor once (:func:`segment_params`).
        tied_bytes: bytes of each tied tensor, shape ``(T,)``.
        tensors: cumulative parameter tensors per state (a tied tensor once per user), shape ``(n,)``; empty:
            none (:func:`segment_tensors`).
    """

    table: np.ndarray | ComputeTable
    params: np.ndarray
    acts: np.ndarray
    boundary: np.ndarray
    ancestors: np.ndarray
    tied_users: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    tied_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0))
    tensors: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def n(self) -> int:
        return len(self.params)


def _prev(values: np.ndarray) -> np.ndarray:
    """``values`` shifted by one row: entry ``r`` is the value of state ``r - 1`` (0 for ``r = 0``)."""
    return np.concatenate(([0.0], values))


def segment_params(inp: LevelInput, rows: np.ndarray | int, j: np.ndarray | int) -> np.ndarray | float:
    """Parameter bytes of the segment after state ``rows - 1`` (row 0: from the start) up to state ``j``, each
    tied tensor counted once however many of its users the segment holds (arrays broadcast as ``rows`` and
    ``j`` do), bytes."""
    return _segment(inp, inp.params, inp.tied_bytes, rows, j)


def segment_tensors(inp: LevelInput, rows: np.ndarray | int, j: np.ndarray | int,
                    rules: LevelRules | None = None) -> np.ndarray | float:
    """Parameter tensors of the same segment as :func:`segment_params`, each tied tensor once; 0 when ``inp`` has
    no tensor counts, or when ``rules`` is given and its step charges nothing per tensor (not computed then)."""
    step = rules.step if rules is not None else None
    if not len(inp.tensors) or (rules is not None and (step is None or step.s_per_param_byte is None
                                                       or step.s_per_tensor == 0)):
        return 0.0
    return _segment(inp, inp.tensors, np.ones(len(inp.tied_bytes)), rows, j)


def _segment(inp: LevelInput, cumulative: np.ndarray, per_tied: np.ndarray, rows: np.ndarray | int,
             j: np.ndarray | int) -> np.ndarray | float:
    """``cumulative[j] - cumulative[rows - 1]`` less ``per_tied`` for each user of a tied tensor beyond the first."""
    total: np.ndarray | float = cumulative[j] - _prev(cumulative)[rows]
    for users, amount in zip(inp.tied_users, per_tied, strict=True):
        total = total - amount * np.maximum(users[j] - _prev(users)[rows] - 1.0, 0.0)
    return total


def initial_table(inp: LevelInput, rules: LevelRules, rows: np.ndarray) -> np.ndarray:
    """The unsplit values laid out as ``A[m, j, r]``, shape ``(M, n, len(rows))``, seconds."""
    n, big_m = inp.n, rules.workers
    p = segment_params(inp, rows[None, :], np.arange(n)[:, None])
    tensors = segment_tensors(inp, rows[None, :], np.arange(n)[:, None], rules)
    mem = p + inp.acts[:, None] - _prev(inp.acts)[rows][None, :]
    inbound = _prev(inp.boundary)[rows][None, :]  # a segment after state r - 1 receives its boundary
    t = inp.table[rows].T
    out = np.full((big_m, n, len(rows)), INF)
    for m in range(1 if rules.straight else big_m):
        versions = math.ceil((big_m - (m + 1)) / (m + 1))
        value = (t + step_s(rules, p, tensors, versions) + weight_sync_s(rules, p, m + 1, rules.group_init)) / (m + 1)
        if rules.memory_limit_bytes is not None:
            need = (memory.stashing_total(p, mem - p, inbound, versions + 1) if rules.one_memory_model
                    else versions * mem)  # the release's rule
            value = np.where(need / rules.memory_divisor > rules.memory_limit_bytes, INF, value)
        out[m] = value
    return out


def last_stage(inp: LevelInput, rules: LevelRules, k: np.ndarray, j: np.ndarray | int, m: np.ndarray | int,
               m_prime: np.ndarray) -> np.ndarray:
    """Time of the last stage ``(k, j]`` on ``m_prime`` replicas when the prefix uses ``m + 1`` workers.

    Includes the optimizer step, the weight sync, the memory check (``inf`` when it does not fit) and, when charged, the
    activation transfers into and out of the stage. All arguments broadcast (integer arrays). Seconds.
    """
    n = inp.n
    m = np.asarray(m)
    m_prime = np.asarray(m_prime, dtype=np.float64)
    p = segment_params(inp, np.asarray(k) + 1, j)
    versions = np.ceil((rules.workers - (m + 1)) / m_prime)
    step = step_s(rules, p, segment_tensors(inp, np.asarray(k) + 1, j, rules), versions)
    value: np.ndarray = (inp.table[k + 1, j] + step + weight_sync_s(rules, p, m_prime, rules.group_split)) / m_prime
    if rules.memory_limit_bytes is not None:
        acts = inp.acts[j] - inp.acts[k]
        mem = (memory.stashing_total(p, acts, inp.boundary[k], versions + 1) if rules.one_memory_model
               else versions * (acts + p)) / rules.memory_divisor  # else: the release's rule
        value = np.where(mem > rules.memory_limit_bytes, INF, value)
    if rules.comm_ratio is not None:
        transfer_in = activation_s(rules, inp.boundary[k], m_prime)
        transfer_out = np.where(np.asarray(j) < n - 1, activation_s(rules, inp.boundary[j], m_prime), 0.0)
        value = np.maximum(value, np.maximum(transfer_in, transfer_out))
    return value


def combos(rules: LevelRules) -> tuple[np.ndarray, np.ndarray]:
    """All ``(m, m')`` pairs of the recurrence (``m >= 1``, ``1 <= m' <= m``; ``m' = 1`` when straight), by ``m``."""
    pairs = [(m, mp) for m in range(1, rules.workers) for mp in ([1] if rules.straight else range(1, m + 1))]
    return np.array([m for m, _ in pairs], dtype=np.int64), np.array([mp for _, mp in pairs], dtype=np.int64)


def combo_groups(rules: LevelRules) -> tuple[np.ndarray, ...]:
    """:func:`combos` plus what the kernels index with: ``(m_of, mp_of, prefix_m, group_starts, ms)``.

    ``prefix_m = m - m'`` is the worker count left to the prefix of a split; ``group_starts`` are the
    indices where a new ``m`` begins (for ``np.minimum.reduceat``) and ``ms`` those ``m`` values.
    """
    m_of, mp_of = combos(rules)
    group_starts = np.flatnonzero(np.r_[True, m_of[1:] != m_of[:-1]])
    return m_of, mp_of, m_of - mp_of, group_starts, m_of[group_starts]


def solve_rows(inp: LevelInput, rules: LevelRules, cols: list[np.ndarray]) -> np.ndarray:
    """``A[r, j, M - 1]`` for every row ``r = 0..n`` (values only, all workers), shape ``(n + 1, n)``, seconds.

    ``cols[j]`` lists the states after which a split may end at ``j`` (the ancestors of ``j``, possibly
    with dominated ones removed, see :func:`pipedream.planner.prune.undominated_pairs`). End states
    are visited in topological order and, for each, every row and every ``(m, m')`` at once. A split
    after ``k`` is valid for row ``r`` when ``A[r, k]`` is finite (``T`` is ``inf`` where a segment is
    not allowed, e.g. ``k < r``).
    """
    n, big_m = inp.n, rules.workers
    # Work on A[m, j, r] so that gathering the split states ks reads contiguous rows of r.
    table = initial_table(inp, rules, np.arange(n + 1))
    if big_m == 1 or n == 1:
        return np.ascontiguousarray(table[-1].T)
    m_of, mp_of, prefix_m, group_starts, ms = combo_groups(rules)
    for j in range(1, n):
        ks = cols[j]
        if not len(ks):
            continue
        top = int(ks.max()) + 1  # rows r <= max(k) can use some k >= r
        last = last_stage(inp, rules, ks[None, :], j, m_of[:, None], mp_of[:, None])
        best = np.minimum.reduceat(best_splits(table, ks, top, last, prefix_m), group_starts, axis=0)
        table[ms, j, :top] = np.minimum(table[ms, j, :top], best)
    return np.ascontiguousarray(table[-1].T)


def best_splits(table: np.ndarray, ks: np.ndarray, top: int, last: np.ndarray, prefix_m: np.ndarray) -> np.ndarray:
    """For one end state: the best split over the candidates ``ks`` per ``(m, m')`` pair and row.

    ``table`` is ``A[m, j, r]``, ``last[c, i]`` the last stage's time for pair ``c`` after ``ks[i]``.
    Returns shape ``(pairs, top)``: ``min_k max(A[m - m', k, r], last)``, ``inf`` where none is valid.
    """
    prefix: np.ndarray = table[prefix_m[:, None], ks[None, :], :top]
    np.maximum(prefix, last[:, :, None], out=prefix)
    best: np.ndarray = prefix.min(axis=1)
    return best


@dataclass
class RowSolution:
    """One row ``r`` of a level: ``time[j, m]``, the best time per minibatch (s) for the segment after
    state ``r - 1`` up to state ``j`` on ``m + 1`` workers, shape ``(n, M)``, and ``unsplit[j, m]``, the
    same segment as one stage. The plan behind a value comes from :meth:`choice`."""

    time: np.ndarray
    unsplit: np.ndarray
    inp: LevelInput
    rules: LevelRules
    r: int

    def choice(self, j: int, m: int) -> tuple[int, int]:
        """The last stage of the best plan for ``time[j, m]``: ``(k, replicas)``, a split after state ``k``
        (``-1``: one stage, on all ``m + 1`` workers) and the replicas of the last stage.

        Tie rule: an unsplit stage beats a split of equal time; between splits of equal time the one after
        the earliest state (smallest topological index) wins, then the fewest replicas in the last stage.
        Every ancestor of ``j`` is tried (also those a pruned solve skipped: they can only tie).
        """
        best = self.time[j, m]
        if not (math.isfinite(best) and best < self.unsplit[j, m]):
            return -1, m + 1
        ks = np.flatnonzero(self.inp.ancestors[:, j])
        ks = ks[ks >= self.r]
        mps = np.arange(1, 2 if self.rules.straight else m + 1)[:, None]
        last = last_stage(self.inp, self.rules, ks[None, :], j, m, mps)
        hit = np.maximum(self.time[ks[None, :], m - mps], last) == best  # [m' - 1, i]
        if not hit.any():  # the value is the minimum of these very candidates
            raise AssertionError(f"no split reproduces A[{self.r}, {j}, {m}] = {best!r}")
        first = int(np.argmax(hit.any(axis=0)))
        return int(ks[first]), int(mps[np.argmax(hit[:, first]), 0])


def solve_row(inp: LevelInput, rules: LevelRules, r: int, pairs: tuple[np.ndarray, np.ndarray]) -> RowSolution:
    """Row ``r`` of a level: the best time for every end state ``j`` and worker count (values; the plans
    come from :meth:`RowSolution.choice`).

    Args:
        inp, rules: the level.
        r: the row: segments start after state ``r - 1`` (0: from the beginning).
        pairs: ``(k, j)`` split candidates, sorted by ``j``, shapes ``(P,)``: every ancestor ``k`` of ``j``
            (:func:`pipedream.planner.prune.all_pairs`), or at the innermost level those not dominated
            (:func:`pipedream.planner.prune.undominated_pairs`; the same values).
    Worker counts in increasing order: column ``m`` needs the prefixes on fewer workers only, so each is
    one array operation over the candidates and last-stage replicas ``m'``: ``(m, P)`` values. The
    candidates go in blocks of whole end states, about ``_BLOCK_BYTES`` of values each: a block reads the
    values of earlier blocks (final) and of its own earlier end states (final for smaller ``m``), and its
    arrays stay in the cache and in memory the process already has (arrays of a few MB come fresh from
    the OS at every call, a page fault per 4 kB).
    """
    n, big_m = inp.n, rules.workers
    time = initial_table(inp, rules, np.array([r]))[:, :, 0].T  # A[r, j, m], shape (n, M)
    solution = RowSolution(time, time.copy(), inp, rules, r)
    pk, pj = pairs
    keep = (pk >= r) & (pj > r)
    pk, pj = pk[keep], pj[keep]
    if big_m == 1 or n == 1 or not len(pk):
        return solution
    heads = np.flatnonzero(np.r_[True, pj[1:] != pj[:-1]])  # where each end state's candidates begin
    block = max(1, _BLOCK_BYTES // (8 * big_m))
    cuts = np.searchsorted(heads, np.arange(block, len(pk), block))  # the first end state at or after each
    bounds = np.unique(np.r_[0, heads[cuts[cuts < len(heads)]], len(pk)])
    mps = np.arange(1, 2 if rules.straight else big_m)[:, None]  # m', the last stage's replicas
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        ks, js = pk[None, lo:hi], pj[None, lo:hi]
        starts = heads[(heads >= lo) & (heads < hi)] - lo
        ends = js[0, starts]
        # Without a memory limit and a step (whose copy on write depends on the versions) the last stage does
        # not depend on m: price it once per m'.
        fixed = last_stage(inp, rules, ks, js, 0, mps) if rules.memory_limit_bytes is None and rules.step is None else None
        prefix = np.empty((big_m, hi - lo))  # prefix[m] = time[k, m] per candidate, filled as m grows
        prefix[0] = time[ks[0], 0]
        for m in range(1, big_m):
            count = len(mps) if rules.straight else m  # m' = 1..count, prefix on m - m' + 1 workers
            last = fixed[:count] if fixed is not None else last_stage(inp, rules, ks, js, m, mps[:count])
            cand = np.maximum(prefix[m - count:m][::-1], last).min(axis=0)
            time[ends, m] = np.minimum(time[ends, m], np.minimum.reduceat(cand, starts))
            prefix[m] = time[ks[0], m]
    return solution
