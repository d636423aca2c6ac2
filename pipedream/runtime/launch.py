"""Start the workers of a run: with torchrun (``pipedream train``), or from a fork server (tests, benchmarks).

:func:`torchrun_command` builds ``python -m torch.distributed.run --standalone --nproc_per_node=W -m
<entry> <options>``; torchrun stops every worker as soon as one fails, so a crashed or killed rank
ends the job. :func:`spawn_local` starts ``W`` processes from a ``forkserver`` (seconds faster than
torchrun on a small machine) and accepts a ``model_factory`` that cannot go through a command line.

Why not a plain ``fork`` of the caller: a process that has touched CUDA cannot be forked ("Cannot
re-initialize CUDA in forked subprocess"), and one that has run a backward pass refuses too
("Unable to handle autograd's threading in combination with fork-based multiprocessing"; both are
PyTorch's checks, see the "CUDA in multiprocessing" note of ``torch.multiprocessing``). The fork server
is a fresh interpreter that imports torch and the runtime once (:data:`PRELOAD`) and touches neither;
each worker is forked from it. What is handed to a worker is pickled, so ``fn`` and the config's
``model_factory`` must be module-level functions (or classes).
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch.multiprocessing as mp

from pipedream.errors import PipeDreamError
from pipedream.runtime.config import TrainConfig

WORKER_MODULE = "pipedream.runtime.worker"
DP_MODULE = "pipedream.baselines.ddp"
START_METHOD = "forkserver"
# imported once by the fork server, not once per worker (optimizers import torch._dynamo lazily: seconds)
PRELOAD = ["torch", "torch._dynamo", WORKER_MODULE]


def torchrun_command(entry_module: str, cfg: TrainConfig, workers: int, nnodes: int = 1,
                     rdzv_endpoint: str | None = None, run_id: str = "pipedream") -> list[str]:
    """The torchrun command line that runs ``entry_module`` on ``workers`` processes in all.

    One node: ``--standalone``. Several nodes (the same command started once on each node, e.g. by
    ``srun``): ``workers / nnodes`` processes a node, c10d rendezvous at ``rdzv_endpoint`` (host:port).

    Raises:
        PipeDreamError: if ``workers`` is not a multiple of ``nnodes`` or the endpoint is missing.
    """
    if nnodes == 1:
        where = ["--standalone", f"--nproc_per_node={workers}"]
    else:
        if workers % nnodes or not rdzv_endpoint:
            raise PipeDreamError(f"--workers {workers} over --nnodes {nnodes} needs a whole number of workers "
                                 "a node and --rdzv-endpoint HOST:PORT")
        where = [f"--nnodes={nnodes}", f"--nproc_per_node={workers // nnodes}", "--rdzv_backend=c10d",
                 f"--rdzv_endpoint={rdzv_endpoint}", f"--rdzv_id={run_id}"]
    return [sys.executable, "-m", "torch.distributed.run", *where,
            "--monitor-interval=0.5", "-m", entry_module, *cfg.to_args()]


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
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"})

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
        PipeDreamError: a worker failed (its one-line reason from ``out_dir/errors``) or the run timed out.
    """
    if fn is None:
        from pipedream.runtime.worker import train as fn
    start_method()
    ctx = mp.start_processes(_child, args=(fn, cfg, workers, free_port(), env or {}), nprocs=workers,
                             join=False, start_method=START_METHOD)
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=0.5):
            if time.monotonic() > deadline:
                for proc in ctx.processes:
                    proc.kill()
                raise PipeDreamError(f"local run did not finish within {timeout_s:.0f} s")
    except (mp.ProcessExitedException, mp.ProcessRaisedException):
        raise PipeDreamError(_blame(ctx.processes, cfg.run_dir("pipedream"))) from None


def _blame(processes: list, out_dir: Path) -> str:  # type: ignore[type-arg]
    """The rank that failed first among ``processes`` (ended; index = rank), by their exit codes
    (:meth:`pipedream.runtime.supervise.End.blame_order`), with its own reason where it wrote one."""
    from pipedream.runtime.supervise import End

    ends = [End(r, 0.0, *((None, -p.exitcode) if (p.exitcode or 0) < 0 else (p.exitcode, None)))
            for r, p in enumerate(processes)]
    first = min((e for e in ends if e.failed), key=lambda e: (e.blame_order(), e.rank), default=None)
    if first is None:
        return "a worker failed"
    reason = (out_dir / "errors" / f"rank{first.rank}.txt")
    text = reason.read_text().strip().split(" ", 1)[-1] if first.status == 1 and reason.is_file() else ""
    return text or f"rank {first.rank} {first.how()}"


def start_method() -> str:
    """Ask the fork server to preload :data:`PRELOAD` (takes effect when it starts); returns the method."""
    mp.get_context(START_METHOD).set_forkserver_preload(PRELOAD)
    return START_METHOD
