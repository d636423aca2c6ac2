"""The CPU the runtime's transport takes from a stage's ranks on a CPU host, added to their compute work.

On a CPU run the workers share the host's cores (:mod:`pipedream.sim.cores`), and every message a rank sends
or receives costs it CPU: issuing the gloo operation, the socket copies and wake-ups of gloo's threads. The
profiler measures one message end on the host as ``fixed_s + per_byte_s * bytes``
(:mod:`pipedream.runtime.message_cost`; ``meta.json`` ``host.message_s`` and ``host.message_s_per_byte``).
This module charges it where the runtime spends it:

* activations and gradients (:mod:`pipedream.runtime.comm`): a forward of stage ``s`` receives its input
  (``s > 0``) and sends its output (all but the last stage), a backward receives its output's gradient and
  sends its input's; each is one message end of the boundary's bytes;
* gradient allreduce over ``r`` replicas (:mod:`pipedream.runtime.buckets`, DDP): gloo's ring sends and
  receives ``2 (r - 1)`` chunks of ``1 / r`` of each bucket (reduce-scatter, then all-gather), so
  ``4 (r - 1)`` message ends of ``bucket / r`` bytes per bucket, charged to the step that follows it.

On GPUs (no shared cores) nothing is charged: the prediction's compute is the GPU's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from pipedream.sim.costs import StageCost


def message_end_s(nbytes: float, fixed_s: float, per_byte_s: float) -> float:
    """CPU seconds one end of one message of ``nbytes`` bytes costs its rank; 0 for no message (``nbytes`` < 0)."""
    return fixed_s + per_byte_s * nbytes if nbytes >= 0 else 0.0


def allreduce_cpu_s(bucket_bytes: Sequence[float], replicas: int, fixed_s: float, per_byte_s: float) -> float:
    """CPU seconds one rank spends in the ring allreduces of ``bucket_bytes`` over ``replicas`` ranks:
    ``sum_b 4 (r - 1) (fixed_s + per_byte_s * b / r)`` (module docstring); 0 for one replica."""
    if replicas < 2:
        return 0.0
    return sum(4 * (replicas - 1) * message_end_s(b / replicas, fixed_s, per_byte_s) for b in bucket_bytes)


def with_transport_cpu(costs: list[StageCost], replicas: Sequence[int], fixed_s: float,
                       per_byte_s: float) -> list[StageCost]:
    """``costs`` (one per stage, in order; DP: one stage) with each forward, backward and optimizer step
    lengthened by the transport CPU its rank spends (module docstring). ``replicas``: per stage.

    A stage's sent activation is ``send_fwd_bytes`` and its sent input gradient ``send_bwd_bytes``; what it
    receives is its neighbour's. Without a measured cost (both 0) ``costs`` come back unchanged.
    """
    if fixed_s <= 0 and per_byte_s <= 0:
        return costs
    out = []
    last = len(costs) - 1
    for s, c in enumerate(costs):
        def end(nbytes: float) -> float:
            return message_end_s(nbytes, fixed_s, per_byte_s)

        fwd = (end(costs[s - 1].send_fwd_bytes) if s > 0 else 0.0) + (end(c.send_fwd_bytes) if s < last else 0.0)
        bwd = (end(costs[s + 1].send_bwd_bytes) if s < last else 0.0) + (end(c.send_bwd_bytes) if s > 0 else 0.0)
        reduce = allreduce_cpu_s([b for _, b in c.buckets] or [c.param_bytes], replicas[s], fixed_s, per_byte_s)
        out.append(dataclasses.replace(c, fwd_s=c.fwd_s + fwd, bwd_s=c.bwd_s + bwd, step_s=c.step_s + reduce))
    return out
