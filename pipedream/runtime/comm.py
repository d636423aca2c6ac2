"""Point-to-point activations and gradients between stages, with timeouts and an optional link throttle.

Every transfer is a few messages on torch.distributed (gloo on CPU, NCCL on GPU): a float64 header
``[minibatch, microbatch, weight version, send time in s]`` and then each tensor crossing the stage
boundary (one, or the items of a tuple such as GNMT's ``(h, src, prev)``). Sends are asynchronous
(the handle is kept until it completes), receives are waited on with a timeout, so no wait can hang.

Tags make each message unique (:func:`make_tag`), so on gloo matching never depends on posting order and the
executor posts receives ahead of need. NCCL ignores tags and runs a rank's point-to-point operations in issue
order, so a receive posted early can deadlock two stages that each wait for the other's send (NVIDIA/nccl#479):
with ``batched=True`` (what the workers use on NCCL) the sends and receives of each step are issued together as
one :func:`torch.distributed.batch_isend_irecv`, in schedule order (:func:`pipedream.runtime.actions.issue_plan`).

``log=True`` records what a rank hands to torch.distributed, in order (:attr:`P2P.log`, tests check
it): ``("send" | "recv", peer, tag_args, batch)`` for each transfer (the same ``batch`` number: one
``batch_isend_irecv``), ``("wait", peer, tag_args)`` when the caller blocks on a receive,
``("allreduce", ranks)`` for a collective of those ranks, ``("drain",)`` when it waits for all sends.

Link throttle (``bandwidth_Bps``): a message of ``n`` bytes occupies the link from its sender for
``n / bandwidth_Bps`` seconds, one message after the other per link; the receiver does not hand the
tensor over before that time. This makes a loopback run pay the transfer time of the modelled cluster
while the sender keeps computing. It compares wall clocks of sender and receiver, so it assumes both
run on one machine (the reduced runs do).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from pipedream.errors import PipeDreamError

MAX_MINIBATCH = 1 << 19
MAX_MICROBATCH = 1 << 7
MAX_PARTS = 8  # header + up to 7 tensors per transfer
HEADER_LEN = 4


class CommTimeout(PipeDreamError):
    """A receive, send or collective did not complete within the timeout (a peer died or hung)."""


def make_tag(phase: int, backward: bool, minibatch: int, microbatch: int, part: int) -> int:
    """Unique message tag; ``phase`` 0 = training, 1 = evaluation; ``part`` 0 = header, k = k-th tensor.

    Raises:
        PipeDreamError: minibatch or microbatch index too large for the tag layout.
    """
    if not (0 <= minibatch < MAX_MINIBATCH and 0 <= microbatch < MAX_MICROBATCH):
        raise PipeDreamError(f"minibatch {minibatch} / microbatch {microbatch} exceed the tag space "
                             f"({MAX_MINIBATCH} minibatches per epoch, {MAX_MICROBATCH} microbatches)")
    base = ((phase * 2 + int(backward)) * MAX_MINIBATCH + minibatch) * MAX_MICROBATCH + microbatch
    return base * MAX_PARTS + part


def wait_or_raise(work: dist.Work | None, timeout_s: float, what: str) -> None:
    """Wait for ``work`` at most ``timeout_s`` seconds.

    Raises:
        CommTimeout: on timeout or when the peer's connection broke (the message names ``what``).
    """
    if work is None:
        return
    try:
        work.wait(timedelta(seconds=timeout_s))
    except Exception as e:  # gloo raises RuntimeError for both timeouts and closed peers
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CommTimeout(f"{what} failed after at most {timeout_s:.0f} s: {msg}") from None


def link_ready_s(sent_at_s: float, link_free_s: float, nbytes: int, bandwidth_Bps: float) -> float:
    """When an emulated link delivers ``nbytes`` handed over at ``sent_at_s`` (s since the epoch).

    Messages on one link go one after the other: the transfer starts when both the message was sent
    and the previous message has left the link (``link_free_s``), and takes ``nbytes / bandwidth_Bps``.
    """
    return max(sent_at_s, link_free_s) + nbytes / bandwidth_Bps


@dataclass
class Message:
    """A received transfer: its tensors (one per boundary item) and header fields."""

    tensors: list[torch.Tensor]
    minibatch: int
    microbatch: int
    version: int
    sent_at: float

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)


@dataclass
class Outgoing:
    """One transfer to send: the tensors crossing a boundary, the destination rank, the tag's
    ``(phase, backward, minibatch, microbatch)`` and the weight version (or update count) for the header."""

    tensors: list[torch.Tensor]
    dst: int
    tag_args: tuple[int, bool, int, int]
    version: int


class PendingRecv:
    """A posted receive of a header and the tensors of ``specs``; :meth:`wait` returns them."""

    def __init__(self, p2p: P2P, src: int, specs: list[tuple[tuple[int, ...], torch.dtype]], tag_args: tuple) -> None:
        self.p2p, self.src, self.tag_args = p2p, src, tag_args
        self.what = f"receive {tag_args} from rank {src}"
        self.header = torch.zeros(HEADER_LEN, dtype=torch.float64, device=p2p.device)
        self.tensors = [torch.empty(shape, dtype=dtype, device=p2p.device) for shape, dtype in specs]
        self.works: list[dist.Work] = []  # set by P2P.exchange

    def buffers(self) -> list[tuple[torch.Tensor, int]]:
        """``(buffer, tag)`` of every message of the transfer, header first."""
        return [(self.header, make_tag(*self.tag_args, part=0))] + [
            (t, make_tag(*self.tag_args, part=k + 1)) for k, t in enumerate(self.tensors)]

    def wait(self) -> Message:
        """Block until every part arrived (and, when throttled, the link time passed)."""
        self.p2p.note("wait", self.src, self.tag_args)
        for w in self.works:
            wait_or_raise(w, self.p2p.timeout_s, self.what)
        h = self.header.tolist()
        msg = Message(self.tensors, int(h[0]), int(h[1]), int(h[2]), h[3])
        self.p2p.throttle(self.src, msg)
        return msg


class P2P:
    """Asynchronous point-to-point transfers of one rank.

    Args:
        timeout_s: longest wait for any message, s.
        device: where received tensors are allocated.
        bandwidth_Bps: emulated link bandwidth in bytes/s, or None for the raw link.
        batched: issue each :meth:`exchange` as one ``batch_isend_irecv`` (in-order backends: NCCL).
        log: record every issued operation in :attr:`log` (see the module docstring).
    """

    def __init__(self, timeout_s: float, device: torch.device, bandwidth_Bps: float | None = None,
                 batched: bool = False, log: bool = False) -> None:
        self.timeout_s = timeout_s
        self.device = device
        self.bandwidth_Bps = bandwidth_Bps
        self.batched = batched
        self.log: list[tuple] | None = [] if log else None
        self._batches = 0
        self._sends: list[tuple[dist.Work | None, torch.Tensor, str]] = []
        self._link_free: dict[int, float] = {}  # src rank -> time its link to us is free again
        self.bytes_sent = 0
        self.throttle_s = 0.0

    def note(self, *entry: object) -> None:
        """Append ``entry`` to :attr:`log` when logging."""
        if self.log is not None:
            self.log.append(entry)

    def exchange(self, sends: list[Outgoing], recvs: list[tuple[int, list[tuple[tuple[int, ...], torch.dtype]], tuple]]
                 ) -> list[PendingRecv]:
        """Issue ``sends`` and post ``recvs`` (``(src, [(shape, dtype)], tag_args)``); wait on the returned handles.

        ``batched``: all of them in one ``batch_isend_irecv`` (one NCCL group: their order does not
        matter, and none waits for another); otherwise one ``isend``/``irecv`` after the other, receives
        first.

        Raises:
            PipeDreamError: more tensors than the tag layout has parts for.
        """
        pending = [PendingRecv(self, src, specs, tag_args) for src, specs, tag_args in recvs]
        ops: list[tuple[bool, torch.Tensor, int, int, str]] = []  # (send?, tensor, peer, tag, what)
        owner: list[PendingRecv | None] = []  # the receive each op belongs to (None: a send)
        for r in pending:
            self._note_transfer("recv", r.src, r.tag_args)
            for t, tag in r.buffers():
                ops.append((False, t, r.src, tag, r.what))
                owner.append(r)
        for o in sends:
            if len(o.tensors) >= MAX_PARTS:
                raise PipeDreamError(f"{len(o.tensors)} tensors cross one stage boundary; at most {MAX_PARTS - 1} "
                                     "are supported")
            self._note_transfer("send", o.dst, o.tag_args)
            header = torch.tensor([o.tag_args[2], o.tag_args[3], o.version, time.time()], dtype=torch.float64,
                                  device=self.device)
            what = f"send {o.tag_args} to rank {o.dst}"
            for k, t in enumerate([header, *(t.detach().contiguous() for t in o.tensors)]):
                ops.append((True, t, o.dst, make_tag(*o.tag_args, part=k), what))
                owner.append(None)
                if k:
                    self.bytes_sent += t.numel() * t.element_size()
        if not ops:
            return pending
        if self.batched:
            self._batches += 1
            works = dist.batch_isend_irecv([dist.P2POp(dist.isend if send else dist.irecv, t, peer, tag=tag)
                                            for send, t, peer, tag, _ in ops])
            if len(works) != len(ops):  # NCCL: one work for the whole group; every part waits on all of it
                for r in pending:
                    r.works = list(works)
                self._sends += [(w, t, what) for send, t, _, _, what in ops if send for w in works]
                self._reap()
                return pending
        else:
            works = [(dist.isend if send else dist.irecv)(t, peer, tag=tag) for send, t, peer, tag, _ in ops]
        for (_, t, _, _, what), work, r in zip(ops, works, owner, strict=True):
            if r is None:
                self._sends.append((work, t, what))
            else:
                r.works.append(work)
        self._reap()
        return pending

    def _note_transfer(self, kind: str, peer: int, tag_args: tuple) -> None:
        """Log one transfer; unbatched, each transfer is a batch of its own."""
        if not self.batched:
            self._batches += 1
        self.note(kind, peer, tag_args, self._batches)

    def throttle(self, src: int, msg: Message) -> None:
        """Hold ``msg`` until the emulated link from ``src`` would have delivered it."""
        if not self.bandwidth_Bps:
            return
        ready = link_ready_s(msg.sent_at, self._link_free.get(src, 0.0), msg.nbytes, self.bandwidth_Bps)
        self._link_free[src] = ready
        delay = ready - time.time()
        if delay > 0:
            self.throttle_s += delay
            time.sleep(delay)

    def _reap(self) -> None:
        self._sends = [s for s in self._sends if s[0] is not None and not s[0].is_completed()]

    def drain(self) -> None:
        """Wait for every outstanding send (end of an epoch).

        Raises:
            CommTimeout: a send did not complete within the timeout.
        """
        self.note("drain")
        for work, _, what in self._sends:
            wait_or_raise(work, self.timeout_s, what)
        self._sends.clear()
