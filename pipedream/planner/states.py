"""Antichain states of a layer graph (paper §3.1, "Planner", for DAG-shaped models).

The planner splits a model between two *states*: a state is a down-set (an "ideal") of the layer DAG,
named by its antichain, the set of its maximal nodes. A stage is the difference between two nested
states. The states are enumerated exactly as the release optimizer (``graph.antichain_dag``) does:

* data-input sources (``Input...``) are dropped (they always go to stage 0), and so are sinks named
  ``__getitem__...`` (they go with their producer);
* starting from the first remaining source (file order), a breadth-first search moves from an antichain
  to its successors: for every node ``x`` of the *augmented* antichain (the antichain plus those of
  its ancestors that still feed a node outside the ancestors of the same antichain member) and every
  consumer ``y`` of ``x`` that is not in the antichain and has no descendant in the augmented
  antichain, ``x`` is replaced by ``y`` and nodes with a descendant in the list are removed;
* a state's ``boundary`` size is the sum of the output sizes of its augmented antichain (what the
  release charges for the activations crossing a split there), and its compute time, activation and
  parameter sizes are sums over its ideal (the antichain and all its ancestors);
* states are numbered in the order of a depth-first topological sort of the state graph that visits
  successors in discovery order (the release's order, with its hash-dependent set order replaced by
  file order, so it is the same on every run).

Times are seconds per profiled minibatch (forward + backward), sizes bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph


def _bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


@dataclass
class StateGraph:
    """The antichain states of a layer graph, in topological order.

    Attributes:
        node_ids: ids of the nodes the planner places (inputs and ``__getitem__`` sinks removed), file order.
        dropped_inputs: ids of the removed ``Input`` sources (they go to stage 0).
        dropped_sinks: ids of the removed ``__getitem__`` sinks (they go with their producer).
        ideals: per state, bitmask over ``node_ids`` of the nodes up to and including the state.
        antichains: per state, the antichain (node ids), for explanations.
        compute_s: per state, forward+backward seconds of its ideal, cumulative.
        activation_bytes: per state, summed output bytes of its ideal, cumulative.
        param_bytes: per state, summed parameter bytes of its ideal, cumulative.
        boundary_bytes: per state, output bytes of its augmented antichain (release semantics).
        cut_bytes: per state, output bytes of the ideal's nodes that feed a node outside it.
        ancestors: boolean matrix, ``ancestors[k, j]`` if state ``k`` precedes state ``j`` in the state DAG.
        nested: boolean matrix, ``nested[k, j]`` if ideal ``k`` is a proper subset of ideal ``j``.
        edges: the state DAG's edges ``(k, j)``, ``j`` a direct successor of ``k`` (an edge may repeat), shape ``(E, 2)``
            (``ancestors`` is their transitive closure).
    """

    node_ids: list[str]
    dropped_inputs: list[str]
    dropped_sinks: list[str]
    ideals: list[int]
    antichains: list[list[str]]
    compute_s: np.ndarray
    activation_bytes: np.ndarray
    param_bytes: np.ndarray
    boundary_bytes: np.ndarray
    cut_bytes: np.ndarray
    ancestors: np.ndarray
    nested: np.ndarray
    edges: np.ndarray

    @property
    def n(self) -> int:
        """Number of states."""
        return len(self.ideals)

    def nodes_between(self, k: int, j: int) -> list[str]:
        """Node ids in ideal ``j`` but not in ideal ``k`` (``k = -1``: from the start), file order."""
        low = self.ideals[k] if k >= 0 else 0
        return [self.node_ids[b] for b in _bits(self.ideals[j] & ~low)]


def build_states(graph: LayerGraph) -> StateGraph:
    """Enumerate the antichain states of ``graph`` (see the module docstring).

    Raises:
        PipeDreamError: if a node has no times (NaN), if nothing is left after removing inputs, or on
            a cycle (the graph reader already rejects cycles).
    """
    for node in graph.nodes.values():
        values = (node.fwd_s, node.bwd_s, node.param_bytes, *node.activation_bytes)
        if not node.activation_bytes or any(v != v for v in values):  # NaN check
            raise PipeDreamError(f"node {node.node_id!r} has no forward/backward time or sizes; re-profile it")
    graph.topological_order()  # raises on a cycle, naming a node on it
    preds_of: dict[str, list[str]] = {n: [] for n in graph.nodes}
    succs_of: dict[str, list[str]] = {n: [] for n in graph.nodes}
    for s, d in graph.edges:
        preds_of[d].append(s)
        succs_of[s].append(d)
    dropped_inputs = [n for n, node in graph.nodes.items() if node.is_input and not preds_of[n]]
    remaining = [n for n in graph.nodes if n not in set(dropped_inputs)]
    # Sinks are taken after the inputs are gone, in one pass, as the release does.
    gone = set(dropped_inputs)
    dropped_sinks = [
        n for n in remaining if graph.nodes[n].desc.startswith("__getitem__") and not [d for d in succs_of[n] if d not in gone]
    ]
    gone |= set(dropped_sinks)
    node_ids = [n for n in remaining if n not in gone]
    if not node_ids:
        raise PipeDreamError("the layer graph has no layers besides its inputs; nothing to plan")
    index = {n: i for i, n in enumerate(node_ids)}
    out = [[index[d] for d in succs_of[n] if d in index] for n in node_ids]
    inn = [[index[s] for s in preds_of[n] if s in index] for n in node_ids]
    v = len(node_ids)
    order = [index[n] for n in graph.topological_order() if n in index]
    pred = [0] * v
    for x in order:
        for p in inn[x]:
            pred[x] |= pred[p] | (1 << p)
    succ = [0] * v
    for x in reversed(order):
        for c in out[x]:
            succ[x] |= succ[c] | (1 << c)
    out_mask = [sum(1 << c for c in out[x]) for x in range(v)]
    # Ancestors of a that feed a node outside a's ancestors (and other than a): the "extra" nodes that
    # a contributes to any augmented antichain it belongs to.
    feeds_beyond = [
        sum(1 << p for p in _bits(pred[a]) if out_mask[p] & ~(pred[a] | (1 << a))) for a in range(v)
    ]

    def augment(antichain: tuple[int, ...]) -> tuple[list[int], int]:
        """The augmented antichain in the release's order (extras first), and its bit mask."""
        extra = 0
        for a in antichain:
            extra |= feeds_beyond[a]
        return _bits(extra) + [a for a in antichain if not (extra >> a) & 1], extra | sum(1 << a for a in antichain)

    start = (next(x for x in range(v) if not inn[x]),)
    ids: dict[int, int] = {1 << start[0]: 0}  # antichain (as a bit mask) -> state id, in discovery order
    antichains: list[tuple[int, ...]] = [start]
    antichain_masks = [1 << start[0]]
    augmented: list[tuple[list[int], int]] = [augment(start)]
    edges: list[list[int]] = [[]]
    # Breadth-first: a state is expanded the first time it leaves the queue, which is in the order the
    # states were discovered, so the queue is the list of states itself.
    sid = -1
    while sid + 1 < len(antichains):
        sid += 1
        aug, aug_mask = augmented[sid]
        members = antichain_masks[sid]
        # The next antichain is the swapped list (x replaced by y) less its members with a successor in
        # it. A member e keeps no successor there iff its successors inside the list are at most {x}
        # and y is not one of them; y itself has none (checked below). So per state, group the members
        # by their successors inside the list: none (``free``), or exactly x (``only[x]``).
        free, only = 0, {}
        for e in aug:
            inside = succ[e] & aug_mask
            if not inside:
                free |= 1 << e
            elif not inside & (inside - 1):  # a single bit: e's only successor in the list
                only[inside] = only.get(inside, 0) | 1 << e
        for x in aug:
            x_bit = 1 << x
            keep_x = (free | only.get(x_bit, 0)) & ~x_bit
            for y in out[x]:
                if (members >> y) & 1 or succ[y] & aug_mask:
                    continue
                key = keep_x & ~pred[y] | 1 << y  # the next antichain as a mask
                if key not in ids:
                    # Its ordered form, as the release keeps it: the swapped list less the dropped members.
                    nxt = tuple(y if e == x else e for e in aug if e == x or (key >> e) & 1)
                    ids[key] = len(antichains)
                    antichains.append(nxt)
                    antichain_masks.append(key)
                    augmented.append(augment(nxt))
                    edges.append([])
                edges[sid].append(ids[key])
    topo = _dfs_topological(edges)
    n = len(topo)
    ideal_of = []
    for sid in range(len(antichains)):
        mask = 0
        for a in antichains[sid]:
            mask |= pred[a] | (1 << a)
        ideal_of.append(mask)
    nodes = [graph.nodes[n_id] for n_id in node_ids]
    time = np.array([nd.fwd_s + nd.bwd_s for nd in nodes])
    acts = np.array([nd.output_bytes for nd in nodes])
    params = np.array([nd.param_bytes for nd in nodes])
    ideals = [ideal_of[s] for s in topo]
    member = _unpack(ideals, v)
    boundary = np.array([acts[augmented[s][0]].sum() for s in topo])
    adjacency = np.zeros((v, v), dtype=np.float32)  # float: a BLAS product, exact for counts below 2**24
    for x in range(v):
        adjacency[x, out[x]] = 1
    feeds_out = (~member).astype(np.float32) @ adjacency.T > 0  # [s, b]: b has a consumer outside state s
    position = {s: i for i, s in enumerate(topo)}
    below = [0] * n  # per state (topological index), its descendants as a bit mask
    for s in reversed(topo):  # reverse topological: a state's descendants are done first
        i = position[s]
        for t in edges[s]:
            below[i] |= below[position[t]] | (1 << position[t])
    ancestors = _unpack(below, n)
    sizes = member.sum(axis=1)
    subset = _subset_matrix(member, [antichains[s] for s in topo])
    nested = subset & (sizes[:, None] < sizes[None, :])
    return StateGraph(
        node_ids=node_ids,
        dropped_inputs=dropped_inputs,
        dropped_sinks=dropped_sinks,
        ideals=ideals,
        antichains=[[node_ids[a] for a in antichains[s]] for s in topo],
        compute_s=member @ time,
        activation_bytes=member @ acts,
        param_bytes=member @ params,
        boundary_bytes=boundary,
        cut_bytes=(member & feeds_out) @ acts,
        ancestors=ancestors,
        nested=nested,
        edges=np.array([(position[s], position[t]) for s in topo for t in edges[s]], dtype=np.intp).reshape(-1, 2),
    )


