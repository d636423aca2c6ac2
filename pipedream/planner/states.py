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

import functools
import operator
from dataclasses import dataclass

import numpy as np

from pipedream.cuts import crossing
from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph
from pipedream.planner.bits import pack_rows, unit_rows, unpack_rows


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
        compute_s: per state, forward+backward seconds of its ideal, cumulative.
        activation_bytes: per state, summed output bytes of its ideal, cumulative.
        param_bytes: per state, summed parameter bytes of its ideal, cumulative (a tied tensor once per user).
        param_tensors: per state, summed parameter tensors of its ideal (:attr:`LayerGraph.tensors`; 0 for a node
            without a record), cumulative (a tied tensor once per user, like ``param_bytes``).
        tied_users: per tied tensor of the graph (:attr:`LayerGraph.tied`) and state, how many of its users the
            ideal holds, shape ``(T, n)``: a segment between two states holds ``U_j - U_k`` of them and counts
            the tensor that many times in ``P_j - P_k``, once too often for each beyond the first.
        tied_bytes: bytes of each tied tensor, shape ``(T,)``.
        boundary_bytes: per state, output bytes of its augmented antichain (release semantics).
        cut_bytes: per state, output bytes of the ideal's nodes that feed a node outside it
            (:func:`pipedream.cuts.crossing`, the definition the simulator's stage boundaries use too).
        ancestors: boolean matrix, ``ancestors[k, j]`` if state ``k`` precedes state ``j`` in the state DAG.
        nested: boolean matrix, ``nested[k, j]`` if ideal ``k`` is a proper subset of ideal ``j``.
        edges: the state DAG's edges ``(k, j)``, ``j`` a direct successor of ``k`` (an edge may repeat), shape ``(E, 2)``
            (``ancestors`` is their transitive closure).
    """

    node_ids: list[str]
    dropped_inputs: list[str]
    dropped_sinks: list[str]
    ideals: list[int]
    compute_s: np.ndarray
    activation_bytes: np.ndarray
    param_bytes: np.ndarray
    boundary_bytes: np.ndarray
    cut_bytes: np.ndarray
    ancestors: np.ndarray
    nested: np.ndarray
    edges: np.ndarray
    tied_users: np.ndarray
    tied_bytes: np.ndarray
    param_tensors: np.ndarray

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
    dropped_sinks = [n for n in remaining
                     if graph.nodes[n].desc.startswith("__getitem__") and not [d for d in succs_of[n] if d not in gone]]
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
    feeds_beyond = [sum(1 << p for p in _bits(pred[a]) if out_mask[p] & ~(pred[a] | (1 << a))) for a in range(v)]

    bit = [1 << x for x in range(v)]
    consumers = [[(y, bit[y], succ[y], ~pred[y]) for y in out[x]] for x in range(v)]

    def augment(antichain: tuple[int, ...], mask: int) -> tuple[list[int], int]:
        """The augmented antichain in the release's order (extras first) and its bit mask, given the
        antichain and its mask."""
        extra = 0
        for a in antichain:
            extra |= feeds_beyond[a]
        return _bits(extra) + [a for a in antichain if not extra & bit[a]], extra | mask

    start = next(x for x in range(v) if not inn[x])
    ids: dict[int, int] = {bit[start]: 0}  # antichain (as a bit mask) -> state id, in discovery order
    antichains: list[tuple[int, ...]] = [(start,)]
    antichain_masks = [bit[start]]
    augmented: list[tuple[list[int], int]] = [augment((start,), bit[start])]
    edges: list[list[int]] = []
    # Breadth-first: a state is expanded the first time it leaves the queue, which is in the order the
    # states were discovered, so the queue is the list of states itself (it grows while we iterate).
    for sid, (aug, aug_mask) in enumerate(augmented):
        members = antichain_masks[sid]
        successors: list[int] = []
        edges.append(successors)
        # The next antichain is the swapped list (x replaced by y) less its members with a successor in
        # it. A member e keeps no successor there iff its successors inside the list are at most {x}
        # and y is not one of them; y itself has none (checked below). So per state, group the members
        # by their successors inside the list: none (``free``), or exactly x (``only[x]``).
        free = 0
        only: dict[int, int] = {}
        for e in aug:
            inside = succ[e] & aug_mask
            if not inside:
                free |= bit[e]
            elif not inside & (inside - 1):  # a single bit: e's only successor in the list
                only[inside] = only.get(inside, 0) | bit[e]
        for x in aug:
            x_bit = bit[x]
            keep_x = (free | only.get(x_bit, 0)) & ~x_bit
            for y, y_bit, y_succ, y_not_pred in consumers[x]:
                if members & y_bit or aug_mask & y_succ:
                    continue
                key = keep_x & y_not_pred | y_bit  # the next antichain as a mask
                t = ids.get(key)
                if t is None:
                    t = ids[key] = len(antichains)
                    # Its ordered form, as the release keeps it: the swapped list less the dropped members.
                    nxt = tuple(y if e == x else e for e in aug if e == x or key & bit[e])
                    antichains.append(nxt)
                    antichain_masks.append(key)
                    augmented.append(augment(nxt, key))
                successors.append(t)
    topo = _dfs_topological(edges)
    ideal_of = [functools.reduce(operator.or_, (pred[a] | (1 << a) for a in chain), 0) for chain in antichains]
    nodes = [graph.nodes[n_id] for n_id in node_ids]
    time = np.array([nd.fwd_s + nd.bwd_s for nd in nodes])
    acts = np.array([nd.output_bytes for nd in nodes])
    params = np.array([nd.param_bytes for nd in nodes])
    tensors = np.array([float(graph.tensors.get(n_id, 0)) for n_id in node_ids])
    ideals = [ideal_of[s] for s in topo]
    member = _unpack(ideals, v)
    boundary = _row_sums(acts, [augmented[s][0] for s in topo])
    n = len(topo)
    columns = pack_rows(member.T)  # [b, the states containing node b], packed
    edge_array = _edge_array(edges, topo)
    ancestors = _descendants(edge_array, member.sum(axis=1))
    # An ideal is a down-set: ideal k is inside ideal j iff every node of antichain k is. Distinct states
    # have distinct ideals (an ideal's maximal nodes are the state's antichain), so a subset that is not
    # the state itself is a proper one.
    nested = _contain_all(columns, [antichains[s] for s in topo], n)
    np.fill_diagonal(nested, False)
    uses = np.array([[nid in t.nodes for t in graph.tied] for nid in node_ids], dtype=float).reshape(v, len(graph.tied))
    return StateGraph(node_ids=node_ids, dropped_inputs=dropped_inputs, dropped_sinks=dropped_sinks, ideals=ideals,
                      compute_s=member @ time, activation_bytes=member @ acts, param_bytes=member @ params,
                      boundary_bytes=boundary,
                      cut_bytes=crossing(member, out) @ acts, ancestors=ancestors, nested=nested, edges=edge_array,
                      tied_users=(member @ uses).T, tied_bytes=np.array([t.nbytes for t in graph.tied], dtype=float),
                      param_tensors=member @ tensors)


def _edge_array(edges: list[list[int]], topo: list[int]) -> np.ndarray:
    """The state DAG's edges in topological indices, shape ``(E, 2)``: ``edges`` lists successors by
    discovery id, ``topo`` the discovery ids in topological order."""
    position = np.empty(len(topo), dtype=np.intp)
    position[topo] = np.arange(len(topo))
    counts = [len(edges[s]) for s in topo]
    targets = np.fromiter((t for s in topo for t in edges[s]), dtype=np.intp, count=sum(counts))
    return np.stack([np.repeat(np.arange(len(topo)), counts), position[targets]], axis=1)


def _row_sums(values: np.ndarray, index_lists: list[list[int]]) -> np.ndarray:
    """``values[index_lists[i]].sum()`` for every ``i``, shape ``(len(index_lists),)``; lists of one length
    are summed as the rows of one matrix, which numpy adds in the same order as each row alone."""
    out = np.empty(len(index_lists))
    by_length: dict[int, list[int]] = {}
    for i, idx in enumerate(index_lists):
        by_length.setdefault(len(idx), []).append(i)
    for length, rows in by_length.items():
        out[rows] = values[np.array([index_lists[i] for i in rows], dtype=np.intp).reshape(len(rows), length)].sum(axis=1)
    return out


def _descendants(edges: np.ndarray, ideal_sizes: np.ndarray) -> np.ndarray:
    """``out[k, j]``: state ``j`` is reachable from state ``k`` along ``edges`` ``(E, 2)``, shape ``(n, n)``.

    Every edge adds nodes to the ideal, so going down by ideal size (``ideal_sizes``, nodes per state), a
    state's successors are complete before it: what it reaches is the OR over its edges of what each
    successor reaches, itself included; one ``reduceat`` on packed rows per ideal size.
    """
    n = len(ideal_sizes)
    itself = unit_rows(n)
    reach = itself.copy()  # reachable from the row's state, itself included
    src, dst = edges[:, 0], edges[:, 1]
    if not len(src):
        return np.zeros((n, n), dtype=bool)
    order = np.lexsort((src, -ideal_sizes[src]))  # largest ideals first, then by source
    src, dst = src[order], dst[order]
    heads = np.flatnonzero(np.r_[True, src[1:] != src[:-1]])  # each source's first edge
    size_starts = heads[np.r_[True, ideal_sizes[src[heads[1:]]] != ideal_sizes[src[heads[:-1]]]]]
    bounds = np.r_[size_starts, len(src)]
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        starts = heads[(heads >= lo) & (heads < hi)]
        reach[src[starts]] |= np.bitwise_or.reduceat(reach[dst[lo:hi]], starts - lo, axis=0)
    return unpack_rows(reach & ~itself, n)


def _unpack(masks: list[int], width: int) -> np.ndarray:
    """Boolean matrix ``[i, b]`` = bit ``b`` of ``masks[i]``, shape ``(len(masks), width)``."""
    nbytes = (width + 7) // 8
    packed = np.frombuffer(b"".join(m.to_bytes(nbytes, "little") for m in masks), dtype=np.uint8)
    return np.unpackbits(packed.reshape(len(masks), nbytes), axis=1, bitorder="little")[:, :width].astype(bool)


def _contain_all(columns: np.ndarray, groups: list[list[int]] | list[tuple[int, ...]], n: int) -> np.ndarray:
    """``out[g, s]``: state ``s`` contains every node of ``groups[g]`` (``True`` for an empty group), shape
    ``(len(groups), n)``.

    Args:
        columns: per node, the states that contain it, packed (:func:`pack_rows` of the transposed
            membership matrix), shape ``(v, words)``.
        groups: node indices.
        n: number of states.
    """
    words = np.full((len(groups), columns.shape[1]), np.iinfo(np.uint64).max, dtype=np.uint64)
    filled = [g for g, nodes in enumerate(groups) if nodes]
    if filled:
        flat = np.fromiter((b for g in filled for b in groups[g]), dtype=np.intp)
        starts = np.cumsum([0] + [len(groups[g]) for g in filled[:-1]])
        words[filled] = np.bitwise_and.reduceat(columns[flat], starts, axis=0)
    return unpack_rows(words, n)


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
