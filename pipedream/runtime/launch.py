"""Start the workers of a run and wait for them: under torchrun, or from a fork server.

:func:`pipedream.train` (and through it ``pipedream train``) starts every run here, with one of two launchers:

* ``torchrun``: :func:`torchrun_command` builds ``python -m torch.distributed.run --standalone
  --nproc_per_node=W -m <entry> <options>`` (or its multi-node form) and :func:`run_torchrun` runs it
  supervised (:mod:`pipedream.runtime.supervise`): the workers' progress goes to stderr and
  ``<out_dir>/train.log``, and whatever ends the run (a rank's failure, the timeout, an interrupt), every
  process it started is killed, with one short line naming the rank that failed first. The model is a
  name the workers build (a registered model or ``package.module:function``).
* ``local``: :func:`spawn_local` starts ``W`` processes from a ``forkserver`` (seconds faster than
  torchrun on a small machine) and accepts a ``model_factory`` that cannot go through a command line.

:func:`following` calls back with a run's epochs as the workers append them to ``metrics.json``.

Why not a plain ``fork`` of the caller: PyTorch refuses to fork a process that has touched CUDA or run a
backward pass. The fork server is a fresh interpreter that imports torch and the runtime once (:data:`PRELOAD`)
and touches neither; each worker is forked from it. What is handed to a worker is pickled, so ``fn`` and the
config's ``model_factory`` must be module-level functions (or classes).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from pipedream.allocator import JEMALLOC, wants_jemalloc, worker_env
from pipedream.errors import PipeDreamError
from pipedream.placement import ranks_per_host
from pipedream.runtime.config import TrainConfig

WORKER_MODULE = "pipedream.runtime.worker"
DP_MODULE = "pipedream.baselines.ddp"
TORCH_WORKER_MODULE = "pipedream.runtime.torch_worker"  # --runtime torch
LAUNCHERS = ("local", "torchrun")
START_METHOD = "forkserver"
# OMP_NUM_THREADS of every worker: W workers want W x this many cores (pipedream.sim.predict models sharing)
WORKER_THREADS = 1
ERROR_CHARS = 200  # the longest error line `pipedream train` prints, "error: " included
# imported once by the fork server, not once per worker (optimizers import torch._dynamo lazily: seconds)
PRELOAD = ["torch", "torch._dynamo", WORKER_MODULE]


def torchrun_command(entry_module: str, cfg: TrainConfig, workers: int, nnodes: int = 1,
                     rdzv_endpoint: str | None = None, run_id: str = "pipedream", max_restarts: int = 0) -> list[str]:
    """The torchrun command line that runs ``entry_module`` on ``workers`` processes in all.

    One node: ``--standalone``. Several nodes (the same command started once on each node, e.g. by
    ``srun``): ``workers / nnodes`` processes a node, c10d rendezvous at ``rdzv_endpoint`` (host:port).
    ``max_restarts``: torchrun's ``--max-restarts``: when a worker fails, its elastic agent stops the others and
    starts them all again, at most this many times; the workers then resume from the newest complete checkpoint
    (:mod:`pipedream.runtime.checkpoint`).

    Raises:
        PipeDreamError: if ``workers`` is not a multiple of ``nnodes`` or the endpoint is missing.
    """
    check_nodes(workers, nnodes, rdzv_endpoint)
    per_node = f"--nproc_per_node={ranks_per_host(workers, nnodes)}"
    if nnodes == 1:
        where = ["--standalone", per_node]
    else:
        where = [f"--nnodes={nnodes}", per_node, "--rdzv_backend=c10d",
                 f"--rdzv_endpoint={rdzv_endpoint}", f"--rdzv_id={run_id}"]
    return [sys.executable, "-m", "torch.distributed.run", *where, f"--max-restarts={max_restarts}",
            "--monitor-interval=0.5", "-m", entry_module, *cfg.to_args()]


def check_nodes(workers: int, nnodes: int, rdzv_endpoint: str | None) -> None:
    """Refuse a multi-node layout torchrun cannot start: ``workers`` not a multiple of ``nnodes``, or no endpoint.

    Raises:
        PipeDreamError: naming the fix.
    """
    if nnodes < 1:
        raise PipeDreamError(f"--nnodes must be positive, not {nnodes}")
    if nnodes > 1 and (workers % nnodes or not rdzv_endpoint):
        raise PipeDreamError(f"--workers {workers} over --nnodes {nnodes} needs a whole number of workers "
                             "a node and --rdzv-endpoint HOST:PORT")


def free_port() -> int:
    """An unused local TCP port for the rendezvous of :func:`spawn_local`."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _child(index: int, fn: Callable[[TrainConfig], None], cfg: TrainConfig, world: int, port: int,
           env: dict[str, str]) -> None:
    from pipedream.runtime import distributed as D
    from pipedream.runtime.supervise import die_with_parent

    die_with_parent()  # with the fork server, which dies with the caller's process
    os.environ.update(env)
    os.environ.update({"RANK": str(index), "WORLD_SIZE": str(world), "LOCAL_RANK": str(index),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": str(WORKER_THREADS)})

    def run() -> None:
        D.init(cfg.comm_timeout_s)
        fn(cfg)

    D.run_guarded(run, cfg.run_dir("pipedream"), index)


def spawn_local(cfg: TrainConfig, workers: int, fn: Callable[[TrainConfig], None] | None = None,
                env: dict[str, str] | None = None, timeout_s: float = 120.0) -> None:
    """Start ``workers`` processes running ``fn(cfg)`` (default: the PipeDream worker) and wait for them.

    ``fn`` and ``cfg`` are pickled to the workers (see the module docstring), which start from a fork
    server: safe where the caller has used CUDA or autograd already.

    Raises:
        PipeDreamError: a worker failed (its one-line reason from ``out_dir/errors``) or the run timed out
            (``timeout_s``, seconds); every worker is gone before this (or an interrupt) propagates.
    """
    import torch.multiprocessing as mp  # here, not at the top: `pipedream train` checks its options before torch loads

    if fn is None:
        from pipedream.runtime.worker import train as fn
    start_method()
    ctx = mp.start_processes(_child, args=(fn, cfg, workers, free_port(), env or {}), nprocs=workers,
                             join=False, start_method=START_METHOD)
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=0.5):
            if time.monotonic() > deadline:
                raise PipeDreamError(f"local run did not finish within {timeout_s:.0f} s")
    except (mp.ProcessExitedException, mp.ProcessRaisedException):
        raise PipeDreamError(_blame(ctx.processes, cfg.run_dir("pipedream"))) from None
    finally:  # whatever ended the wait (a failure, the timeout, an interrupt), no worker is left running
        for proc in ctx.processes:
            if proc.is_alive():
                proc.kill()
        for proc in ctx.processes:
            proc.join(timeout=5)


def _blame(processes: list, out_dir: Path) -> str:  # type: ignore[type-arg]
    """The rank that failed first among ``processes`` (ended; index = rank), by their exit codes
    (:meth:`pipedream.runtime.supervise.End.blame_order`), with its own reason where it wrote one."""
    from pipedream.runtime.supervise import End

    ends = [End(r, 0.0, *((None, -p.exitcode) if (p.exitcode or 0) < 0 else (p.exitcode, None)))
            for r, p in enumerate(processes)]
    first = min((e for e in ends if e.failed), key=lambda e: (e.blame_order(), e.rank), default=None)
    if first is None:
        return "a worker failed"
    reason = _worker_reason(out_dir, first.rank) if first.status == 1 else ""
    return f"rank {first.rank} failed: {reason}" if reason else f"rank {first.rank} {first.how()}"


def start_method() -> str:
    """Ask the fork server to preload :data:`PRELOAD` (takes effect when it starts); returns the method."""
    import torch.multiprocessing as mp

    mp.get_context(START_METHOD).set_forkserver_preload(PRELOAD)
    return START_METHOD


def workers_allocator() -> dict[str, str]:
    """The workers' allocator variables (:func:`pipedream.allocator.worker_env`: jemalloc preloaded); one warning
    line where jemalloc is wanted and not installed (the workers then keep glibc's freed memory)."""
    env = worker_env()
    if not env and wants_jemalloc():
        print(f"warning: {JEMALLOC} not found: the workers run on glibc's malloc with freed memory kept, whose heap "
              "fragments in a long run (pipedream/allocator.py); install it (Debian: apt-get install libjemalloc2, "
              "conda: conda install -c conda-forge jemalloc; elsewhere: PIPEDREAM_JEMALLOC=/path/to/libjemalloc.so.2) "
              "or set PIPEDREAM_MALLOC=keep to silence this",
              file=sys.stderr)
    return env


def run_torchrun(cmd: list[str], out_dir: Path, timeout_s: float, max_restarts: int = 0) -> None:
    """Run the torchrun command ``cmd`` (:func:`torchrun_command`) and wait for it; the workers' stdout (progress)
    goes to stderr and ``out_dir/train.log``, everything else (warnings, tracebacks, torchrun's report) to
    ``train.log`` only. While ``max_restarts`` (``cmd``'s ``--max-restarts``) are left, a failed worker is left to
    torchrun's agent, which restarts the job.

    Whatever ends the run (a worker's failure, the timeout of ``timeout_s`` seconds, SIGINT/SIGTERM turned into
    :class:`~pipedream.runtime.supervise.Interrupted`), every process it started is SIGKILLed and gone, and
    the log is closed, before this returns or raises (:mod:`pipedream.runtime.supervise`).

    Raises:
        PipeDreamError: one line (at most :data:`ERROR_CHARS` with ``error: ``) naming the rank that failed
            first and its signal or exit status, or the timeout.
        KeyboardInterrupt: after the cleanup.
    """
    from pipedream.runtime import supervise as S

    env = {**os.environ, **workers_allocator(), "OMP_NUM_THREADS": str(WORKER_THREADS), "PYTHONUNBUFFERED": "1",
           S.LAUNCHER_PID_ENV: str(os.getpid())}
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = out_dir / "train.log"
    rc = None
    with log_path.open("wb") as log:
        # its own session (a terminal's Ctrl-C reaches only this process, which ends the job); dies with us
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True,
                                preexec_fn=S.pdeathsig_kill)
        pumps = [threading.Thread(target=_pump, args=(proc.stdout, [sys.stderr.buffer, log]), daemon=True),
                 threading.Thread(target=_pump, args=(proc.stderr, [log]), daemon=True)]
        for t in pumps:
            t.start()
        watch = S.Watch(proc.pid)
        try:
            rc = S.supervise(watch, proc.poll, time.monotonic() + timeout_s, max_restarts=max_restarts)
        finally:
            if rc is None:  # a failure torchrun is slow to end, the timeout, or an interrupt
                watch.kill_all()
                proc.wait()
            for t in pumps:
                t.join(timeout=5)
    if rc == 0:
        return
    if rc is None and not watch.failures_seen:
        raise PipeDreamError(_clip(f"training did not finish within --timeout-s {timeout_s:g} s", f"log: {log_path}"))
    first = watch.first_failure(S.torchrun_summary(log_path.read_text(errors="replace")))
    if first is None or (rc is not None and rc < 0):  # torchrun itself killed (its workers die with it)
        how = f"was killed by {signal.Signals(-rc).name}" if rc is not None and rc < 0 else f"exited with status {rc}"
        raise PipeDreamError(_clip(f"training failed: torchrun {how}", f"log: {log_path}"))
    reason = _worker_reason(out_dir, first.rank) if first.status not in (None, S.PEER_FAILED) else ""
    raise PipeDreamError(_clip(f"training failed: rank {first.rank} {first.how()}", f"log: {log_path}", reason))


