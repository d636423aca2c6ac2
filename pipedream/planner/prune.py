"""Dominated split points: candidates of the innermost level that can never be strictly better.

Lemma (innermost level, where a stage's time is a function of the cumulative compute, parameter,
activation and boundary values of its two ends): if states ``k1`` and ``k2`` have the same such values
and ``k1`` precedes ``k2``, then for every row ``r <= k1`` and every ``m``, ``A[r, k2, m] <= A[r, k1, m]``
(same unsplit value, and every split of ``k1`` is also a split of ``k2`` with the same last stage).
So for an end state ``j`` that both precede, a split after ``k1`` is never better than after ``k2``:
``k1`` can be dropped from ``j``'s candidates without changing any value of the table. GNMT's zero-cost
``__getitem__`` layers make many such states (GNMT-16: 283k candidate pairs, 32k after pruning).
Back-pointers are still computed over all candidates, so the tie rule is unaffected.

Finding them: ``k1`` is dominated for ``j`` when a state ``d`` of its class (the same values) lies
between them, ``k1`` before ``d`` before ``j``. When every value is non-decreasing along the state DAG's
edges (cumulative sums of non-negative layers are), a class is convex: every state on a path between
two of its members is a member. Then ``d`` can be taken to be a direct successor of ``k1`` in its class,
and ``k1`` is dominated for exactly the descendants of those successors: one OR of ancestor rows per
same-class edge. Otherwise (the boundary bytes can shrink along an edge) every same-class descendant
of ``k1`` is tried.
"""

from __future__ import annotations

import numpy as np

from pipedream.planner.bits import pack_rows, set_bits
from pipedream.planner.states import StateGraph


def undominated_pairs(states: StateGraph, keys: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The split candidates ``(k, j)``, ``k`` an ancestor of ``j`` not dominated (see the module docstring).

    Args:
        states: the state graph.
        keys: per-state value arrays that a stage's time depends on (e.g. cumulative compute, params),
            each of shape ``(n,)``.
    Returns:
        ``(k, j)``: integer arrays of shape ``(P,)``, sorted by ``j``, then ``k``.
    """
    anc = states.ancestors
    n = states.n
    _, cls = np.unique(np.stack(keys, axis=1), axis=0, return_inverse=True)
    cls = cls.reshape(-1)
    src, dst = states.edges[:, 0], states.edges[:, 1]
    keep = pack_rows(anc)  # [k, descendants of k]: the candidates, as packed bits
    if all(np.all(key[dst] >= key[src]) for key in keys):  # convex classes: same-class edges suffice
        same = cls[src] == cls[dst]
        order = np.argsort(src[same], kind="stable")
        src, dst = src[same][order], dst[same][order]
        rows, starts = np.unique(src, return_index=True)
        if len(rows):
            keep[rows] &= ~np.bitwise_or.reduceat(keep[dst], starts, axis=0)
    else:
        rows = np.flatnonzero(np.bincount(cls)[cls] > 1)  # a state alone in its class is never dominated
        dominated = np.zeros((len(rows), n), dtype=bool)
        for i, k1 in enumerate(rows):
            dominators = np.flatnonzero(anc[k1] & (cls == cls[k1]))
            if len(dominators):
                dominated[i] = anc[dominators].any(axis=0)
        keep[rows] &= ~pack_rows(dominated)
    k, j = set_bits(keep)
    order = np.argsort(j, kind="stable")
    return k[order], j[order]


def all_pairs(states: StateGraph) -> tuple[np.ndarray, np.ndarray]:
    """Every split candidate ``(k, j)``, ``k`` an ancestor of ``j``; sorted by ``j``, then ``k``, shapes ``(P,)``."""
    j, k = np.nonzero(states.ancestors.T)
    return k, j


def by_end(pairs: tuple[np.ndarray, np.ndarray], n: int) -> list[np.ndarray]:
    """Pairs ``(k, j)`` sorted by ``j`` as ``cols[j]``: the split states of end state ``j``, for ``j < n``."""
    k, j = pairs
    return np.split(k, np.searchsorted(j, np.arange(1, n)))
