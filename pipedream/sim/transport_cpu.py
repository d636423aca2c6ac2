"""The CPU the runtime's transport takes from a stage's ranks on a CPU host, added to their compute work.

On a CPU run the workers share the host's cores (:mod:`pipedream.sim.cores`), and every message a rank sends
or receives costs it CPU: issuing the gloo operation, the socket copies and wake-ups of gloo's threads. The
profiler measures one message end on the host as ``fixed_s + per_byte_s * bytes``
(:mod:`pipedream.runtime.message_cost`; ``meta.json`` ``host.message_s`` and ``host.message_s_per_byte``).
This module charges it where it costs the run time:

* activations and gradients (:mod:`pipedream.runtime.comm`): a forward of stage ``s`` receives its input
  (``s > 0``) and sends its output (all but the last stage), a backward receives its output's gradient and
  sends its input's; each is one message end of the boundary's bytes;
* the gradient allreduce, done by gloo's threads, not the rank's: what one allreduce of ``nbytes`` over ``n``
  replicas costs each member as the profile measured it on this host (:mod:`pipedream.runtime.allreduce_cost`,
  ``fixed_s + per_byte_s * nbytes`` per member count, :func:`measured_allreduce_cpu_s`), or, for a profile without
  that measurement, an estimate from the message cost: a ring (reduce-scatter, then all-gather: ``2 (n - 1)`` steps,
  each sending one ``1/n`` chunk of the bucket and receiving another) as ``4 (n - 1)`` message ends of
  ``nbytes / n`` bytes (:func:`allreduce_cpu_s`), which read 3.4-6.2x what gloo spends on a 1 MiB bucket over 4 processes on
  the 2-core CI VM. Where that CPU lands decides what it costs. A bucket launched while the backward goes on (every
  bucket but the last, which holds the first layers' gradients and is launched as the backward ends) is reduced once
  the last replica has launched it, beside that replica's backward and whatever else computes: its CPU competes with
  the compute, and :func:`with_transport_cpu` adds it to the backward of each replica (``bwd_s``; the later buckets'
  ready times move by it) and marks it so (``StageCost.buckets_cpu_in_bwd``). The last bucket is reduced while the
  ranks wait for the link (:mod:`pipedream.runtime.buckets`): the simulator runs its CPU beside the ranks' actions
  as background work that takes a share of the host's cores from the bucket's start
  (:class:`pipedream.sim.cores.Cores` ``collective_cpu``): in a pipeline it slows the other stages, in DP, whose
  ranks all wait for the link together, mostly nothing. (Charged to the step after the allreduce, as a first version
  of this model did, every bucket's CPU made every DP prediction 10-30% too slow, AlexNet DP 0.72
  measured/predicted. Run as background from the last replica's arrival at its allreduce, as the second did, the
  early buckets' CPU landed in the link's wait as well, where it costs nothing: the reduced AlexNet's DP run on the
  2-core CI VM, 2026-11-30, whose first bucket, 1 MiB, is launched a millisecond into the backward, spent 11 ms of
  gloo threads' CPU a step on each rank, and the last replica launched its last bucket 74-92 ms after the link had
  freed the replicas, where the four main threads' CPU, 33.5 ms a step each on 2 cores, fills 67 ms.) Measured on
  the 2-core CI machine: the replicated stage of VGG-16's 3-1 pipeline spent 0.18 s of CPU outside its forwards and
  backwards per epoch where the transport of its activations predicted 0.08 s, S2VT's four replicas 0.29 s where
  0.09 s (``compute_cpu_s_stage<s>`` against ``cpu_s_stage<s>``).

On GPUs (no shared cores) nothing is charged: the prediction's compute is the GPU's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from pipedream.sim.costs import StageCost


def message_end_s(nbytes: float, fixed_s: float, per_byte_s: float) -> float:
    """CPU seconds one end of one message of ``nbytes`` bytes costs its rank."""
    return fixed_s + per_byte_s * nbytes


def allreduce_cpu_s(replicas: int, nbytes: float, fixed_s: float, per_byte_s: float) -> float:
    """CPU seconds each of ``replicas`` ranks spends on a ring allreduce of ``nbytes`` bytes: ``4 (n - 1)``
    message ends of ``nbytes / n`` bytes (module docstring); 0 for a single rank.

    >>> allreduce_cpu_s(4, 4e6, 1e-4, 1e-9)  # 12 ends of 1 MB: 12 * (100 us + 1 ms)
    0.0132
    """
    if replicas < 2:
        return 0.0
    return 4 * (replicas - 1) * message_end_s(nbytes / replicas, fixed_s, per_byte_s)


def measured_allreduce_cpu_s(table: Mapping[int, tuple[float, float]], replicas: int, nbytes: float) -> float:
    """CPU seconds each of ``replicas`` ranks spends on one gloo allreduce of ``nbytes`` bytes, from the profile's
    measurement (``table``: member count -> ``(fixed_s, per_byte_s)``, :mod:`pipedream.runtime.allreduce_cost`);
    0 for a single rank. A count the table lacks takes the nearest measured one (the largest below it, else the
    smallest above), scaled as a ring scales: the fixed part with the steps, ``(n - 1) / (m - 1)``, the bytes with
    what each member sends, ``((n - 1) / n) / ((m - 1) / m)``.

    >>> measured_allreduce_cpu_s({2: (1e-3, 1e-9), 4: (2e-3, 5e-10)}, 4, 4e6)  # 2 ms + 4 MB at 0.5 ns
    0.004
    >>> round(measured_allreduce_cpu_s({4: (3e-3, 6e-10)}, 8, 1e6), 6)  # 3 ms x 7/3 + 0.6 ms x (7/8) / (3/4)
    0.0077

    Raises:
        ValueError: an empty table.
    """
    if replicas < 2:
        return 0.0
    if not table:
        raise ValueError("no measured allreduce: the table is empty")
    below = [m for m in table if m <= replicas]
    m = max(below) if below else min(table)
    fixed_s, per_byte_s = table[m]
    steps = (replicas - 1) / (m - 1)
    sent = ((replicas - 1) / replicas) / ((m - 1) / m)
    return fixed_s * steps + per_byte_s * nbytes * sent


def allreduce_cpu_of(table: Mapping[int, tuple[float, float]] | None, fixed_s: float,
                     per_byte_s: float) -> Callable[[int, float], float] | None:
    """What a prediction charges each member of one allreduce, as ``(members, bytes) -> CPU seconds``: the
    profile's measurement where it has one (``table``, :func:`measured_allreduce_cpu_s`), else the estimate from
    the message cost (``fixed_s``, ``per_byte_s``: :func:`allreduce_cpu_s`); None where neither was measured
    (another host, GPUs): the collectives cost no CPU."""
    if table:
        return lambda members, nbytes: measured_allreduce_cpu_s(table, members, nbytes)
    if fixed_s > 0 or per_byte_s > 0:
        return lambda members, nbytes: allreduce_cpu_s(members, nbytes, fixed_s, per_byte_s)
    return None


def with_transport_cpu(costs: list[StageCost], fixed_s: float, per_byte_s: float,
                       replicas: Sequence[int] | None = None,
                       allreduce_cpu: Callable[[int, float], float] | None = None) -> list[StageCost]:
    """``costs`` (one per stage, in order; DP: one stage) with each forward and backward lengthened by the
    transport CPU its rank spends on activations and gradients, and each backward of a replicated stage by the
    CPU of the allreduces of the buckets launched while it goes on (module docstring).

    A stage's sent activation is ``send_fwd_bytes`` and its sent input gradient ``send_bwd_bytes``; what it
    receives is its neighbour's. With ``replicas`` (one count per stage), a stage of ``n >= 2`` replicas and
    buckets ``0 .. K`` pays ``allreduce_cpu(n, bytes_k)`` of every bucket ``k < K`` in its backward; bucket
    ``j``'s ready time moves by the CPU of the buckets before it, and ``buckets_cpu_in_bwd`` says ``K`` of them
    are paid (the simulator runs only the last one's CPU as background work). ``allreduce_cpu``: CPU seconds per
    member of one allreduce of ``(members, bytes)`` (:func:`measured_allreduce_cpu_s` on the profile's
    measurement); None: the estimate from the message cost, :func:`allreduce_cpu_s`. Without a message cost (both
    0) and without ``allreduce_cpu``, ``costs`` come back unchanged.

    Raises:
        ValueError: ``replicas`` not one count per stage.
    """
    if fixed_s <= 0 and per_byte_s <= 0 and allreduce_cpu is None:
        return costs
    if replicas is not None and len(replicas) != len(costs):
        raise ValueError(f"replicas must be one count per stage ({len(costs)}), got {list(replicas)}")

    def end(nbytes: float) -> float:
        return message_end_s(nbytes, fixed_s, per_byte_s)

    def reduce_s(members: int, nbytes: float) -> float:
        return (allreduce_cpu(members, nbytes) if allreduce_cpu is not None
                else allreduce_cpu_s(members, nbytes, fixed_s, per_byte_s))

    out = []
    last = len(costs) - 1
    for s, c in enumerate(costs):
        fwd = (end(costs[s - 1].send_fwd_bytes) if s > 0 else 0.0) + (end(c.send_fwd_bytes) if s < last else 0.0)
        bwd = (end(costs[s + 1].send_bwd_bytes) if s < last else 0.0) + (end(c.send_bwd_bytes) if s > 0 else 0.0)
        n = replicas[s] if replicas is not None else 1
        paid = max(len(c.buckets) - 1, 0) if n >= 2 else 0  # the buckets launched while the backward goes on
        buckets, overlapped = [], 0.0  # each bucket's ready time after the CPU of the buckets before it
        for k, (ready_s, nbytes) in enumerate(c.buckets):
            buckets.append((ready_s + overlapped, nbytes))
            if k < paid:
                overlapped += reduce_s(n, nbytes)
        out.append(dataclasses.replace(c, fwd_s=c.fwd_s + fwd, bwd_s=c.bwd_s + bwd + overlapped, buckets=buckets,
                                       buckets_cpu_in_bwd=paid))
    return out
