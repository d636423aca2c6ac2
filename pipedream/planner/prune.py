"""Dominated split points: candidates of the innermost level that can never be strictly better.

Lemma (innermost level, where a stage's time is a function of the cumulative compute, parameter,
activation and boundary values of its two ends): if states ``k1`` and ``k2`` have the same such values
and ``k1`` precedes ``k2``, then for every row ``r <= k1`` and every ``m``, ``A[r, k2, m] <= A[r, k1, m]``
(same unsplit value, and every split of ``k1`` is also a split of ``k2`` with the same last stage).
So for an end state ``j`` that both precede, a split after ``k1`` is never better than after ``k2``:
``k1`` can be dropped from ``j``'s candidates without changing any value of the table. GNMT's zero-cost
``__getitem__`` layers make many such states (GNMT-16: 283k candidate pairs, 32k after pruning).
Back-pointers are still computed over all candidates, so the tie rule is unaffected.
"""

from __future__ import annotations

import numpy as np

from pipedream.planner.states import StateGraph


def undominated_ancestors(states: StateGraph, keys: list[np.ndarray]) -> list[np.ndarray]:
    """For each state ``j``, the ancestors ``k`` of ``j`` not dominated (see the module docstring).

    Args:
        states: the state graph.
        keys: per-state value arrays that a stage's time depends on (e.g. cumulative compute, params).
    Returns:
        ``cols[j]``: sorted state indices.
    """
    anc = states.ancestors
    n = states.n
    _, cls = np.unique(np.stack(keys, axis=1), axis=0, return_inverse=True)
    cls = cls.reshape(-1)
    dominated = np.zeros((n, n), dtype=bool)
    for k1 in range(n):
        dominators = np.flatnonzero(anc[k1] & (cls == cls[k1]))
        if len(dominators):
            dominated[k1] = anc[dominators].any(axis=0)
    keep = anc & ~dominated
    return [np.flatnonzero(keep[:, j]) for j in range(n)]


def all_ancestors(states: StateGraph) -> list[np.ndarray]:
    """For each state ``j``, every ancestor ``k`` of ``j`` (sorted)."""
    return [np.flatnonzero(states.ancestors[:, j]) for j in range(states.n)]
