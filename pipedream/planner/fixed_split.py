"""A stage split for a given replica vector (e.g. the paper's "15-1" or "straight"), to simulate it.

The paper's Table 1 names the configuration PipeDream ran (``15-1``, ``straight``, ``16``) but not its
layer split. To simulate that configuration next to our planner's choice, the layers are cut into
contiguous pieces of one topological order (every prefix of a topological order is a valid first part,
so every such split respects the graph) by a min-max dynamic program over cut points. The throughput
model it minimises is the steady state of 1F1B-RR: a stage replicated ``r`` times does one minibatch per
``(compute + optimizer step + allreduce) / r`` seconds (paper §3.1's per-stage time and the step of
:class:`pipedream.costmodel.StepRates`, with copy on write where 1F1B stashes weights, and the allreduce of
:mod:`pipedream.sim.network`, affine in its bytes: latency plus bytes / bandwidth, :mod:`pipedream.costmodel`),
and the link between two stages carries the boundary activations one way
and their gradients the other way (full duplex), ``cut bytes / bandwidth`` per minibatch; the slowest
of these is the pipeline's period. The simulator then times the split exactly.
"""

from __future__ import annotations

import numpy as np

from pipedream import costmodel, memory
from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph
from pipedream.placement import replica_ranks
from pipedream.sim.network import Network


def replicas_of(config: str, workers: int) -> list[int]:
    """Replica counts of a paper config string: ``"15-1"``, ``"16"`` (data parallel), ``"straight"``.

    Raises:
        PipeDreamError: a malformed string or one that does not use exactly ``workers`` workers.
    """
    if config == "straight":
        return [1] * workers
    try:
        reps = [int(x) for x in config.split("-")]
    except ValueError:
        raise PipeDreamError(f"config {config!r} is not 'straight' or replica counts like '15-1'") from None
    if any(r < 1 for r in reps) or sum(reps) != workers:
        raise PipeDreamError(f"config {config!r} does not use exactly {workers} workers")
    return reps


def split_for_replicas(graph: LayerGraph, replicas: list[int], network: Network, samples: float,
                       stage_ranks: list[list[int]] | None = None, step: costmodel.StepRates | None = None,
                       ) -> list[list[str]]:
    """Node ids per stage for ``replicas`` (pipeline order) minimising the modelled period (seconds).

    Args:
        graph: the profile (``minibatch_size`` set).
        replicas: replica count per stage.
        network: the cluster's links (used for bandwidths and allreduce times only; nothing is booked).
        samples: samples per minibatch on one worker (scales times and activations).
        stage_ranks: ranks per stage (default :func:`pipedream.placement.replica_ranks` of the
            network's cluster).
        step: how each replica's optimizer step is priced (default :class:`pipedream.costmodel.StepRates`'s, the
            simulator's default).
    Raises:
        PipeDreamError: more stages than layers, or an unknown profiled minibatch size.
    """
    if graph.minibatch_size <= 0:
        raise PipeDreamError("the profile's minibatch size is unknown")
    ranks = stage_ranks or replica_ranks(replicas, network.cluster)
    scale = samples / graph.minibatch_size
    topo = graph.topological_order()
    order = [n for n in topo if not graph.nodes[n].is_input]
    k, n = len(replicas), len(order)
    if k > n:
        raise PipeDreamError(f"{k} stages but the profile has only {n} layers")
    pos = {nid: i + 1 for i, nid in enumerate(order)}  # position 1..n; inputs at 0 (always stage 0)
    for nid in topo:
        pos.setdefault(nid, 0)
    compute = np.concatenate([[0.0], np.cumsum([(graph.nodes[x].fwd_s + graph.nodes[x].bwd_s) * scale for x in order])])
    params = np.concatenate([[0.0], np.cumsum([graph.nodes[x].param_bytes for x in order])])
    tensors = np.concatenate([[0.0], np.cumsum([graph.tensors.get(x, 0) for x in order])])
    users = [(t.nbytes, np.concatenate([[0.0], np.cumsum([x in t.nodes for x in order])])) for t in graph.tied]

    def stage_sum(cumulative: np.ndarray, i: np.ndarray | int, j: np.ndarray | int, bytes_: bool) -> np.ndarray:
        """``cumulative`` over positions ``(i, j]``, a tied tensor once: its bytes (``bytes_``) or one tensor
        (:meth:`LayerGraph.param_bytes_of`, :meth:`LayerGraph.param_tensors_of`)."""
        total: np.ndarray = cumulative[j] - cumulative[i]  # an array: every caller passes an array for i or j
        for nbytes, u in users:
            total = total - (nbytes if bytes_ else 1.0) * np.maximum(u[j] - u[i] - 1.0, 0.0)
        return total

    def stage_params(i: np.ndarray | int, j: np.ndarray | int) -> np.ndarray:
        """Parameter bytes of positions ``(i, j]``, a tied tensor once."""
        return stage_sum(params, i, j, True)

    rates = step or costmodel.StepRates()
    copies = memory.copies_on_write("1f1b", replicas)

    def step_s(s: int, i: np.ndarray | int, j: np.ndarray | int) -> np.ndarray:
        """One optimizer step of a replica of stage ``s`` holding positions ``(i, j]``, seconds."""
        return rates.seconds_array(stage_params(i, j), stage_sum(tensors, i, j, False), copies[s])
    # cut[c]: bytes of outputs of nodes at positions <= c consumed at positions > c
    last_use = {nid: max((pos[d] for d in graph.successors(nid)), default=pos[nid]) for nid in topo}
    delta = np.zeros(n + 2)
    for nid in topo:
        if last_use[nid] > pos[nid]:
            delta[pos[nid]] += graph.nodes[nid].output_bytes * scale
            delta[last_use[nid]] -= graph.nodes[nid].output_bytes * scale
    cut = np.cumsum(delta)[: n + 1]
    # the allreduce is affine in its bytes (a latency per ring step plus bytes / bandwidth, pipedream.costmodel):
    # intercept and slope per stage, the intercept charged only to stages with parameters
    unit = 1e9
    ar_per_byte = [(network.allreduce_time(rs, 2 * unit) - network.allreduce_time(rs, unit)) / unit for rs in ranks]
    ar_fixed = [network.allreduce_time(rs, unit) - b * unit for rs, b in zip(ranks, ar_per_byte, strict=True)]

    def sync_s(s: int, nbytes: np.ndarray) -> np.ndarray:
        return np.where(nbytes > 0, ar_fixed[s] + ar_per_byte[s] * nbytes, 0.0)

    link_bw = [network.path(ranks[s][0], ranks[s + 1][0])[1] for s in range(k - 1)]
    best = np.full((k, n + 1), np.inf)
    back = np.zeros((k, n + 1), dtype=int)
    ends = np.arange(n + 1)
    best[0] = (compute + step_s(0, 0, ends) + sync_s(0, stage_params(0, ends))) / replicas[0]
    best[0][0] = np.inf
    for s in range(1, k):
        for j in range(s + 1, n + 1):
            i = np.arange(s, j)  # previous stage ends at i, this one is (i, j]
            stage = (compute[j] - compute[i] + step_s(s, i, j) + sync_s(s, stage_params(i, j))) / replicas[s]
            cand = np.maximum(np.maximum(best[s - 1][i], stage), cut[i] / link_bw[s - 1])
            t = int(np.argmin(cand))
            best[s][j], back[s][j] = cand[t], i[t]
    bounds = [n]  # end position of each stage
    for s in range(k - 1, 0, -1):
        bounds.insert(0, int(back[s][bounds[0]]))
    return [order[a:b] for a, b in zip([0, *bounds], bounds, strict=False)]
