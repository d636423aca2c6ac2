"""Where each stage's replicas run: the one placement that the plan records and the runtime and the
simulator both run (docs/design.md, "One fact, one place").

A stage's ranks are stored in round-robin order: replica ``i`` (``ranks[i]``) takes the minibatches ``m``
with ``m % replicas == i`` (:meth:`pipedream.schedules.Schedule.rank_of`). Two rules produce them:

* :func:`hierarchical_ranks`, for the dynamic program's plans: a stage replicated over ``r`` groups at a
  level takes the same positions inside each of those groups (the release's stage-to-rank map, paper
  §3.1: the algorithm is applied recursively, a whole lower-level group acting as one worker), its ranks
  then :func:`interleave`-d across the outermost groups (servers);
* :func:`replica_ranks`, for a replica vector without a split from the dynamic program (the fixed splits
  of the re-ranking, hand-made plans): the largest number ``g`` of identical copies of the pipeline that
  the servers and every stage's replica count allow (``g = gcd(servers, replicas...)``), each copy on
  ``servers / g`` whole servers with its stages on consecutive ranks, interleaved across the copies. With
  ``g = servers`` (e.g. 8-4-4 on 4 servers of 4) every stage boundary stays inside a server, as the
  hierarchical plan of the same shape; with ``g = 1`` (15-1 on 16 GPUs) it is consecutive ranks: stages
  packed in pipeline order, the fewest boundaries across servers (also the rule for a plan on fewer
  workers than the cluster has).

With either order, minibatch ``m`` of two stages whose replica counts divide each other lands on the
same server in both. A single stage (data parallelism) has no boundary to keep inside a server: its ranks
are ``0 .. workers - 1`` in order.

Ranks onto hosts: torchrun starts ``workers / nnodes`` processes on each node and numbers ranks node by node
(:func:`ranks_per_host`, :func:`host_of`); the launcher starts them so and the simulator's host model
(:mod:`pipedream.sim.cores`) shares a host's cores among the same ranks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pipedream.errors import PipeDreamError
from pipedream.topology import Cluster


def ranks_per_host(workers: int, nnodes: int) -> int:
    """Ranks on each of ``nnodes`` hosts when torchrun starts ``workers`` ranks: ``workers / nnodes``.

    Raises:
        PipeDreamError: ``nnodes`` below 1, or ``workers`` not a multiple of it (torchrun starts as many on each).
    """
    if nnodes < 1 or workers % nnodes:
        raise PipeDreamError(f"{workers} workers do not split evenly over {nnodes} nodes; use a multiple of the nodes")
    return workers // nnodes


def host_of(rank: int, per_host: int) -> int:
    """The host of ``rank`` when each host runs ``per_host`` ranks: torchrun numbers them host by host,
    ``rank // per_host``."""
    return rank // per_host


def server_size(cluster: Cluster) -> int:
    """Ranks in one outermost-level group (a server): the product of the inner levels' worker counts."""
    return math.prod(w for w, _ in cluster.levels[:-1])


def interleave(ranks: Sequence[int], group: int) -> list[int]:
    """Order ranks for round robin so consecutive minibatches alternate between groups of ``group`` ranks.

    The ``k``-th rank of every group comes before the ``k + 1``-th of any:
    ``interleave([0, 1, 2, 4, 5, 6], 4) == [0, 4, 1, 5, 2, 6]``.
    """
    seen: dict[int, int] = {}
    keyed = []
    for r in sorted(ranks):
        k = seen.get(r // group, 0)
        seen[r // group] = k + 1
        keyed.append(((k, r // group), r))
    return [r for _, r in sorted(keyed)]


def hierarchical_ranks(per_level: Sequence[Sequence[int]], offsets: Sequence[Sequence[int]],
                       cluster: Cluster) -> list[list[int]]:
    """Ranks of each stage of a hierarchical plan, in round-robin order.

    Args:
        per_level: per stage, its replicas at each level, innermost first (``Segment.per_level``).
        offsets: per stage, the position (in groups) of its first replica inside its parent group, per
            level (``Segment.offsets``).
        cluster: the cluster the plan was solved for.
    Returns:
        per stage, its ranks :func:`interleave`-d across servers.
    """
    devices = [math.prod(w for w, _ in cluster.levels[:lv]) for lv in range(len(cluster.levels))]
    out = []
    for reps, offs in zip(per_level, offsets, strict=True):
        ranks = [0]
        for lv, (r, off) in enumerate(zip(reps, offs, strict=True)):
            ranks = [x + (off + t) * devices[lv] for x in ranks for t in range(r)]
        out.append(interleave(ranks, server_size(cluster) if len(per_level) > 1 else max(ranks) + 1))
    return out


def replica_ranks(replicas: Sequence[int], cluster: Cluster | None = None) -> list[list[int]]:
    """Ranks of each stage for a replica vector, in round-robin order (the module's second rule).

    ``g = gcd(servers, *replicas)`` copies of the pipeline, copy ``c`` on ranks ``c W / g .. (c + 1) W / g - 1``
    (``W = sum(replicas)``) with its stages on consecutive ranks; a stage's ranks are then ordered copy by
    copy (:func:`interleave`). Without a cluster, with one level, or on fewer workers than the cluster has,
    consecutive ranks:
    ``replica_ranks([15, 1]) == [[0, ..., 14], [15]]``;
    ``replica_ranks([8, 4, 4], 4x4) == [[0, 4, 8, 12, 1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]``.
    """
    workers = sum(replicas)
    whole = cluster is not None and len(cluster.levels) > 1 and cluster.workers == workers
    servers = cluster.levels[-1][0] if cluster is not None and whole else 0
    copies = math.gcd(servers, *replicas) if servers and len(replicas) > 1 else 1
    width = workers // copies
    out: list[list[int]] = []
    first = 0
    for r in replicas:
        per_copy = r // copies
        ranks = [c * width + first + k for c in range(copies) for k in range(per_copy)]
        out.append(interleave(ranks, width))
        first += per_copy
    return out
