"""Each stage of a plan run alone, against its profile's share of the whole step (a CPU measurement before a run).

The prediction gives stage ``s`` the compute of its layers: their in-situ times (:mod:`pipedream.in_situ`), scaled
so that all layers sum to a whole training step (:func:`pipedream.sim.profiled.profiled_composition`). A stage
that runs as a unit does not cost exactly its layers' share: its forward starts from an input that arrived from
elsewhere, its backward ends in the gradient of that input, and the layers around its boundaries find other
caches than inside the whole model. On the 2-core CI VM (AMD EPYC, 2026-11-29, the plans of one ``make run``, one
pinned process) the stages alone over their shares were ResNet-50's straight pipeline 1.04-1.06 / 0.99-1.02 /
1.10-1.12 / 0.96-0.98 over five passes, GNMT-8's 1.07-1.08 / 1.07-1.08 / 0.99-1.01 / 0.89-0.90, GNMT-16's 1.09 /
1.08-1.09 / 1.04-1.05 / 0.79, AlexNet's 0.94-0.96 / 0.95-0.97 / 1.06-1.08 / 0.78-0.80, VGG-16's 3-1 0.99 / 1.04-1.05
and AWD-LM's 2-2 1.00 / 1.03 over two passes each (``benchmarks/stages``); GNMT-16's run of that ``make run``
computed at 1.16 / 1.10 / 1.04 / 0.80 of the prediction's work, which had taken the shares.

:func:`probe` builds the plan's stage modules as a worker does (:func:`pipedream.runtime.stage.build_stages`) and
times, in this process and interleaved, the profile's whole step (:func:`pipedream.commands.profile.runtime_step`)
and each stage's forward and backward as the executor runs them (:mod:`pipedream.runtime.executor`: the forward
through ``torch.func.functional_call`` on a weight version, ``torch.autograd.grad`` of its outputs with a gradient
of their shape and of its floating-point inputs, every weight gradient added into a master gradient; the last
stage's loss), each stage on the output of the stages before it for the same minibatch. The factor of a stage is
its step alone over its share of the whole step, both in one process, so the process's own speed (its memory
layout, the host's drift) divides out.

Cold caches. In a run a stage's process takes turns on its core with the other stages' processes, so between its
forward of a microbatch and its backward, and between one action and the next, their work evicts its weights and
activations from the caches; timed back to back, the small stages found them warm. :func:`probe` therefore evicts the
caches (writes a buffer of twice the host's last-level cache, :func:`evict`) before each stage's forward and again
before its backward, outside the time it counts; the whole step is timed as the profile timed it, back to back (its
layers already stream the model through the caches, and the profile's layer times are the whole step's). On the 2-core CI
VM (AMD EPYC, 32 MiB of L3, 2026-11-30, one process pinned to a core, ``benchmarks/stages`` on the plans of that
day's second ``make run``) cold over warm was 1.14-1.21 for AlexNet's first three stages and 1.55 for its last (its
fully connected layers, 1.22 against 1.89 ms), 1.12-1.21 for ResNet-50's four, 1.01-1.07 for VGG-16's and GNMT-8's,
within 3% for GNMT-16's and AWD-LM's, whose weights and activations never fit. Over those 20 stages the run's
stages computed a mean 16% above the warm factors (standard deviation of the logarithms 0.126) and 6% above the cold
ones (0.057).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pipedream.allocator import keep_freed_memory
from pipedream.graph import LayerGraph
from pipedream.host_timing import last_level_cache_bytes
from pipedream.plan import Plan


@dataclass
class StageProbe:
    """What :func:`probe` measured.

    Attributes:
        factors: per stage, ``alone_s / (shares * whole_s)`` (dimensionless; :func:`factors`).
        alone_s: per stage, the median main-thread CPU seconds of its forward and backward alone.
        whole_s: the median main-thread CPU seconds of the profile's whole step, same batch.
        shares: per stage, its layers' share of the profile's layers' sum (:func:`layer_shares`).
        batch_size: samples of each step.
        evict_bytes: bytes written to evict the caches before each stage's forward and backward (0: timed warm).
    """

    factors: list[float]
    alone_s: list[float]
    whole_s: float
    shares: list[float]
    batch_size: int
    evict_bytes: int = 0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: the run's ``prediction.json`` keeps it as ``stage_probe``."""
        return {"factors": self.factors, "alone_s": self.alone_s, "whole_s": self.whole_s, "shares": self.shares,
                "batch_size": self.batch_size, "evict_bytes": self.evict_bytes}


