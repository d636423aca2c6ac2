"""Process-group setup, collectives with timeouts, and failure reporting shared by all workers.

Workers are started by torchrun (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` in the
environment) or by :func:`pipedream.runtime.launch.spawn_local`. Every blocking call has a timeout;
a worker that fails writes one line to ``<out_dir>/errors/rank<r>.txt`` and exits non-zero (1 for its own
error, :data:`~pipedream.runtime.supervise.PEER_FAILED` when a peer stopped answering), so the launcher can
say which rank failed first and why.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pipedream.allocator import keep_freed_memory
from pipedream.errors import PipeDreamError
from pipedream.io import atomic_write_json, atomic_write_text
from pipedream.runtime.comm import CommTimeout, wait_or_raise
from pipedream.runtime.config import TrainConfig, add_arguments, from_args
from pipedream.runtime.supervise import PEER_FAILED, die_with_parent

FAULT_ENV = "PIPEDREAM_FAULT_KILL"
RESTART_ENV = "TORCHELASTIC_RESTART_COUNT"  # set by torchrun's elastic agent: 0, then 1, 2, ... after each restart


def uses_cuda() -> bool:
    """Whether workers started here train on GPUs (NCCL, one GPU each) rather than on the CPU (gloo):
    CUDA is available and ``PIPEDREAM_FORCE_GLOO`` is not ``1``."""
    return torch.cuda.is_available() and os.environ.get("PIPEDREAM_FORCE_GLOO") != "1"


def init(timeout_s: float) -> tuple[int, int, torch.device]:
    """Join the process group from the environment: gloo on CPU, NCCL when CUDA is available.

    ``PIPEDREAM_FORCE_GLOO=1`` keeps a machine with GPUs on gloo and the CPU (the test suite sets it). Under
    torchrun the process group's keys in the agent's store are prefixed by the attempt (``TORCHELASTIC_RESTART_COUNT``):
    the agent keeps its store across ``--max-restarts`` restarts, and a restarted rank must not read the gloo
    addresses the ranks of a failed attempt left there.

    Returns:
        (rank, world size, device of this rank).
    """
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if uses_cuda():
        local = int(os.environ.get("LOCAL_RANK", rank))
        if local >= torch.cuda.device_count():
            raise PipeDreamError(f"local rank {local} needs GPU {local} but this node has {torch.cuda.device_count()}; "
                                 "NCCL takes one GPU per worker: start fewer workers per node, or set "
                                 "PIPEDREAM_FORCE_GLOO=1 to train on the CPU")
        torch.cuda.set_device(local)
        device, backend = torch.device("cuda", local), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        timeout = timedelta(seconds=timeout_s)
        store = None
        if RESTART_ENV in os.environ:  # torchrun's agent serves one store to every attempt: keep their keys apart
            agent_store, _, _ = next(dist.rendezvous("env://", rank, world, timeout=timeout))
            store = dist.PrefixStore(f"attempt{restart_count()}/", agent_store)
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout, store=store)
    return rank, world, device


def allreduce_sum(values: list[float], timeout_s: float, what: str, group: object = None) -> list[float]:
    """Sum ``values`` over the ranks of ``group`` (the world by default), waiting at most ``timeout_s``."""
    t = torch.tensor(values, dtype=torch.float64)
    if dist.get_backend(group) == "nccl":  # type: ignore[arg-type]
        t = t.cuda()
    wait_or_raise(dist.all_reduce(t, group=group, async_op=True), timeout_s, what)  # type: ignore[arg-type]
    return t.cpu().tolist()


def allreduce_max(values: list[float], timeout_s: float, what: str) -> list[float]:
    """The largest of each of ``values`` over the ranks of the world, waiting at most ``timeout_s``."""
    t = torch.tensor(values, dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    wait_or_raise(dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True), timeout_s, what)  # type: ignore[arg-type]
    return t.cpu().tolist()


def restart_count() -> int:
    """How many times torchrun's elastic agent has restarted this job's workers (``--max-restarts``); 0 at first."""
    return int(os.environ.get(RESTART_ENV, "0"))


def barrier(timeout_s: float, what: str = "barrier") -> None:
    """A barrier over the world that gives up after ``timeout_s`` seconds."""
    allreduce_sum([0.0], timeout_s, what)


class MetricsLog:
    """Per-epoch metrics written atomically to ``<out_dir>/metrics.json`` after every epoch (rank 0).

    Each row: ``epoch`` (1-based), ``epoch_time_s`` (training part), ``train_loss`` (mean cross-entropy),
    ``val_accuracy`` (fraction), ``samples_per_s`` (training samples / epoch_time_s), ``wall_time_s``
    (cumulative since training started, evaluation included, the per-epoch model writes of ``score_epochs``
    excluded), plus extra keys given by the worker; ``pipedream train`` adds the model's scored metric
    (``bleu``, ``bleu4``) after training.
    """

    def __init__(self, out_dir: Path, rows: list[dict[str, float]] | None = None) -> None:
        self.path = out_dir / "metrics.json"
        self.rows = list(rows or [])

    def add(self, row: dict[str, float]) -> None:
        self.rows.append(row)
        atomic_write_json(self.path, self.rows)


def run_device() -> torch.device:
    """This rank's device: the CPU on gloo, the current CUDA device on NCCL."""
    return torch.device("cpu") if dist.get_backend() == "gloo" else torch.device("cuda", torch.cuda.current_device())


