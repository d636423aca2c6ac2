"""Every layer's forward and backward seconds inside whole training steps (CPU), as a stage computes them.

The profiler first times each layer alone, over and over, on its recorded inputs (:mod:`pipedream.profiler`); its
weights and activations stay in the caches between the calls. In a training step, and in a stage of a pipeline,
each layer finds them evicted by the layers before it, and by how much depends on the layer, so a single factor for
the whole model (``meta.json`` ``whole_step_s`` over the layers' sum,
:func:`pipedream.sim.profiled.profiled_composition`) cannot give each stage its share.

:func:`in_situ_times` runs whole steps through the traced model (``torch.fx.Interpreter``), stamping the clock
around every node's forward, and in the backward whenever the gradient of one of a node's outputs is ready (a
tensor hook on each output tensor the node made; one it passes through from an earlier node stays that node's): a
node's backward runs from its outputs' gradients to the next stamp (the backward of a chain goes layer by layer in
reverse; in a DAG the engine's order decides, and each interval goes to the node whose gradient opened it). Every
output is hooked, not only the first: of a node with two outputs (GNMT's attention decoder), the engine may run the
second's branch of the backward before the first's gradient is ready. The loss goes to the node that produces the
model's output, as in the isolated profile. Per node, the median over the steps.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from pipedream.capture import tensors

LOSS = "<loss>"  # the stamp that opens the loss's backward


class _Stamped(fx.Interpreter):
    """Runs the graph, timing each of ``ids``' nodes' forward and hooking its output for the backward's stamps."""

    def __init__(self, gm: fx.GraphModule, ids: dict[fx.Node, str], fwd: dict[str, float],
                 stamps: list[tuple[float, str]]) -> None:
        super().__init__(gm)
        self.ids, self.fwd, self.stamps = ids, fwd, stamps
        self.hooked: dict[int, torch.Tensor] = {}  # every output tensor hooked so far, by id

    def run_node(self, n: fx.Node) -> Any:
        start = time.perf_counter()
        out = super().run_node(n)
        if n in self.ids:
            nid = self.ids[n]
            self.fwd[nid] = time.perf_counter() - start
            for t in tensors(out):
                if t.requires_grad and id(t) not in self.hooked:  # not an earlier node's output passed through
                    self.hooked[id(t)] = t  # kept alive for the step, so that no later tensor reuses its id
                    t.register_hook(lambda grad, nid=nid: self.stamps.append((time.perf_counter(), nid)))
        return out


def one_step(gm: fx.GraphModule, ids: dict[fx.Node, str], inputs: list[Any], sink: str,
             loss: Callable[[Any], torch.Tensor] | None) -> tuple[dict[str, float], dict[str, float]]:
    """One whole step through ``gm`` on ``inputs`` (its placeholders' values): ``(forward s, backward s)`` per node
    id of ``ids`` (module docstring); ``sink`` (the node producing the output) also takes the loss's forward and
    backward. Without ``loss`` the backward starts from random gradients of the outputs, as the isolated profile's."""
    fwd: dict[str, float] = {}
    stamps: list[tuple[float, str]] = []
    out = _Stamped(gm, ids, fwd, stamps).run(*inputs)
    start = time.perf_counter()
    if loss is not None:
        value = loss(out)
        fwd[sink] = fwd.get(sink, 0.0) + time.perf_counter() - start
        stamps.append((time.perf_counter(), LOSS))
        value.backward()
    else:
        outs = [t for t in tensors(out) if t.requires_grad]
        grads = [torch.randn_like(t) for t in outs]
        stamps.append((time.perf_counter(), LOSS))
        if outs:
            torch.autograd.backward(outs, grads)
    end = time.perf_counter()
    gm.zero_grad(set_to_none=True)
    bwd: dict[str, float] = defaultdict(float)
    ordered = sorted(stamps)
    for (t0, nid), (t1, _) in zip(ordered, [*ordered[1:], (end, "")], strict=True):
        bwd[sink if nid == LOSS else nid] += t1 - t0
    return fwd, dict(bwd)


def in_situ_times(gm: fx.GraphModule, ids: dict[fx.Node, str], inputs: list[Any], sink: str,
                  loss: Callable[[Any], torch.Tensor] | None, warmup: int, iters: int) -> dict[str, tuple[float, float]]:
    """Per node id of ``ids``: the median ``(forward s, backward s)`` over ``iters`` whole steps (:func:`one_step`)
    after ``warmup`` untimed ones; a node a step did not time (no gradient reaches it) counts 0 there."""
    for _ in range(warmup):
        one_step(gm, ids, inputs, sink, loss)
    steps = [one_step(gm, ids, inputs, sink, loss) for _ in range(max(1, iters))]
    return {nid: (statistics.median(f.get(nid, 0.0) for f, _ in steps),
                  statistics.median(b.get(nid, 0.0) for _, b in steps)) for nid in ids.values()}
