"""What each action of a schedule costs, from a layer-graph profile (paper §3.1's profile: T_l, a_l, w_l).

Compute scales linearly with the number of samples an action processes (the profile is per profiled
minibatch, as in the release optimizer). Input nodes carry data-loading time, which is ignored, as the
planners do. The activations crossing the boundary after stage ``s`` are the outputs of every node in
stages ``<= s`` with a consumer in stages ``> s`` (skip connections included); the gradient sent back
has the same size, minus the outputs of input nodes (data needs no gradient).

A stage's weight update is what PyTorch DistributedDataParallel and the runtime do: the stage's layers with
parameters, in reverse topological order (the order its backward produces their gradients), are grouped
into gradient buckets by :func:`pipedream.costmodel.bucket_layers` (cap ``bucket_bytes``, DDP's 25 MiB by
default, the first bucket 1 MiB); a bucket is ready when the backward of its last layer ends, and each
bucket is one allreduce. The optimizer step over the stage's parameters takes
:func:`pipedream.costmodel.optimizer_step_s`.

A tied tensor (:mod:`pipedream.tied`) counts once in a stage that holds several of its users, its gradient
complete when the backward of its first user in the stage's order ends; several stages holding it each count it,
and sum its gradients before every step (:attr:`StageCost.tied_sums`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from pipedream import costmodel, tied
from pipedream.cuts import crossing
from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph, split_fallback


@dataclass
class StageCost:
    """Costs of one stage for one action of ``samples`` samples.

    Attributes:
        fwd_s: forward time of one (micro)batch on one worker, seconds.
        bwd_s: backward time of one (micro)batch on one worker, seconds.
        send_fwd_bytes: activation bytes sent to the next stage per (micro)batch (0 for the last stage).
        send_bwd_bytes: gradient bytes sent to the previous stage per (micro)batch (0 for the first stage).
        param_bytes: parameter bytes of the stage (what its allreduces move together).
        buckets: DDP gradient buckets in reduction order, each ``(seconds into the backward when its last
            gradient is ready, bucket bytes)``; the bytes sum to ``param_bytes``. One allreduce per bucket.
        step_s: seconds of one optimizer step over the stage's parameters on one worker.
        tied_sums: the gradient sums of tied tensors this stage holds with other stages, each ``(the holding
            stages, bytes)``: before each ``STEP`` one collective of those bytes over every rank of those stages
            (:func:`pipedream.tied.gradient_sums`, as :class:`pipedream.runtime.shared.SharedGrads` runs it).
        input_grad_s, weight_grad_s: the two halves of a backward a zero-bubble schedule runs apart (``I`` and
            ``W``, seconds; :meth:`pipedream.graph.LayerGraph.backward_split`); None: split by
            :func:`pipedream.graph.split_fallback` as one layer with weights when ``param_bytes`` > 0.
    """

    fwd_s: float
    bwd_s: float
    send_fwd_bytes: float
    send_bwd_bytes: float
    param_bytes: float
    buckets: list[tuple[float, float]] = field(default_factory=list)
    step_s: float = 0.0
    tied_sums: list[tuple[tuple[int, ...], float]] = field(default_factory=list)
    input_grad_s: float | None = None
    weight_grad_s: float | None = None

    @property
    def split_s(self) -> tuple[float, float]:
        """``(I, W)`` seconds of one (micro)batch: the given halves, else :func:`pipedream.graph.split_fallback`."""
        if self.input_grad_s is not None and self.weight_grad_s is not None:
            return self.input_grad_s, self.weight_grad_s
        return split_fallback(self.bwd_s, self.param_bytes > 0)


def assign_stages(graph: LayerGraph, stage_nodes: list[list[str]]) -> dict[str, int]:
    """Node id -> stage index; nodes a plan leaves out go to stage 0 (inputs) or their latest producer's stage.

    Raises:
        PipeDreamError: a plan names an unknown node, names a node twice, or a node lands before its producer.
    """
    where: dict[str, int] = {}
    for s, nodes in enumerate(stage_nodes):
        for n in nodes:
            if n not in graph.nodes:
                raise PipeDreamError(f"plan stage {s} names node {n!r}, which the profile does not have; "
                                     "was the plan made from this profile?")
            if n in where:
                raise PipeDreamError(f"plan puts node {n!r} in stages {where[n]} and {s}")
            where[n] = s
    for n in graph.topological_order():
        if n not in where:
            preds = [where[p] for p in graph.predecessors(n) if p in where]
            where[n] = max(preds) if preds else 0
    for src, dst in graph.edges:
        if where[dst] < where[src]:
            raise PipeDreamError(f"plan puts node {dst!r} (stage {where[dst]}) before its producer {src!r} "
                                 f"(stage {where[src]}); stages must follow the graph's order")
    return where


def _tied_again(graph: LayerGraph, nodes: list[str]) -> dict[str, float]:
    """Per node of a stage (ids in the stage's order), the bytes of its ``param_bytes`` that are tied tensors an
    earlier node of the stage also uses: the tensor is counted at its first user, whose backward completes its
    gradient."""
    again: dict[str, float] = {}
    for t in graph.tied:
        for n in [n for n in nodes if n in t.nodes][1:]:
            again[n] = again.get(n, 0.0) + t.nbytes
    return again


def buckets_in_backward(grads: list[tuple[float, float]], bucket_bytes: float) -> list[tuple[float, float]]:
    """DDP buckets of gradients listed in backward order.

    Args:
        grads: ``(seconds into the backward when ready, bytes)`` per layer (or tensor) in the order the
            backward produces them.
        bucket_bytes: bucket cap, bytes (:func:`pipedream.costmodel.bucket_layers`).
    Returns:
        ``(seconds into the backward when the bucket's last gradient is ready, bucket bytes)`` per bucket,
        in reduction order.
    Raises:
        PipeDreamError: a non-positive cap.
    """
    try:
        groups = costmodel.bucket_layers([nbytes for _, nbytes in grads], bucket_bytes)
    except ValueError as e:
        raise PipeDreamError(f"{e}; pass a positive --bucket-bytes (DDP's default is 25 MiB)") from None
    return [(grads[idx[-1]][0], sum(grads[i][1] for i in idx)) for idx in groups]


def optimizer_step(param_bytes: float, step: costmodel.StepRates, copy_on_write: bool = False,
                   tensors: int = 0) -> float:
    """Seconds of one optimizer step over ``param_bytes`` in ``tensors`` tensors at ``step``'s rates
    (:meth:`pipedream.costmodel.StepRates.seconds`).

    Raises:
        PipeDreamError: an unknown optimizer, or a negative rate or bandwidth.
    """
    try:
        return step.seconds(param_bytes, tensors, copy_on_write)
    except ValueError as e:
        hint = "; pass one of them as --optimizer" if step.optimizer not in costmodel.STEP_TRAFFIC else ""
        raise PipeDreamError(f"{e}{hint}") from None


def stage_costs(graph: LayerGraph, stage_nodes: list[list[str]], samples: float, *,
                bucket_bytes: float = costmodel.DDP_BUCKET_CAP_BYTES, step: costmodel.StepRates | None = None,
                copies_on_write: Sequence[bool] = ()) -> list[StageCost]:
    """Per-stage costs for actions of ``samples`` samples each.

    Args:
        graph: the profile; ``graph.minibatch_size`` must be the profiled minibatch (samples).
        stage_nodes: node ids of each stage in pipeline order (e.g. ``[s.nodes for s in plan.stages]``).
        samples: samples one forward/backward action processes (the per-worker (micro)batch).
        bucket_bytes: DDP gradient bucket cap, bytes (default DDP's 25 MiB).
        step: how one optimizer step of a replica is priced (:class:`pipedream.costmodel.StepRates`: the
            optimizer, the measured seconds per call, per parameter tensor and per byte on the run's host,
            :func:`pipedream.sim.profiled.step_rates`, else memory bound); None: its defaults, SGD with momentum
            memory bound at a V100's 900e9 bytes/s. A stage's tensors are counted by
            :meth:`~pipedream.graph.LayerGraph.param_tensors_of`.
        copies_on_write: per stage, whether its step first copies its weights (the schedule stashes versions
            there: :func:`pipedream.memory.copies_on_write`); missing stages: no.
    Raises:
        PipeDreamError: unknown profiled minibatch size, non-positive ``samples``, a bad stage split, a
            non-positive bucket cap or an unknown optimizer.
    """
    if graph.minibatch_size <= 0:
        raise PipeDreamError("the profile's minibatch size is unknown; pass the profiled minibatch (samples) "
                             "when reading graph.txt")
    if samples <= 0:
        raise PipeDreamError(f"batch size must be positive, got {samples}")
    if not stage_nodes:
        raise PipeDreamError("no stages to simulate")
    scale = samples / graph.minibatch_size
    rates = step or costmodel.StepRates()
    where = assign_stages(graph, stage_nodes)
    order = graph.topological_order()
    n_stages = len(stage_nodes)
    costs = []
    sums = tied.gradient_sums(graph.tied, [[n for n in order if where[n] == s] for s in range(n_stages)])
    for s in range(n_stages):
        mine = [n for n in order if where[n] == s]
        compute = [graph.nodes[n] for n in mine if not graph.nodes[n].is_input]
        grads: list[tuple[float, float]] = []  # (ready into the backward, bytes) per layer, backward order
        again = _tied_again(graph, [n.node_id for n in compute])
        elapsed = 0.0
        halves = [graph.backward_split(n.node_id) for n in compute]
        for node in reversed(compute):
            elapsed += node.bwd_s * scale
            nbytes = node.param_bytes - again.get(node.node_id, 0.0)
            if nbytes > 0:
                grads.append((elapsed, nbytes))
        param_bytes = graph.param_bytes_of(n.node_id for n in compute)
        costs.append(StageCost(
            fwd_s=sum(n.fwd_s for n in compute) * scale,
            bwd_s=elapsed,
            send_fwd_bytes=0.0,
            send_bwd_bytes=0.0,
            param_bytes=param_bytes,
            buckets=buckets_in_backward(grads, bucket_bytes),
            step_s=optimizer_step(param_bytes, rates, copy_on_write=s < len(copies_on_write) and copies_on_write[s],
                                  tensors=graph.param_tensors_of(n.node_id for n in compute)),
            tied_sums=[(stages, nbytes) for stages, nbytes in sums if s in stages],
            input_grad_s=sum(i for i, _ in halves) * scale,
            weight_grad_s=sum(w for _, w in halves) * scale,
        ))
    # boundary s: outputs of nodes in stages <= s with a consumer in a later stage (pipedream.cuts, the
    # definition the planner's states use too); an input's bytes go forward, no gradient comes back
    index = {n: i for i, n in enumerate(order)}
    stage_of = np.array([where[n] for n in order])
    crosses = crossing(stage_of[None, :] <= np.arange(n_stages - 1)[:, None],
                       [[index[d] for d in graph.successors(n)] for n in order])
    for s in range(n_stages - 1):
        fwd = bwd = 0.0
        for i in np.flatnonzero(crosses[s]):
            nbytes = graph.nodes[order[i]].output_bytes * scale
            fwd += nbytes
            bwd += 0.0 if graph.nodes[order[i]].is_input else nbytes
        costs[s].send_fwd_bytes = fwd
        costs[s + 1].send_bwd_bytes = bwd
    return costs


def recomputed(costs: list[StageCost]) -> list[StageCost]:
    """Stage costs under activation recomputation: every backward first runs its stage's forward again (the
    runtime's ``torch.utils.checkpoint`` recomputes it when the backward first needs a saved tensor), so
    ``bwd_s`` becomes ``bwd_s + fwd_s`` and each gradient bucket is ready ``fwd_s`` later; forwards, bytes
    and the optimizer step are unchanged.

    With a backward twice its forward this is PipeDream-2BW's figure (Narayanan et al., ICML 2021, as
    transcribed: recomputation costs about 1/3 more compute, its planner's ``c_extra = 4/3``):
    ``(f + 2f + f) / (f + 2f) = 4/3``; here the profile's own forward and backward times give the ratio. Split in
    two (``I`` then ``W``), the recomputation goes before ``I``.
    """
    return [replace(c, bwd_s=c.bwd_s + c.fwd_s, buckets=[(t + c.fwd_s, b) for t, b in c.buckets],
                    input_grad_s=c.split_s[0] + c.fwd_s, weight_grad_s=c.split_s[1])
            for c in costs]


def uniform_costs(stages: int, fwd_s: float, bwd_s: float, boundary_bytes: float = 0.0,
                  param_bytes: float = 0.0, step_s: float = 0.0) -> list[StageCost]:
    """``stages`` identical stages (for balanced-pipeline checks such as GPipe's bubble formula); each
    stage's gradient is one tensor ready at the end of its backward, so one bucket (DDP never splits a
    tensor), and its optimizer step takes ``step_s`` seconds."""
    return measured_costs([fwd_s] * stages, [bwd_s] * stages, [boundary_bytes] * (stages - 1),
                          [param_bytes] * stages, [step_s] * stages)


def measured_costs(fwd_s: list[float], bwd_s: list[float], boundary_bytes: list[float],
                   param_bytes: list[float] | None = None, step_s: list[float] | None = None) -> list[StageCost]:
    """Stage costs from times measured per stage (e.g. by a benchmark), not from a layer profile.

    Args:
        fwd_s: forward seconds of one (micro)batch, per stage in pipeline order.
        bwd_s: backward seconds of one (micro)batch, per stage.
        boundary_bytes: bytes crossing the boundary after each stage but the last, per (micro)batch
            (``len(fwd_s) - 1`` values); the gradient sent back is taken to be the same size.
        param_bytes: parameter bytes per stage (default 0: no allreduce is modelled); a stage's whole
            gradient counts as ready at the end of its backward, one bucket.
        step_s: measured optimizer step seconds per stage (default 0: no step time).
    Raises:
        PipeDreamError: lists of inconsistent lengths, or a negative time or size.
    """
    n = len(fwd_s)
    params = [0.0] * n if param_bytes is None else list(param_bytes)
    steps = [0.0] * n if step_s is None else list(step_s)
    if n == 0 or len(bwd_s) != n or len(boundary_bytes) != n - 1 or len(params) != n or len(steps) != n:
        raise PipeDreamError(f"measured costs need n forward, backward and step times, n - 1 boundary sizes and n "
                             f"parameter sizes; got {len(fwd_s)}, {len(bwd_s)}, {len(steps)}, {len(boundary_bytes)} "
                             f"and {len(params)}")
    if min(*fwd_s, *bwd_s, *boundary_bytes, *params, *steps, 0.0) < 0:
        raise PipeDreamError("measured stage times and sizes must not be negative")
    return [StageCost(fwd_s=fwd_s[s], bwd_s=bwd_s[s],
                      send_fwd_bytes=boundary_bytes[s] if s < n - 1 else 0.0,
                      send_bwd_bytes=boundary_bytes[s - 1] if s > 0 else 0.0,
                      param_bytes=params[s],
                      buckets=[(bwd_s[s], params[s])] if params[s] > 0 else [],
                      step_s=steps[s])
            for s in range(n)]
