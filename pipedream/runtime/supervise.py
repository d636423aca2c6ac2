"""Watch the workers of a torchrun job, blame the rank that failed first, and leave no process behind.

torchrun starts every worker in a session of its own, so killing torchrun's process group does not reach
them. Three things make sure a run's processes end with it:

* every worker asks the kernel to SIGKILL it when its parent (torchrun's agent) dies
  (:func:`die_with_parent`, ``prctl(PR_SET_PDEATHSIG)``); the launcher asks the same for torchrun
  (:func:`pdeathsig_kill`), so a ``kill -9`` of ``pipedream train`` or of torchrun takes the workers along;
* :class:`Watch` polls the workers (children of torchrun, rank from their ``RANK``) every 50 ms and notices
  the first failure itself, without torchrun's 30 s grace for a worker that ignores SIGTERM (a frozen one);
* :meth:`Watch.kill_all` SIGKILLs torchrun's process group and every worker's session, and waits until they
  are gone.

With torchrun's ``--max-restarts``, a failure is left to torchrun while restarts are left: its elastic agent
stops the other workers and starts a new generation (``TORCHELASTIC_RESTART_COUNT`` in their environment), which
:class:`Watch` then follows; a stopped worker, which torchrun's SIGTERM cannot end, is SIGKILLed first.

Who failed first is read from the workers' own ends: a worker killed by a signal, or stopped (SIGSTOP), is
the cause; one that exits with status 1 failed by itself (``pipedream.runtime.distributed.run_guarded``);
one that exits with :data:`PEER_FAILED` gave up because a peer stopped answering. A worker's exit status is
read from ``/proc/<pid>/stat`` while it is a zombie (torchrun reaps it within ``--monitor-interval``), else
from torchrun's failure summary.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

PEER_FAILED = 3  # exit status of a worker that failed because a peer did (a broken link, a timeout)
LAUNCHER_PID_ENV = "PIPEDREAM_LAUNCHER_PID"  # set by `pipedream train` for its workers
_PR_SET_PDEATHSIG = 1


class Interrupted(KeyboardInterrupt):
    """``pipedream train`` got SIGINT or SIGTERM (``signum``); a KeyboardInterrupt, so cleanup code runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def pdeathsig_kill() -> None:
    """Ask the kernel to SIGKILL this process when the thread that started it exits (Linux; a no-op elsewhere)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def die_with_parent() -> None:
    """Make this worker die with its parent (torchrun's agent or the fork server): see :func:`pdeathsig_kill`.

    If the parent is already gone (this process was reparented to init or to the launcher), exit with
    :data:`PEER_FAILED` at once.
    """
    pdeathsig_kill()
    orphaned = {1, int(os.environ.get(LAUNCHER_PID_ENV, "1"))}
    if os.getppid() in orphaned:
        os._exit(PEER_FAILED)


@contextmanager
def signals_raise() -> Iterator[None]:
    """Within the block, SIGINT or SIGTERM raises :class:`Interrupted` in the main thread once (later ones are
    ignored until the block ends; the handlers are restored after)."""

    def handler(signum: int, frame: object) -> None:
        for s in old:  # the cleanup that follows is bounded: a second Ctrl-C must not cut it short
            signal.signal(s, signal.SIG_IGN)
        raise Interrupted(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@dataclass
class End:
    """How one worker ended, as far as seen: ``status`` (exit status) or ``signum``; both None = unknown."""

    rank: int
    seen_s: float  # time.monotonic() when it was seen
    status: int | None = None
    signum: int | None = None
    stopped: bool = False  # seen stopped (SIGSTOP) while the job failed, not ended

    def blame_order(self) -> int:
        """Smaller = more likely the cause: a fatal signal, stopped, its own error, unknown, SIGTERM, a peer's fault."""
        if self.signum is not None:
            return 4 if self.signum in (signal.SIGTERM, signal.SIGINT) else 0
        if self.stopped:
            return 1
        if self.status is None:
            return 3
        return 5 if self.status == PEER_FAILED else 2

    def how(self) -> str:
        """``"was killed by SIGKILL"``, ``"exited with status 1"``, ``"was stopped (SIGSTOP)"`` ..."""
        if self.signum is not None:
            return f"was killed by {signal.Signals(self.signum).name}"
        if self.stopped:
            return "was stopped (SIGSTOP) and stopped answering"
        if self.status is None:
            return "ended (exit status unknown)"
        return f"exited with status {self.status}"

    @property
    def failed(self) -> bool:
        return self.stopped or self.signum is not None or self.status not in (0, None)


def _zombie_status(pid: int) -> tuple[int | None, int | None] | None:
    """``(status, signal)`` of a zombie from ``/proc/<pid>/stat``'s exit_code; None if not a zombie (or gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] != "Z" or len(fields) < 50:
        return None
    code = int(fields[49])  # field 52, exit_code, in waitpid(2) form
    return (None, code & 0x7F) if code & 0x7F else ((code >> 8) & 0xFF, None)


POLL_S = 0.05  # between polls of torchrun and its workers: a dead worker is a zombie for at most torchrun's 0.5 s,
# and a frozen one must be seen stopped before torchrun reacts to the others' ends
FIND_S = 1.0  # between searches for new workers (psutil reads every process's /proc/<pid>/stat to find children)
# how long torchrun may take from a worker's failure to a new generation of workers: its SIGTERM to the others and
# their end (it waits up to 30 s for one that ignores SIGTERM), then the rendezvous and the start of new processes
RESTART_S = 60.0


class Watch:
    """The workers of one torchrun ``agent`` and how each ended; call :meth:`poll` every :data:`POLL_S`.

    A poll reads two ``/proc`` files per worker; the search for new workers (every process's ``/proc`` entry)
    runs at most every :data:`FIND_S`: the launcher shares the host's cores with the workers it watches, and
    searching at every poll took a quarter of one.
    """

    def __init__(self, agent_pid: int) -> None:
        self.agent_pid = agent_pid
        self._found_at = -FIND_S
        self.workers: dict[int, psutil.Process] = {}  # rank -> process, of the newest generation
        self.ends: dict[int, End] = {}
        self.restarts = 0  # the newest generation seen: torchrun's restarts so far
        self.failures_seen = False  # set by supervise(): it stopped waiting because workers ended or failed

    def _find(self) -> None:
        if time.monotonic() - self._found_at < FIND_S:
            return
        self._found_at = time.monotonic()
        try:
            children = psutil.Process(self.agent_pid).children()
        except psutil.Error:
            return
        known = {p.pid for p in self.workers.values()}
        for p in children:
            if p.pid in known:
                continue
            try:
                env = p.environ()
            except psutil.Error:
                continue
            if env.get("RANK") is None:
                continue
            generation = int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))
            if generation > self.restarts:  # torchrun restarted the job: follow the new workers
                self.restarts, self.workers, self.ends = generation, {}, {}
            if generation == self.restarts:
                self.workers[int(env["RANK"])] = p

    def poll(self) -> None:
        """Find new workers and note every worker that has ended (with its status while it is a zombie)."""
        self._find()
        now = time.monotonic()
        for rank, p in self.workers.items():
            if rank in self.ends:
                continue
            zombie = _zombie_status(p.pid)
            if zombie is not None:
                self.ends[rank] = End(rank, now, *zombie)
            elif not p.is_running():
                self.ends[rank] = End(rank, now)
            elif self.ends:  # another worker has ended: one that is stopped will not follow
                try:
                    if p.status() == psutil.STATUS_STOPPED:
                        self.ends[rank] = End(rank, now, stopped=True)
                except psutil.Error:
                    pass

    def failed(self) -> bool:
        """Whether some worker is known to have failed."""
        return any(e.failed for e in self.ends.values())

    def first_failure(self, summary: dict[int, int]) -> End | None:
        """The worker that failed first; ``summary``: rank -> exit code from torchrun's report (fills unknowns)."""
        for rank, code in summary.items():
            e = self.ends.get(rank)
            if e is not None and e.status is None and e.signum is None and not e.stopped:
                e.status, e.signum = (None, -code) if code < 0 else (code, None)
        failed = [e for e in self.ends.values() if e.failed or (e.status is None and e.signum is None)]
        return min(failed, key=lambda e: (e.blame_order(), e.seen_s, e.rank), default=None)

    def kill_stopped(self) -> None:
        """SIGKILL the workers seen stopped (SIGSTOP), so that torchrun sees them fail."""
        for rank, e in self.ends.items():
            if e.stopped:
                with contextlib.suppress(psutil.Error):
                    self.workers[rank].kill()

    def kill_all(self, timeout_s: float = 5.0) -> list[int]:
        """SIGKILL torchrun's process group and every worker's session; wait until all are gone.

        Returns:
            the pids still alive after ``timeout_s`` seconds (empty when all are gone).
        """
        procs = list(self.workers.values())
        with contextlib.suppress(psutil.Error):
            agent = psutil.Process(self.agent_pid)
            procs += [agent, *agent.children(recursive=True)]
        for pid in {self.agent_pid, *(p.pid for p in self.workers.values())}:
            _killpg(pid)
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.kill()
        _, alive = psutil.wait_procs(procs, timeout=timeout_s)
        return [p.pid for p in alive]


def _killpg(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (torchrun and each worker lead their own); no error if gone."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def torchrun_summary(log_text: str) -> dict[int, int]:
    """rank -> exit code of every failure in torchrun's ``ChildFailedError`` report (negative: a signal)."""
    found = re.findall(r"rank\s*:\s*(\d+).*?\n\s*exitcode\s*:\s*(-?\d+)", log_text)
    return {int(r): int(c) for r, c in found}


def supervise(watch: Watch, poll: Callable[[], int | None], deadline_s: float, grace_s: float = 2.0,
              unknown_grace_s: float = 5.0, max_restarts: int = 0) -> int | None:
    """Poll torchrun (``poll``: its ``Popen.poll``) and its workers (``watch``) until torchrun exits, or it
    has not ended the job ``grace_s`` seconds after a worker failed (``unknown_grace_s`` after one ended with a
    status not seen: at the end of a good run all end together), or ``deadline_s`` (``time.monotonic()``) passes.
    A worker seen stopped (SIGSTOP) ends the wait at once: torchrun's SIGTERM cannot reach it, so torchrun
    would only wait out its own 30 s grace.

    While fewer than ``max_restarts`` restarts have happened, a failure is torchrun's to handle: a stopped worker
    is SIGKILLed, and the wait ends only if no new generation of workers follows within :data:`RESTART_S`.

    Returns:
        torchrun's exit status, or None if it is still running.
    """
    failed_at = ended_at = None
    generation = 0
    while True:
        rc = poll()
        watch.poll()
        if rc is not None:
            return rc
        now = time.monotonic()
        if watch.restarts != generation:  # a new generation of workers: its failures are counted afresh
            generation, failed_at, ended_at = watch.restarts, None, None
        if failed_at is None and watch.failed():
            failed_at = now
        if ended_at is None and watch.ends:
            ended_at = now
        stopped = any(e.stopped for e in watch.ends.values())
        if watch.restarts < max_restarts:
            if stopped:
                watch.kill_stopped()
            since = failed_at if failed_at is not None else ended_at
            late = since is not None and now - since > RESTART_S
        else:
            late = stopped or (failed_at is not None and now - failed_at > grace_s) or (
                ended_at is not None and now - ended_at > unknown_grace_s)
        if late or now > deadline_s:
            watch.failures_seen = late
            return None
        time.sleep(POLL_S)
