"""Which activations cross a cut of the layer graph: the one definition of a boundary's bytes that the
planner (:mod:`pipedream.planner.states`, per antichain state) and the simulator (:mod:`pipedream.sim.costs`,
per stage boundary) both use.

A cut is a set of nodes closed under predecessors (a state's ideal, or the stages up to ``s``). The
output of node ``b`` crosses it when ``b`` is inside and at least one consumer of ``b`` is outside: the
activation is sent forward once, however many consumers outside need it, and its gradient comes back.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def crossing(member: np.ndarray, consumers: Sequence[Sequence[int]]) -> np.ndarray:
    """``out[s, b]``: node ``b`` is in cut ``s`` and feeds a node outside it, shape ``(cuts, nodes)``.

    Args:
        member: ``member[s, b]``, node ``b`` is in cut ``s``, boolean, shape ``(cuts, nodes)``.
        consumers: per node, the indices of the nodes that consume its output (a node without consumers
            never crosses).
    """
    member = np.asarray(member, dtype=bool)
    all_inside = np.ones((member.shape[1], member.shape[0]), dtype=bool)  # [b, s]: every consumer of b in s
    filled = [b for b, cs in enumerate(consumers) if len(cs)]
    if filled:
        flat = np.fromiter((c for b in filled for c in consumers[b]), dtype=np.intp)
        starts = np.cumsum([0] + [len(consumers[b]) for b in filled[:-1]])
        all_inside[filled] = np.logical_and.reduceat(member.T[flat], starts, axis=0)
    return member & ~all_inside.T