def _pump(src: IO[bytes], sinks: list[IO[bytes]]) -> None:
    """Copy a child's output to the terminal and the log as it comes (progress bars included)."""
    while chunk := src.read1(4096):  # type: ignore[attr-defined]
        for s in sinks:
            s.write(chunk)
            s.flush()


def _clip(what: str, where: str, reason: str = "") -> str:
    """``what[: reason]; where`` in at most ERROR_CHARS - len("error: ") characters, shortening the reason."""
    room = ERROR_CHARS - len("error: ") - len(what) - len(where) - 2
    if reason and room > 10:
        reason = reason if len(reason) + 2 <= room else reason[:room - 5] + "..."
        what = f"{what}: {reason}"
    return f"{what}; {where}"[:ERROR_CHARS - len("error: ")]


def _worker_reason(out_dir: Path, rank: int) -> str:
    """The one-line reason rank ``rank`` wrote when it failed (``errors/rank<r>.txt``), without its prefix."""
    try:
        text = (out_dir / "errors" / f"rank{rank}.txt").read_text().strip()
    except OSError:
        return ""
    return text.split(" ", 1)[-1].removeprefix(f"rank {rank} failed: ")


@contextmanager
def following(metrics_path: Path, on_epochs: Callable[[list[dict[str, Any]]], None] | None,
              every_s: float = 2.0) -> Iterator[None]:
    """Within the block, call ``on_epochs(rows)`` from a thread with every row of ``metrics_path`` so far each
    time it has grown (the workers rewrite it atomically at the end of each epoch), looking every ``every_s``
    seconds and once more when the block ends, for whatever reason (the thread is joined before the block
    is left). None: nothing is followed.

    A file that cannot be read yet, or a callback that raises OSError or ValueError, is tried again at the next look.
    """
    if on_epochs is None:
        yield
        return
    stop = threading.Event()
    watcher = threading.Thread(target=_follow, args=(on_epochs, metrics_path, stop, every_s), daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join(timeout=30)


def _follow(on_epochs: Callable[[list[dict[str, Any]]], None], metrics_path: Path, stop: threading.Event,
            every_s: float) -> None:
    seen = 0  # rows handed over so far
    while True:
        stopping = stop.wait(every_s)
        try:
            rows = json.loads(metrics_path.read_text()) if metrics_path.is_file() else []
            if len(rows) > seen:
                on_epochs(rows)
                seen = len(rows)
        except (OSError, ValueError):
            pass  # a later look (or the last one) hands them over
        if stopping:
            return