def log_epoch(row: dict[str, float], log: MetricsLog, writes: bool, bar: Any) -> None:
    """The end of an epoch: the progress bar (None: none) shows its loss and accuracy; where ``writes`` (rank 0),
    ``row`` is appended to ``metrics.json``."""
    if bar is not None:
        bar.set_postfix(loss=f"{row['train_loss']:.3f}", acc=f"{row['val_accuracy']:.3f}")
    if writes:
        log.add(row)


def fault(rank: int) -> tuple[int, signal.Signals] | None:
    """``$PIPEDREAM_FAULT_KILL = "rank:minibatch[:SIGNAL]"`` (tests): ``(minibatch, signal)`` if it is for this
    rank, which then sends itself the signal (default SIGKILL; ``STOP`` freezes it) after that minibatch of the run
    (counted from 0 over all epochs; DP: that optimizer step) (:func:`inject_fault`), in the job's first attempt
    only (a restarted job runs clean)."""
    spec = os.environ.get(FAULT_ENV)
    if not spec or restart_count():
        return None
    r, m, *sig = spec.split(":")
    return (int(m), signal.Signals[f"SIG{sig[0] if sig else 'KILL'}"]) if int(r) == rank else None


def inject_fault(out_dir: Path, sig: signal.Signals, epoch: int, minibatch: int) -> None:
    """Note the fault (``<out_dir>/fault.json``: when, and after how many minibatches of which epoch), then send
    ``sig`` to this process: how tests and ``benchmarks/checkpoint`` measure the recovery and the work lost."""
    atomic_write_json(out_dir / "fault.json", {"unix_s": time.time(), "epoch": epoch, "minibatch": minibatch})
    os.kill(os.getpid(), sig)


class PeerFailed(PipeDreamError):
    """This rank gives up because another one failed (the other one says why)."""


def peer_failed(e: BaseException) -> bool:
    """Whether ``e`` means another rank failed (a timeout or a broken connection), not this one."""
    return isinstance(e, CommTimeout | PeerFailed | dist.DistError) or "Connection closed by peer" in str(e)


def run_guarded(main: Callable[[], None], out_dir: Path, rank: int) -> None:
    """Run ``main``; on any error write a one-line reason to ``out_dir/errors/rank<r>.txt`` and exit 1, or
    :data:`~pipedream.runtime.supervise.PEER_FAILED` when the error says another rank failed (:func:`peer_failed`).

    The process exits with ``os._exit`` (status 1 on an error, else 0 after destroying the process groups) so
    that neither a broken process group nor the interpreter's teardown can hang or abort the shutdown.
    """
    try:
        main()
    except BaseException as e:  # noqa: BLE001 - every failure must end the process visibly
        if isinstance(e, SystemExit) and not e.code:
            raise
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        if not isinstance(e, PipeDreamError):
            reason = f"{type(e).__name__}: {reason}"
            traceback.print_exc(file=sys.stderr)
        line = f"rank {rank} failed: {reason}"
        with contextlib.suppress(OSError):
            atomic_write_text(out_dir / "errors" / f"rank{rank}.txt", f"{time.time():.3f} {line}\n")
        print(f"error: {line}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(PEER_FAILED if peer_failed(e) else 1)
    if dist.is_initialized():
        dist.destroy_process_group()
    # Skip the interpreter's finalization: gloo's worker threads may still hold finished work whose tensors,
    # destroyed while Python tears down, abort the process (SIGABRT). Everything the run writes is written by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def progress_bar(cfg: TrainConfig, enabled: bool, total: int):  # type: ignore[no-untyped-def]
    """A tqdm bar of ``total`` minibatches when ``cfg.progress`` and ``enabled`` (one rank), else None; on stdout:
    ``pipedream train`` shows the workers' stdout and keeps their stderr for train.log."""
    if not (cfg.progress and enabled):
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="mb", mininterval=2.0, dynamic_ncols=True, leave=True, file=sys.stdout)


def worker_main(argv: list[str] | None, prog: str, doc: str | None, mode: str,
                train: Callable[[TrainConfig], None]) -> None:
    """torchrun entry point of a worker: parse the options of :class:`TrainConfig`, then ``train`` it under
    :func:`run_guarded` (errors to ``<run_dir(mode)>/errors``)."""
    parser = argparse.ArgumentParser(prog=prog, description=doc)
    add_arguments(parser)
    cfg = from_args(parser.parse_args(argv))
    rank = int(os.environ.get("RANK", "0"))
    if restart_count():  # a failed attempt's reason is not this one's
        (cfg.run_dir(mode) / "errors" / f"rank{rank}.txt").unlink(missing_ok=True)
    die_with_parent()
    keep_freed_memory()  # where the launcher did not preload jemalloc, glibc keeps freed memory (pipedream/allocator.py)

    def _run() -> None:
        init(cfg.comm_timeout_s)
        train(cfg)

    run_guarded(_run, cfg.run_dir(mode), rank)
