"""Execute one rank's action list (:mod:`pipedream.schedules`) for one stage: the heart of the runtime.

Per action kind (§3.2, §3.3; when sends and receives are issued is :func:`pipedream.runtime.actions.issue_plan`'s
decision):

* ``RECV_F``/``RECV_B``: wait for the activation/gradient posted earlier.
* ``F``: run the stage on the weight version chosen by the :class:`~pipedream.runtime.versions.Policy`
  (``torch.func.functional_call`` on that version's tensors); with ``recompute``, under non-reentrant
  ``torch.utils.checkpoint`` (:meth:`StageExecutor._recomputable`). The last stage adds the loss (outside the
  checkpoint), divided by the microbatches per minibatch so coalesced gradients are minibatch means. The
  activation sent on carries the update count of vertical sync (§3.3): the input stage sends how many
  minibatches' updates its weights contain (version x minibatches per step), later stages pass it on.
* ``B``: ``torch.autograd.grad`` through the stored graph: gradients at the forward's version, added to the
  master weights' ``.grad`` (views into the stage's gradient buckets, :mod:`pipedream.runtime.buckets`); the
  input gradient is kept for ``SEND_B``. The ``B`` followed by an ``ALLREDUCE`` launches every full bucket's
  allreduce while the backward goes on (DDP's overlap).
* ``SEND_F``/``SEND_B``: asynchronous send to the rank that runs the minibatch on the next/previous stage.
* ``ALLREDUCE``: wait for the bucket allreduces on the stage's process group and divide by
  :meth:`~pipedream.schedules.Schedule.reduce_divisor`.
* ``STEP``: sum the gradients of parameters other stages hold too (:mod:`pipedream.runtime.shared`), then the
  optimizer step on the master weights (copy on write of the version it changes, when one is still needed),
  zero the gradients; the result is the next weight version.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call
from torch.utils.checkpoint import checkpoint

from pipedream.capture import flat_inputs, tensors
from pipedream.costmodel import DDP_BUCKET_CAP_BYTES
from pipedream.runtime.actions import RECVS, SENDS, issue_plan, memory_window, overlapped_backwards
from pipedream.runtime.buckets import BucketReducer, GradBuckets
from pipedream.runtime.comm import P2P, Outgoing, PendingRecv
from pipedream.runtime.memory_meter import MemoryMeter, SavedTensors, StageTally
from pipedream.runtime.shared import SharedGrads
from pipedream.runtime.stage import Boundary
from pipedream.runtime.task import count_correct
from pipedream.runtime.versions import WeightVersions
from pipedream.schedules import Action, Kind, Schedule


@dataclass
class StageData:
    """Where a stage's inputs and labels come from.

    Attributes:
        inputs: ``inputs(minibatch, microbatch) -> (b, *sample_shape)`` model input (input stage only).
        labels: ``labels(minibatch, microbatch) -> (b,)`` int64 targets (last stage only).
    """

    inputs: Callable[[int, int], torch.Tensor] | None = None
    labels: Callable[[int, int], torch.Tensor] | None = None


@dataclass
class EpochStats:
    """What one pass over a schedule produced on this rank (sums, so they add across ranks)."""

    loss_sum: float = 0.0
    loss_count: int = 0
    correct: int = 0
    counted: int = 0  # predictions compared for accuracy (tokens for sequence models)
    samples: int = 0
    compute_s: float = 0.0
    wait_s: float = 0.0
    losses: list[tuple[int, int, float]] = field(default_factory=list)  # (minibatch, micro, loss)


class StageExecutor:
    """Runs one stage's share of a schedule on one rank.

    Args:
        stage: stage index; ``num_stages`` the pipeline depth.
        module: the stage's module (:func:`pipedream.runtime.stage.build_stages`: stage 0 takes the
            model input, later stages the boundary's tensors as ``*args``); its parameters are the
            master weights.
        versions: the stage's weight versions (policy included).
        optimizer: updates the master weights at ``STEP``.
        p2p: point-to-point transport.
        in_shape: what arrives from the previous stage (None for the input stage).
        out_shape: what this stage outputs (gradients come back for its floating-point tensors).
        stage_group: process group of the stage's replicas (None when unreplicated).
        timeout_s: longest wait for a collective, s.
        on_backward: called after each backward with (minibatch, microbatch) (progress bars).
        trace: when True, record ``(kind, stage, minibatch, microbatch, version)`` of every F and B in
            :attr:`trace`, and ``(event, stage, minibatch, microbatch, bucket, time.perf_counter())`` in
            :attr:`comm_trace`: ``B_start``/``B_end`` of every backward (bucket -1), ``launch``/``done`` of
            every bucket allreduce (the minibatch and microbatch of the backward that launched it).
        criterion: the last stage's loss, ``criterion(output, target) -> mean loss``.
        count_correct: the last stage's validation accuracy, ``count_correct(output, target) -> (correct,
            counted)`` (:meth:`pipedream.runtime.task.Task.count_correct` skips padding).
        before_step: called before each optimizer step with the global index of the minibatch it
            completes (``minibatch_offset`` + its index): sets the learning rate, clips gradients.
        bucket_bytes: gradient bucket cap, bytes (:class:`~pipedream.runtime.buckets.GradBuckets`).
        measure_memory: after every action of a training pass, count the bytes the stage holds into
            :attr:`memory` (:mod:`pipedream.runtime.memory_meter`; None when False).
        memory_minibatches: count only over the first this many minibatches of each training pass
            (:func:`pipedream.runtime.actions.memory_window`); None: after every action.
        recompute: activation recomputation: each forward runs under ``torch.utils.checkpoint``.
        shared: sums the gradients of the parameters this stage shares with others before each step
            (:mod:`pipedream.runtime.shared`), or None.
    """

    def __init__(self, stage: int, num_stages: int, module: nn.Module, versions: WeightVersions,
                 optimizer: torch.optim.Optimizer, p2p: P2P, in_shape: Boundary | None,
                 out_shape: Boundary, stage_group: Any = None, timeout_s: float = 60.0,
                 on_backward: Callable[[int, int], None] | None = None, trace: bool = False,
                 criterion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy,
                 count_correct: Callable[[torch.Tensor, torch.Tensor], tuple[int, int]] = count_correct,
                 before_step: Callable[[int], None] | None = None,
                 bucket_bytes: float = DDP_BUCKET_CAP_BYTES, measure_memory: bool = False,
                 memory_minibatches: int | None = None, recompute: bool = False,
                 shared: SharedGrads | None = None) -> None:
        self.stage, self.num_stages = stage, num_stages
        self.is_first, self.is_last = stage == 0, stage == num_stages - 1
        self.module, self.versions, self.optimizer, self.p2p = module, versions, optimizer, p2p
        self.in_shape, self.out_shape = in_shape, out_shape
        self.stage_group, self.timeout_s = stage_group, timeout_s
        self.on_backward = on_backward
        self.criterion, self.count_correct, self.before_step = criterion, count_correct, before_step
        self.recompute = recompute
        self.shared = shared
        self.trace: list[tuple[str, int, int, int, int]] | None = [] if trace else None
        self.comm_trace: list[tuple[str, int, int, int, int, float]] | None = [] if trace else None
        self.copies_trace: list[int] | None = [] if trace else None  # weight copies held after each action
        self.first_grads: dict[str, torch.Tensor] | None = None  # gradients applied at the first STEP
        self.stats_history: list[list[tuple[int, int, float]]] = []  # per training pass: (mb, micro, loss)
        self.master = dict(zip(versions.names, versions.master, strict=True))
        self.buckets = GradBuckets(versions.names, versions.master, bucket_bytes)
        self.reducer = (BucketReducer(self.buckets, stage_group, timeout_s, p2p.bandwidth_Bps,
                                      self._bucket_event if trace else None) if stage_group is not None else None)
        self._reducing = (0, 0)  # (minibatch, microbatch) of the backward that launched the buckets
        self.memory = MemoryMeter(p2p.device) if measure_memory else None
        self.memory_minibatches = memory_minibatches
        self._counting = False  # the memory meter counts after the current action (and records its saved tensors)
        self.saved = SavedTensors()  # activations saved for backward, per in-flight unit (measure_memory)
        self._tally = StageTally()

    # ---------------------------------------------------------------- one pass over an action list
    def run(self, actions: list[Action], schedule: Schedule, data: StageData, microbatch_size: int,
            phase: int = 0, minibatch_offset: int = 0) -> EpochStats:
        """Execute ``actions`` (this rank's list of ``schedule``); ``phase`` 1 = forward-only evaluation.

        ``minibatch_offset`` is the number of minibatches of earlier epochs (2BW numbers versions by
        global minibatch).

        Raises:
            CommTimeout: a peer did not answer within the timeout.
            PipeDreamError: the schedule and the weight-version policy disagree.
        """
        self.schedule, self.data, self.phase, self.b = schedule, data, phase, microbatch_size
        self.minibatch_offset = minibatch_offset
        self.stats = EpochStats()
        self.units: dict[tuple[int, int], dict[str, Any]] = {}
        self.pending: dict[Action, PendingRecv] = {}
        self.scale = 1.0 / schedule.num_microbatches
        self.updates_per_version = schedule.reduce_divisor(self.stage)  # minibatches one STEP applies
        self.overlapped = overlapped_backwards(actions)
        self._tally.invalidate()  # a checkpoint load or an evaluation pass may have changed what the stage holds
        plan = issue_plan(actions, self.p2p.batched)
        window = (memory_window(actions, self.memory_minibatches) if self.memory_minibatches
                  else len(actions)) if phase == 0 and self.memory is not None else 0
        for i, a in enumerate(actions):
            self._counting = i < window
            if plan[i]:
                self._issue([actions[k] for k in plan[i]])
            if a.kind == Kind.B:
                self._do_b(a, overlap=i in self.overlapped)
            elif a.kind not in SENDS:  # a send's work was done when it was issued
                getattr(self, f"_do_{a.kind.value.lower()}")(a)
            if self.copies_trace is not None:
                self.copies_trace.append(self._weight_copies())
            if self._counting:
                self._count_memory(a)
        self.p2p.drain()
        if phase == 0:
            self.stats_history.append(self.stats.losses)
        return self.stats

    def _weight_copies(self) -> int:
        """Copies of the stage's weights alive now, counted by storage: the distinct storages of the first
        parameter over the master, every stored version and every in-flight unit's forward weights."""
        if not self.versions.names:
            return 0
        n = self.versions.names[0]
        held = [self.versions.master[0], *(self.versions.params_of(v)[n] for v in self.versions.alive()),
                *(u["params"][n] for u in self.units.values() if "params" in u)]
        return len({t.untyped_storage().data_ptr() for t in held})

    def _issue(self, comm: list[Action]) -> None:
        """Issue the sends and post the receives of ``comm`` together (one batch when ``P2P.batched``)."""
        recvs = []
        for a in comm:
            if a.kind in RECVS:
                specs = (self.in_shape.batched(self.b) if a.kind == Kind.RECV_F  # type: ignore[union-attr]
                         else self.out_shape.batched(self.b, grads=True))
                recvs.append((self.schedule.peer(a), specs, self._tag(a, a.kind == Kind.RECV_B)))
        sends = [self._outgoing(a) for a in comm if a.kind in SENDS]
        posted = self.p2p.exchange(sends, recvs)  # type: ignore[arg-type]
        for a, pending in zip([a for a in comm if a.kind in RECVS], posted, strict=True):
            self.pending[a] = pending

    def _outgoing(self, a: Action) -> Outgoing:
        """The transfer of a ``SEND_F`` (the stage's output) or ``SEND_B`` (its input gradients)."""
        if a.kind == Kind.SEND_F:
            unit = self.units[a.key]
            version = unit.get("carried", unit.get("version", self.versions.latest) * self.updates_per_version)
            if self.phase == 1:
                del self.units[a.key]
            return Outgoing(Boundary.unpack(unit["output"]), self.schedule.peer(a), self._tag(a, False),  # type: ignore[arg-type]
                            version)
        unit = self.units.pop(a.key)
        return Outgoing(unit["grad_in"], self.schedule.peer(a), self._tag(a, True), unit["version"])  # type: ignore[arg-type]

    def _tag(self, a: Action, backward: bool) -> tuple[int, bool, int, int]:
        return (self.phase, backward, a.minibatch, a.microbatch or 0)

    # ------------------------------------------------------------------------------ the action kinds
    def _do_recv_f(self, a: Action) -> None:
        msg = self._wait(a)
        unit = self.units.setdefault(a.key, {})
        for t in msg.tensors:
            t.requires_grad_(self.phase == 0 and t.is_floating_point())
        unit["inputs"] = msg.tensors
        unit["input"] = tuple(msg.tensors)
        unit["carried"] = msg.version  # update count of the input stage's weights (vertical sync)

    def _do_recv_b(self, a: Action) -> None:
        self.units[a.key]["grad_out"] = self._wait(a).tensors

    def _wait(self, a: Action):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        msg = self.pending.pop(a).wait()
        self.stats.wait_s += time.perf_counter() - t0
        if (msg.minibatch, msg.microbatch) != a.key:
            raise RuntimeError(f"{a}: received minibatch {msg.minibatch}.{msg.microbatch} instead")
        return msg

    def _do_f(self, a: Action) -> None:
        t0 = time.perf_counter()
        unit = self.units.setdefault(a.key, {})
        m, j = a.key
        if self.is_first:
            assert self.data.inputs is not None
            unit["input"] = tuple(t.to(self.p2p.device) if isinstance(t, torch.Tensor) else t
                                  for t in flat_inputs(self.data.inputs(m, j)))
        if self.phase == 1:
            self._forward_eval(a, unit)
        else:
            v = self.versions.version_for(self.minibatch_offset + m, unit.get("carried"), self.updates_per_version)
            params = self.versions.acquire(v)
            unit["version"], unit["params"] = v, params
            saving = self.saved.hooks(a.key) if self._counting else nullcontext()
            with saving:
                if self.recompute:
                    out = checkpoint(self._recomputable(a.key, params), *unit["input"], use_reentrant=False)
                else:
                    out = functional_call(self.module, params, unit["input"])
            if self.is_last:
                assert self.data.labels is not None
                labels = self.data.labels(m, j).to(self.p2p.device)
                with saving:
                    loss = self.criterion(out, labels)
                value = float(loss.detach())
                self.stats.loss_sum += value * labels.shape[0]
                self.stats.loss_count += labels.shape[0]
                self.stats.samples += labels.shape[0]
                self.stats.losses.append((m, j, value))
                out = loss * self.scale
            unit["output"] = out
            if self.trace is not None:
                self.trace.append(("F", self.stage, m, j, v))
        self.stats.compute_s += time.perf_counter() - t0

    def _recomputable(self, key: tuple[int, int], params: dict[str, torch.Tensor]) -> Callable[..., Any]:
        """The stage's forward on ``params`` for ``torch.utils.checkpoint``. Its first call is the forward; a later
        one is the recomputation inside the backward, on the same weight version (the closure's ``params``),
        which updates throwaway copies of the module's buffers, so that BatchNorm's running statistics move once
        per (micro)batch as without recomputation, and, when the meter counts this backward, records what it saves
        under ``key`` (:meth:`~pipedream.runtime.memory_meter.SavedTensors.recomputing`)."""
        calls = 0

        def stage(*inputs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == 1:
                return functional_call(self.module, params, inputs)
            buffers = {n: b.clone() for n, b in self.module.named_buffers()}
            with self.saved.recomputing(key) if self._counting else nullcontext():
                return functional_call(self.module, {**params, **buffers}, inputs)

        return stage

    def _forward_eval(self, a: Action, unit: dict[str, Any]) -> None:
        with torch.no_grad():
            out = self.module(*unit["input"])
        if self.is_last:
            assert self.data.labels is not None
            labels = self.data.labels(*a.key).to(self.p2p.device)
            correct, counted = self.count_correct(out, labels)
            self.stats.correct += correct
            self.stats.counted += counted
            self.stats.loss_sum += float(self.criterion(out, labels)) * labels.shape[0]
            self.stats.loss_count += labels.shape[0]
            self.stats.samples += labels.shape[0]
            del self.units[a.key]
        else:
            unit["output"] = out

    def _do_b(self, a: Action, overlap: bool = False) -> None:
        t0 = time.perf_counter()
        self._comm_event("B_start", a.key, -1, t0)
        unit = self.units[a.key]
        params = unit.pop("params")
        names = [n for n in self.versions.names if params[n].requires_grad]
        # floating-point inputs get gradients (sent back); integer ones (token ids) ride along
        in_float = [] if self.is_first else [unit["inputs"][k] for k in self.in_shape.grad_items]  # type: ignore
        output = unit.pop("output")
        if self.is_last:
            outputs, grad_outputs = [output], None
        else:
            outs = Boundary.unpack(output)
            pairs = [(outs[k], g) for k, g in zip(self.out_shape.grad_items, unit.pop("grad_out"), strict=True)
                     if outs[k].requires_grad]
            outputs, grad_outputs = [o for o, _ in pairs], [g for _, g in pairs]
        wrt = [params[n] for n in names] + in_float
        # the backward completing an update: hooks add each gradient to the master and launch full buckets
        hooked = self.reducer is not None and overlap
        if hooked:
            self._reducing = a.key
            handles = self.reducer.overlap(params, self.master)  # type: ignore[union-attr]
        try:
            grads = (torch.autograd.grad(outputs, wrt, grad_outputs=grad_outputs, allow_unused=True)
                     if outputs else [None] * len(wrt))
        finally:
            if hooked:
                self.reducer.after_backward(handles)  # type: ignore[union-attr]
        if self.recompute and self._counting:
            self._count_memory(a)  # with this unit's recomputed activations (held by self.saved until the drop)
        for n, g in zip(names, grads, strict=False):
            if g is not None and not hooked:
                self.master[n].grad.add_(g)  # type: ignore[union-attr]
        if not self.is_first:
            unit["grad_in"] = [g if g is not None else torch.zeros_like(t)
                               for g, t in zip(grads[len(names):], in_float, strict=True)]
        if self.trace is not None:  # the version whose tensors the backward differentiated, found by identity
            used = self.versions.version_of(params) if self.versions.names else unit["version"]
            self.trace.append(("B", self.stage, a.minibatch, a.microbatch or 0, used))
        self.versions.release(unit["version"])
        self.saved.drop(a.key)
        if self.is_first:
            del self.units[a.key]
        t1 = time.perf_counter()
        self.stats.compute_s += t1 - t0
        self._comm_event("B_end", a.key, -1, t1)
        if self.on_backward is not None:
            self.on_backward(*a.key)

    def _count_memory(self, a: Action) -> None:
        """Count what the stage holds after action ``a`` into :attr:`memory` (categories of
        :mod:`pipedream.runtime.memory_meter`), with the copies of its weights (:meth:`_weight_copies`)."""
        self._tally.touch(a.key)
        master = list(self.versions.master)
        # what changes the fixed part: a step makes a version (and may move the master), a backward may release one
        signature = (tuple(self.versions.alive()), master[0].untyped_storage().data_ptr() if master else 0,
                     len(self.optimizer.state))

        def fixed() -> list[tuple[str, Iterable[torch.Tensor]]]:
            return [("weights", master + list(self.module.buffers())),
                    ("versions", tensors([self.versions.params_of(v) for v in self.versions.alive()])),
                    ("gradients", [b.buffer for b in self.buckets.buckets] + [p.grad for p in master if p.grad is not None]),
                    ("optimizer", tensors(list(self.optimizer.state.values())))]

        def unit(key: tuple[int, int], u: dict[str, Any]) -> Callable[[], list[tuple[str, Iterable[torch.Tensor]]]]:
            return lambda: [("buffers", tensors([x for k, x in u.items() if k != "params"])),
                            ("activations", self.saved.tensors_of(key))]

        posted = tensors([[p.header, *p.tensors] for p in self.pending.values()])
        now = self._tally.now(fixed, {k: unit(k, u) for k, u in self.units.items()}, posted, signature)
        self.memory.add(now, self._weight_copies())  # type: ignore[union-attr]

    def _do_allreduce(self, a: Action) -> None:
        if self.reducer is None:
            raise RuntimeError(f"{a}: stage {self.stage} has no replicas to allreduce with")
        t0 = time.perf_counter()
        self.p2p.note("allreduce", tuple(dist.get_process_group_ranks(self.stage_group)))
        self.reducer.wait(f"gradient allreduce of stage {self.stage} ({a})")
        self.stats.wait_s += time.perf_counter() - t0
        self.buckets.div_(self.schedule.reduce_divisor(self.stage))

    def _comm_event(self, event: str, key: tuple[int, int], bucket: int, t: float) -> None:
        if self.comm_trace is not None:
            self.comm_trace.append((event, self.stage, key[0], key[1], bucket, t))

    def _bucket_event(self, event: str, bucket: int, t: float) -> None:
        self._comm_event(event, self._reducing, bucket, t)

    def _do_step(self, a: Action) -> None:
        if self.shared is not None:
            self.shared.sum_()
        if self.first_grads is None:
            self.first_grads = {n: p.grad.detach().clone()  # type: ignore[union-attr]
                                for n, p in zip(self.versions.names, self.versions.master, strict=True)}
        if self.before_step is not None:
            self.before_step(self.minibatch_offset + a.minibatch)
        with self.versions.stepping(), torch.no_grad():
            self.optimizer.step()
        self.buckets.zero_()