def layer_shares(graph: LayerGraph, stage_nodes: list[list[str]]) -> list[float]:
    """Each stage's share of the profile's layers (forward plus backward seconds of its non-input nodes over all
    non-input nodes'), the share of the whole step the prediction gives it.

    Raises:
        ValueError: the layers sum to no time.
    """
    def layer_s(n: str) -> float:
        node = graph.nodes[n]
        return 0.0 if node.is_input else node.fwd_s + node.bwd_s

    total = sum(layer_s(n) for n in graph.nodes)
    if total <= 0:
        raise ValueError("the profile's layers sum to no time")
    return [sum(layer_s(n) for n in nodes) / total for nodes in stage_nodes]


def factors(alone_s: Sequence[float], whole_s: float, shares: Sequence[float]) -> list[float]:
    """``alone_s[s] / (shares[s] * whole_s)`` per stage: a stage's step alone over its share of the whole step.

    Raises:
        ValueError: a share or the whole step that is not positive, or lengths that differ.
    """
    if whole_s <= 0 or any(p <= 0 for p in shares) or len(alone_s) != len(shares):
        raise ValueError(f"need one positive share per stage and a positive whole step, got shares {list(shares)} "
                         f"for {len(alone_s)} stages and {whole_s} s")
    return [a / (p * whole_s) for a, p in zip(alone_s, shares, strict=True)]