def _unpack(masks: list[int], width: int) -> np.ndarray:
    """Boolean matrix ``[i, b]`` = bit ``b`` of ``masks[i]``, shape ``(len(masks), width)``."""
    nbytes = (width + 7) // 8
    packed = np.frombuffer(b"".join(m.to_bytes(nbytes, "little") for m in masks), dtype=np.uint8)
    return np.unpackbits(packed.reshape(len(masks), nbytes), axis=1, bitorder="little")[:, :width].astype(bool)


def _subset_matrix(member: np.ndarray, antichains: list[tuple[int, ...]]) -> np.ndarray:
    """``out[k, j]`` if ideal ``k`` is a subset of ideal ``j``, shape ``(n, n)``.

    Args:
        member: ``member[s, b]``: node ``b`` is in ideal ``s``, shape ``(n, v)``.
        antichains: per state, its antichain (node indices, non-empty); the ideal is its down-closure.
    An ideal is a down-set, so ideal ``k`` is inside ideal ``j`` iff every node of antichain ``k`` is:
    row ``k`` is the AND of those nodes' columns of ``member``, done on bits packed 8 states a byte.
    """
    n = member.shape[0]
    columns = np.packbits(member.T, axis=1)  # [b, states packed]
    flat = np.fromiter((a for ac in antichains for a in ac), dtype=np.intp)
    starts = np.cumsum([0] + [len(ac) for ac in antichains[:-1]])
    rows = np.bitwise_and.reduceat(columns[flat], starts, axis=0)
    return np.unpackbits(rows, axis=1, count=n).view(bool)


def _dfs_topological(edges: list[list[int]]) -> list[int]:
    """Reverse post-order of a depth-first search from state 0, successors in discovery order."""
    n = len(edges)
    seen = [False] * n
    post: list[int] = []
    for root in range(n):
        if seen[root]:
            continue
        seen[root] = True
        stack = [(root, iter(edges[root]))]
        while stack:
            node, it = stack[-1]
            for t in it:
                if not seen[t]:
                    seen[t] = True
                    stack.append((t, iter(edges[t])))
                    break
            else:
                stack.pop()
                post.append(node)
    return post[::-1]
