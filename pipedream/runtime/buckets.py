"""Gradient buckets of a stage: the allreduce of a replicated stage overlapped with its backward, as DDP does.

Layout (once, when the executor is built). The stage's trainable parameters are grouped by *layer* (the owning
submodule: ``layer1.0.conv1`` for ``layer1.0.conv1.weight``), layers in reverse order of registration: the order
in which the backward produces their gradients, as PyTorch's ``DistributedDataParallel`` assumes.
:func:`pipedream.costmodel.bucket_layers` groups them into buckets (the one bucketing rule the DDP baseline, the
planner and the simulator use too: a bucket closes once it holds ``cap_bytes``, the first at 1 MiB under DDP's
default 25 MiB cap). Each bucket owns one flat buffer, allocated once, and every master parameter's ``.grad`` is a
view into it (DDP's ``gradient_as_bucket_view``): a step needs no concatenation and no copy.

Overlap (the ``B`` followed, in the rank's action list, by an ``ALLREDUCE``). A hook on every parameter tensor the
backward differentiates adds the gradient into the master ``.grad`` as soon as autograd has computed it; a bucket
whose gradients are all in is launched, in bucket order (as DDP), as an asynchronous ``all_reduce`` (sum) on the
stage's process group. Buckets some of whose parameters got no gradient are launched right after the backward.
The ``ALLREDUCE`` action then waits for every bucket (:meth:`BucketReducer.wait`, with the timeout) and the
executor divides the buffers by the schedule's reduce divisor. Earlier backwards of a minibatch (GPipe and 2BW
microbatches) only accumulate into the same buffers.

Emulated link (``--emulate-bandwidth-Bps``): the replicas' allreduces share one link, one bucket after the
other. With ``L_k`` the time the *last* replica launched bucket ``k``
(:class:`pipedream.runtime.launch_board.LaunchBoard`), ``S_k`` its bytes and ``n`` the stage's replicas, the
link completes bucket ``k`` at

    ``E_k = max(L_k, E_{k-1}) + ring_allreduce_s(S_k, n, bandwidth_Bps)``

(:func:`pipedream.runtime.launch_board.link_finish_s`; ``E_{-1}``: the link's previous allreduce), as the simulator
times it. Bucket ``k`` is complete at ``max(E_k, when its real all_reduce returned)``: the ``ALLREDUCE`` waits for
the buckets in order and sleeps until each one's ``E_k``. The DDP baseline's comm hook throttles its buckets by
the same rule.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from pipedream.costmodel import bucket_layers
from pipedream.errors import PipeDreamError
from pipedream.runtime.comm import wait_or_raise
from pipedream.runtime.launch_board import LaunchBoard, link_finish_s


def layer_of(name: str) -> str:
    """The layer (owning submodule's qualified name) of parameter ``name``: ``"3.weight"`` -> ``"3"``,
    ``"layer1.0.conv1.weight"`` -> ``"layer1.0.conv1"``, ``"bias"`` -> ``""`` (the module itself)."""
    return name.rpartition(".")[0]


def backward_layers(names: Sequence[str]) -> list[tuple[str, list[int]]]:
    """Layers in the order the backward produces their gradients, with their parameters.

    Args:
        names: parameter names in registration order (``module.named_parameters()``).
    Returns:
        ``(layer, indices into names)`` per layer, layers in reverse order of their first registered
        parameter, each layer's parameters in reverse order of registration.
    """
    layers: dict[str, list[int]] = {}
    for i in reversed(range(len(names))):
        layers.setdefault(layer_of(names[i]), []).append(i)
    return list(layers.items())


@dataclass
class Bucket:
    """One gradient bucket: ``buffer`` (flat, 1-D) holds the gradients of ``names``, in that order."""

    names: list[str]
    buffer: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()


class GradBuckets:
    """The gradient buckets of one stage; makes every master ``.grad`` a view into its bucket's buffer.

    Args:
        names, params: the stage's master parameters and their names, in registration order.
        cap_bytes: bucket cap (``--bucket-bytes``, DDP's ``bucket_cap_mb`` in bytes).
        first_cap_bytes: the first bucket's cap; None: DDP's rule
            (:func:`pipedream.costmodel.ddp_first_cap`: 1 MiB at the default 25 MiB cap, else ``cap_bytes``).
    Raises:
        PipeDreamError: the trainable parameters do not share one dtype and device.
    """

    def __init__(self, names: Sequence[str], params: Sequence[torch.Tensor], cap_bytes: float,
                 first_cap_bytes: float | None = None) -> None:
        trainable = [i for i, p in enumerate(params) if p.requires_grad]
        kinds = {(params[i].dtype, params[i].device) for i in trainable}
        if len(kinds) > 1:
            raise PipeDreamError(f"a stage's parameters have several dtypes/devices {sorted(map(str, kinds))}; gradient "
                                 "buckets need one: cast the model to one dtype")
        tnames = [names[i] for i in trainable]
        layers = backward_layers(tnames)
        sizes = [sum(params[trainable[k]].numel() * params[trainable[k]].element_size() for k in ks) for _, ks in layers]
        self.buckets: list[Bucket] = []
        for group in bucket_layers(sizes, cap_bytes, first_cap_bytes):
            members = [trainable[k] for li in group for k in layers[li][1]]
            p0 = params[members[0]]
            buffer = torch.zeros(sum(params[i].numel() for i in members), dtype=p0.dtype, device=p0.device)
            offset = 0
            for i in members:
                p = params[i]
                p.grad = buffer[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
            self.buckets.append(Bucket([names[i] for i in members], buffer))
        for p in params:  # frozen parameters keep a zero gradient of their own, as before
            if not p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
        self.loose = [p for p in params if not p.requires_grad]

    @property
    def names(self) -> list[list[str]]:
        """Parameter names of each bucket, buckets in reduction order."""
        return [b.names for b in self.buckets]

    def zero_(self) -> None:
        """Zero every gradient (after a step)."""
        for b in self.buckets:
            b.buffer.zero_()
        for p in self.loose:
            p.grad.zero_()  # type: ignore[union-attr]

    def div_(self, divisor: float) -> None:
        """Divide every bucket by ``divisor`` (the schedule's reduce divisor)."""
        if divisor != 1:
            for b in self.buckets:
                b.buffer.div_(divisor)


Event = Callable[[str, int, float], None]  # (event, bucket, time.perf_counter())


class BucketReducer:
    """Launches and waits for the bucket allreduces of one stage on its process group.

    Args:
        buckets: the stage's buckets.
        group: the process group of the stage's replicas.
        timeout_s: longest wait for one bucket's allreduce, s.
        bandwidth_Bps: emulated link bandwidth (bytes/s), None for the raw link. With it, building the
            reducer is a collective over ``group`` (its :class:`~pipedream.runtime.launch_board.LaunchBoard`).
        on_event: called with ``("launch" | "done", bucket, perf_counter time)`` (tracing), or None.
    """

    def __init__(self, buckets: GradBuckets, group: object, timeout_s: float, bandwidth_Bps: float | None = None,
                 on_event: Event | None = None) -> None:
        self.buckets, self.group, self.timeout_s, self.on_event = buckets, group, timeout_s, on_event
        self.replicas = dist.get_world_size(group)  # type: ignore[arg-type]
        self.bandwidth_Bps = bandwidth_Bps
        self.board = LaunchBoard(group, len(buckets.buckets)) if bandwidth_Bps else None  # type: ignore[arg-type]
        self.round = 0  # ALLREDUCEs completed: the board's round
        self.link_free_s = float("-inf")  # the emulated link's last completion (perf_counter clock), s
        self._reset()

    def _reset(self) -> None:
        self.works: list[dist.Work | None] = []
        self.missing = [len(b.names) for b in self.buckets.buckets]  # gradients each bucket still waits for

    def overlap(self, params: dict[str, torch.Tensor], master: dict[str, torch.Tensor]) -> list:
        """Before an overlapped backward: hook every trainable tensor of ``params`` (the version the backward
        differentiates) so that its gradient is added to ``master[name].grad`` and full buckets are
        launched. Returns the hook handles; pass them to :meth:`after_backward`."""
        self._reset()
        return [params[n].register_hook(self._hook(master[n], k))
                for k, b in enumerate(self.buckets.buckets) for n in b.names]

    def _hook(self, master: torch.Tensor, k: int) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            master.grad.add_(grad)  # type: ignore[union-attr]
            self.missing[k] -= 1
            self._launch_ready()
        return hook

    def _launch_ready(self) -> None:
        """Launch, in bucket order, every bucket whose gradients are all in and whose predecessors are launched."""
        while len(self.works) < len(self.missing) and self.missing[len(self.works)] == 0:
            self._launch(len(self.works))

    def _launch(self, k: int) -> None:
        bucket = self.buckets.buckets[k]
        t = time.perf_counter()
        if self.board is not None:
            self.board.post(self.round, k, t)
        self.works.append(dist.all_reduce(bucket.buffer, group=self.group, async_op=True))  # type: ignore[arg-type]
        if self.on_event is not None:
            self.on_event("launch", k, t)

    def after_backward(self, handles: list) -> None:
        """After the overlapped backward: remove the hooks and launch the buckets still waiting (some of
        their parameters got no gradient), in order."""
        for h in handles:
            h.remove()
        self.missing = [0] * len(self.missing)
        self._launch_ready()

    def wait(self, what: str) -> None:
        """Launch what is not launched yet (an ``ALLREDUCE`` without an overlapped backward), then wait for
        every bucket in order, each until its real allreduce returned and its emulated completion time.

        Raises:
            CommTimeout: a bucket's allreduce did not complete within the timeout.
        """
        self.missing = [0] * len(self.missing)
        self._launch_ready()
        for k, work in enumerate(self.works):
            wait_or_raise(work, self.timeout_s, f"{what}, bucket {k}")
            if self.board is not None:  # in bucket order: the link's chain of completions
                self.link_free_s = link_finish_s([self.board.latest(self.round, k)], [self.buckets.buckets[k].nbytes],
                                                 self.replicas, self.bandwidth_Bps, self.link_free_s)  # type: ignore[arg-type]
                delay = self.link_free_s - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
            if self.on_event is not None:
                self.on_event("done", k, time.perf_counter())
        self.round += 1
        self._reset()