def interleaved_medians(steps: dict[str, Callable[[], float | None]], rounds: int, block: int, warmup: int = 2,
                        clock: Callable[[], float] = time.thread_time) -> dict[str, float]:
    """Median seconds of one call of each step by ``clock`` (default this thread's CPU), after ``warmup`` calls
    each, the steps taking turns in blocks of ``block`` calls, their order reversed every other round, so that a
    drift of the host falls on all alike. A step that returns a number has timed itself (the seconds of the part
    it counts, e.g. without evicting the caches): that number is its time.

    Raises:
        ValueError: ``rounds`` or ``block`` below 1.
    """
    if rounds < 1 or block < 1:
        raise ValueError(f"rounds and block must be at least 1, got {rounds} and {block}")
    for f in steps.values():
        for _ in range(warmup):
            f()
    times: dict[str, list[float]] = {k: [] for k in steps}
    for r in range(rounds):
        for k in (list(steps) if r % 2 == 0 else list(reversed(steps))):
            for _ in range(block):
                t0 = clock()
                own = steps[k]()
                times[k].append(own if isinstance(own, float) else clock() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def evict(buffer: Any) -> None:
    """Evict this core's caches and the shared last level: add 1 to every byte of ``buffer`` (a uint8 tensor of
    about twice the last-level cache), which reads and writes all of it."""
    buffer.add_(1)


def stage_steps(task: Any, plan: Plan, batch_size: int, evict_bytes: int = 0,
                clock: Callable[[], float] = time.thread_time) -> dict[str, Callable[[], float | None]]:
    """``{"whole": the profile's step, "stage<s>": stage s's forward and backward}`` on the first ``batch_size``
    training samples of ``task`` (:class:`pipedream.runtime.task.Task`), built as the workers build them (module
    docstring). The model's parameters are not changed. A stage's step keeps its master gradients, in the order of
    its module's parameters that need one, as ``step.grads`` and the output gradients it backpropagates as
    ``step.grad_out`` (the whole step's: :func:`pipedream.commands.profile.runtime_step`).

    A stage's step times itself by ``clock`` and returns the seconds of its forward and backward; with
    ``evict_bytes`` above 0 it evicts the caches (:func:`evict`, a buffer of that many bytes) before each of the
    two, outside those seconds (module docstring: the run's stages find cold caches). The whole step returns
    nothing (:func:`interleaved_medians` times it).

    Raises:
        PipeDreamError: the plan does not cut the model (:func:`pipedream.runtime.stage.build_stages`).
    """
    import torch
    from torch.func import functional_call

    from pipedream.capture import flat_inputs
    from pipedream.commands.profile import runtime_step
    from pipedream.runtime.stage import Boundary, build_stages

    model = task.model
    buffer = torch.zeros(evict_bytes, dtype=torch.uint8) if evict_bytes > 0 else None
    example = task.example if isinstance(model, torch.nn.Sequential) else task.input_batch(batch_size)
    modules = build_stages(model, plan, example).modules
    x, y = task.train.batch(list(range(batch_size)))
    inputs, current = [], flat_inputs(x)
    with torch.no_grad():
        for s, m in enumerate(modules):
            inputs.append(tuple(t.detach().clone() if isinstance(t, torch.Tensor) else t for t in current))
            out = m(*current)
            current = Boundary.unpack(out) if s + 1 < len(modules) else out

    def stage(s: int) -> Callable[[], None]:
        module, last = modules[s], s + 1 == len(modules)
        aliases = {n: p.detach().requires_grad_(p.requires_grad) for n, p in module.named_parameters()}
        wrt = [t for t in aliases.values() if t.requires_grad]
        ins = tuple(t.requires_grad_(True) if s > 0 and isinstance(t, torch.Tensor) and t.is_floating_point() else t
                    for t in inputs[s])
        in_float = [t for t in ins if isinstance(t, torch.Tensor) and t.requires_grad]
        masters = [torch.zeros_like(t) for t in wrt]
        grad_out: list[Any] = []
        if not last:
            with torch.no_grad():
                grad_out = [torch.randn_like(o) if o.is_floating_point() else None
                            for o in Boundary.unpack(functional_call(module, aliases, ins))]

        def step() -> float:
            if buffer is not None:
                evict(buffer)
            t0 = clock()
            out = functional_call(module, aliases, ins)
            if last:
                outputs, grads_of = [task.criterion(out, y)], None
            else:
                pairs = [(o, g) for o, g in zip(Boundary.unpack(out), grad_out, strict=True) if o.requires_grad]
                outputs, grads_of = [o for o, _ in pairs], [g for _, g in pairs]
            spent = clock() - t0
            if buffer is not None:
                evict(buffer)
            t0 = clock()
            grads = torch.autograd.grad(outputs, wrt + in_float, grad_outputs=grads_of, allow_unused=True)
            for master, g in zip(masters, grads[:len(wrt)], strict=True):
                if g is not None:
                    master.add_(g)
            return spent + clock() - t0

        step.grads = masters  # type: ignore[attr-defined]
        step.grad_out = grad_out  # type: ignore[attr-defined]
        return step

    return {"whole": runtime_step(model, task.criterion, x, y), **{f"stage{s}": stage(s) for s in range(len(modules))}}


def default_evict_bytes() -> int:
    """Twice this host's last-level cache (:func:`pipedream.host_timing.last_level_cache_bytes`), 64 MiB where the
    host does not say: what :func:`probe` writes to evict the caches before each stage's forward and backward."""
    return 2 * (last_level_cache_bytes() or 32 << 20)


def probe(task: Any, plan: Plan, graph: LayerGraph, batch_size: int, *, rounds: int = 6, block: int = 3,
          threads: int = 1, evict_bytes: int | None = None) -> StageProbe:
    """Time ``plan``'s stages alone against the whole step in this process on ``threads`` threads (restored
    after), ``rounds`` rounds of ``block`` steps each (:func:`interleaved_medians`), each stage with cold caches
    (``evict_bytes`` written before its forward and its backward, :func:`default_evict_bytes` by default; 0: warm,
    back to back; module docstring), and return the factors.

    The process keeps the memory it frees from then on, as the workers and the profile do
    (:func:`pipedream.allocator.keep_freed_memory`): by default glibc hands the whole step's large blocks back to
    the system and faults them in again every step, and a stage's smaller ones not, so the factors measured the
    allocator (on the 2-core CI VM, GNMT-16's whole step took 221 ms against 205 ms, its four factors 0.78-0.97
    against 0.87-1.10, AWD-LM's 0.74 / 1.20 against 1.01 / 1.03).

    Args:
        task: the run's task (:func:`pipedream.runtime.task.load_task`).
        plan: the run's plan (two stages or more).
        graph: the profile the plan came from (its layers' shares).
        batch_size: samples per step (the run's (micro)batch, at most its training samples).
        evict_bytes: bytes written to evict the caches before each stage's forward and backward; None: the default.
    Raises:
        PipeDreamError: the plan does not cut the model.
        ValueError: a stage without profiled time, or bad counts.
    """
    import torch

    shares = layer_shares(graph, [s.nodes for s in plan.stages])
    evict_bytes = default_evict_bytes() if evict_bytes is None else evict_bytes
    if evict_bytes < 0:
        raise ValueError(f"evict_bytes must be at least 0, got {evict_bytes}")
    keep_freed_memory()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        med = interleaved_medians(stage_steps(task, plan, batch_size, evict_bytes), rounds, block)
    finally:
        torch.set_num_threads(before)
    alone = [med[f"stage{s}"] for s in range(len(plan.stages))]
    return StageProbe(factors(alone, med["whole"], shares), alone, med["whole"], shares, batch_size, evict_bytes)
