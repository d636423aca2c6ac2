"""Checkpoints in two phases, as CheckFreq makes them (Mohan et al., FAST'21): a snapshot, then a persist.

A checkpoint is taken at a *position* ``(epochs done, minibatches done in the next epoch)``, at a boundary
where every stage has finished the same minibatches (a PipeDream run flushes its pipeline there; a DP run is
at one between two optimizer steps). Both modes use the same two phases (:class:`Checkpointer`):

* **snapshot**, in the training loop: this rank's state (weights, stored weight versions, optimizer state, RNG,
  the metrics rows so far, its partial sums of the epoch in progress) is copied to host memory. It waits first
  for the previous persist, only if that is still running.
* **persist**, in a background thread while training goes on: the copy is written to
  ``<out_dir>/checkpoints/e<epochs>-m<minibatches>/rank<r>.pt`` through a temporary file, flushed to disk and
  renamed. Rank 0's thread then waits (at most ``timeout_s``) until every rank's part is there and writes
  ``COMPLETE`` last: a folder without it is incomplete and never resumed from. Rank 0 keeps the :data:`KEEP`
  newest complete checkpoints and removes older folders.

The data position is the position itself: each epoch's sample order is fixed by the seed and the epoch
(:func:`pipedream.data.fashion_mnist.minibatch_indices`), so a resumed run trains the minibatches after the
position, each sample of the epoch once. Files are read with ``torch.load(weights_only=True)``
(:func:`restore`). The interval between checkpoints: :func:`pipedream.costmodel.checkpoint_interval`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import torch

from pipedream import costmodel
from pipedream.errors import PipeDreamError
from pipedream.io import atomic_write_json, atomic_write_text
from pipedream.runtime import distributed as D

MARKER = "COMPLETE"
KEEP = 2  # complete checkpoints kept: the newest, and one to fall back to if a part of it cannot be read
POLL_S = 0.05  # rank 0's look for the other ranks' parts
_NAME = re.compile(r"^e(\d+)-m(\d+)$")


def folder(out_dir: Path, position: tuple[int, int]) -> Path:
    """The folder of the checkpoint at ``position``."""
    return out_dir / "checkpoints" / f"e{position[0]}-m{position[1]}"


def positions(out_dir: Path) -> list[tuple[int, tuple[int, int]]]:
    """``(complete, position)`` of every checkpoint folder, newest first (complete: 1 if ``COMPLETE`` is written)."""
    found = [(int((p / MARKER).is_file()), (int(m[1]), int(m[2])))
             for p in (out_dir / "checkpoints").glob("e*-m*") if (m := _NAME.match(p.name))]
    return sorted(found, key=lambda f: f[1], reverse=True)


def complete_positions(out_dir: Path) -> list[tuple[int, int]]:
    """Every position with a complete checkpoint (its ``COMPLETE`` marker written), newest first."""
    return [pos for done, pos in positions(out_dir) if done]


def latest_complete(out_dir: Path) -> tuple[int, int]:
    """The newest position ``(epochs, minibatches)`` with a complete checkpoint, ``(0, 0)`` if none."""
    return max(complete_positions(out_dir), default=(0, 0))


def to_host(obj: Any) -> Any:
    """A copy of ``obj`` (dicts, lists, tuples of tensors and plain values) whose tensors are fresh CPU tensors:
    what training does next cannot change it."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: to_host(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(to_host(v) for v in obj)
    return obj


class Checkpointer:
    """This rank's checkpoints: :meth:`snapshot` in the loop, the persist in a background thread (module docstring).

    Attributes:
        snapshot_s: seconds of each snapshot taken (the copy alone), in order.
        persist_s: seconds of each persist finished (the write, and on rank 0 the wait for the others' parts).
    """

    def __init__(self, out_dir: Path, rank: int, world: int, timeout_s: float) -> None:
        self.out_dir, self.rank, self.world, self.timeout_s = out_dir, rank, world, timeout_s
        self.snapshot_s: list[float] = []
        self.persist_s: list[float] = []
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def snapshot(self, position: tuple[int, int], state: dict[str, Any]) -> float:
        """Copy ``state`` (this rank's part of the checkpoint at ``position``) to host memory and start its persist.

        Returns:
            the seconds the loop was held: the copy and any wait for the previous persist.
        Raises:
            OSError: the previous persist failed (a full disk, ...).
        """
        t0 = time.perf_counter()
        self.wait()
        t1 = time.perf_counter()
        copy = to_host(state)
        done = time.perf_counter()
        self.snapshot_s.append(done - t1)
        self._thread = threading.Thread(target=self._persist, args=(position, copy), daemon=True,
                                        name=f"checkpoint-e{position[0]}-m{position[1]}")
        self._thread.start()
        return done - t0

    def wait(self) -> None:
        """Wait until the persist in flight (if any) has finished; re-raise its error."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _persist(self, position: tuple[int, int], state: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        try:
            d = folder(self.out_dir, position)
            d.mkdir(parents=True, exist_ok=True)
            tmp = d / f".rank{self.rank}.pt.tmp"
            with tmp.open("wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            tmp.replace(d / f"rank{self.rank}.pt")
            if self.rank == 0:
                self._complete(d, position)
        except BaseException as e:  # noqa: BLE001 - raised in the training thread by the next wait()
            self._error = e
        self.persist_s.append(time.perf_counter() - t0)

    def _complete(self, d: Path, position: tuple[int, int]) -> None:
        """Rank 0: wait for every rank's part, then write ``COMPLETE`` and remove older checkpoints."""
        parts = [d / f"rank{r}.pt" for r in range(self.world)]
        deadline = time.monotonic() + self.timeout_s
        while not all(p.is_file() for p in parts):
            if time.monotonic() > deadline:
                missing = [p.name for p in parts if not p.is_file()]
                print(f"warning: checkpoint {d} is incomplete: {', '.join(missing)} not written within "
                      f"{self.timeout_s:g} s; it will not be resumed from", flush=True)
                return
            time.sleep(POLL_S)
        atomic_write_text(d / MARKER, f"{position[0]} {position[1]} {self.world}\n")
        kept = complete_positions(self.out_dir)[:KEEP]
        for done, pos in positions(self.out_dir):
            if pos not in kept and (done or pos < position):
                shutil.rmtree(folder(self.out_dir, pos), ignore_errors=True)


class Cadence:
    """Where an epoch's segments end and a checkpoint is taken: every ``every`` minibatches, never inside an epoch
    (None), or ``"auto"``: two probe segments of :attr:`probe` minibatches with a checkpoint after each, then the
    interval :func:`pipedream.costmodel.checkpoint_interval` chooses from what they measured (the largest over the
    ranks), rounded up to a multiple of ``step``.

    Args:
        every: the run's ``--checkpoint-every``.
        step: minibatches of one round (a segment is a multiple of it).
        stages: the pipeline's depth when a checkpoint adds a flush (1F1B, 2BW), else 1.
        bound: ``--checkpoint-overhead``.
    Attributes:
        every: the interval in force (None while probing or without mid-epoch checkpoints).
        cost: the measured costs the interval was chosen from (auto only).
    """

    def __init__(self, every: int | str | None, step: int, stages: int, bound: float) -> None:
        self.auto = every == "auto"
        self.step, self.stages, self.bound = step, stages, bound
        self.every = None if every is None or self.auto else self._rounded(int(every))
        self.probe = self._rounded(max(4, 2 * stages))
        self.probes: list[tuple[float, int]] = []  # (seconds, minibatches) of the probe segments
        self.cost: costmodel.CheckpointCost | None = None

    def _rounded(self, n: int) -> int:
        return -(-n // self.step) * self.step

    def count(self, remaining: int) -> int:
        """Minibatches of the next segment, ``remaining`` of the epoch left."""
        every = self.every or (self.probe if self.auto else remaining)
        return min(every, remaining)

    @property
    def due(self) -> bool:
        """Whether a checkpoint follows each segment that does not end the epoch."""
        return self.auto or self.every is not None

    def measured(self, segment_s: float, minibatches: int, ck: Checkpointer, timeout_s: float) -> None:
        """Note a probe segment after its checkpoint (every rank, at the same segments); after the second, choose
        the interval (a collective)."""
        if not self.auto or self.every is not None:
            return
        self.probes.append((segment_s, minibatches))
        if len(self.probes) < 2 or len(ck.snapshot_s) < 2:  # the second snapshot waited for the first's persist
            return
        seg_s, n = self.probes[-1]  # the second: its training shared the host with the first's persist
        flush = costmodel.flush_s(seg_s, n, self.stages)
        mine = [(seg_s - flush) / n, max(ck.snapshot_s), ck.persist_s[0], flush]
        self.cost = costmodel.CheckpointCost(*D.allreduce_max(mine, timeout_s, "checkpoint interval choice"))
        self.every = self._rounded(costmodel.checkpoint_interval(self.cost, self.bound))

    def state(self) -> dict[str, Any]:
        """What a resumed run needs to cut its segments where this one does."""
        cost = [] if self.cost is None else [self.cost.minibatch_s, self.cost.snapshot_s, self.cost.persist_s,
                                              self.cost.flush_s]
        return {"every": self.every, "probes": [list(p) for p in self.probes], "cost": cost}

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue with a checkpoint's cadence (auto: its chosen interval, or its probing so far)."""
        if self.auto:
            self.every = state["every"]
            self.probes = [(float(s), int(n)) for s, n in state["probes"]]
            self.cost = costmodel.CheckpointCost(*state["cost"]) if state["cost"] else None

    def figures(self, stall_s: float, checkpoints: int, epoch_s: float) -> dict[str, float]:
        """An epoch's checkpoint figures for its metrics row: ``checkpoint_s`` (the loop held by its ``checkpoints``
        mid-epoch snapshots, s) and, once the interval is known, ``checkpoint_every``; with auto also the costs it was
        chosen from (``checkpoint_minibatch_s``, ``checkpoint_snapshot_s``, ``checkpoint_persist_s``,
        ``checkpoint_flush_s``), the overhead they
        predict (``checkpoint_overhead_predicted``) and the one measured, the stalls and the flushes (estimated from
        the probe) over the rest of the epoch's ``epoch_s`` (``checkpoint_overhead``)."""
        row = {"checkpoint_s": stall_s, "checkpoints": float(checkpoints)}
        if self.every is not None:
            row["checkpoint_every"] = float(self.every)
        if self.cost is not None and self.every is not None:
            spent = stall_s + checkpoints * self.cost.flush_s
            row.update(checkpoint_minibatch_s=self.cost.minibatch_s, checkpoint_snapshot_s=self.cost.snapshot_s,
                       checkpoint_persist_s=self.cost.persist_s, checkpoint_flush_s=self.cost.flush_s,
                       checkpoint_overhead_predicted=costmodel.checkpoint_overhead(self.cost, self.every),
                       checkpoint_overhead=spent / max(epoch_s - spent, 1e-9))
        return row


def note_restart(out_dir: Path, position: tuple[int, int] | None, restore_unix_s: float) -> None:
    """Rank 0 of a restarted job: append the restart (torchrun's count, the position resumed from, when its restore
    began (``restore_unix_s``), now) to ``<out_dir>/restarts.json``, which ``pipedream train`` logs to MLflow."""
    path = out_dir / "restarts.json"
    rows = json.loads(path.read_text()) if path.is_file() else []
    epoch, minibatch = position or (0, 0)
    rows.append({"restart": D.restart_count(), "resumed_epoch": epoch, "resumed_minibatch": minibatch,
                 "restore_at_unix_s": restore_unix_s,
                 "resumed_at_unix_s": time.time()})
    atomic_write_json(path, rows)


def note_first_minibatch(out_dir: Path) -> None:
    """Rank 0 of a restarted job: add when its first minibatch after the restart ended to ``restarts.json``."""
    path = out_dir / "restarts.json"
    rows = json.loads(path.read_text())
    rows[-1]["first_minibatch_unix_s"] = time.time()
    atomic_write_json(path, rows)


def warn_incomplete(out_dir: Path) -> None:
    """Print a ``warning:`` naming every checkpoint folder newer than the newest complete one (a persist that did not
    finish: its run stopped first); a resumed run skips them."""
    newest = latest_complete(out_dir)
    for done, pos in positions(out_dir):
        if not done and pos > newest:
            print(f"warning: checkpoint {folder(out_dir, pos)} is incomplete (no {MARKER}: its run stopped while "
                  "writing it); skipped", flush=True)


def restore(out_dir: Path, rank: int, parts: tuple[int, ...], timeout_s: float
            ) -> tuple[tuple[int, int], list[dict[str, Any]]] | None:
    """The newest complete checkpoint whose parts every rank can read (every rank calls it).

    Each rank reads the parts of ranks ``parts`` (its own; a DP worker also rank 0's, which holds the weights
    every replica shares). A checkpoint some rank cannot read (truncated, corrupt) is skipped for the next older
    complete one by all ranks alike; the rank that cannot read it prints a ``warning:`` naming the file; rank 0
    names the incomplete ones skipped (:func:`warn_incomplete`).

    Rank 0 then removes the folders newer than the one chosen (the resumed run writes them again).

    Returns:
        ``(position, the states of parts)``, or None when there is no checkpoint.
    Raises:
        PipeDreamError: none of the complete checkpoints can be read (naming this rank's unreadable file;
            :class:`~pipedream.runtime.distributed.PeerFailed` on the ranks that could read theirs).
    """
    if rank == 0:
        warn_incomplete(out_dir)
    unreadable: list[str] = []
    complete = complete_positions(out_dir)
    for position in complete:
        states: list[dict[str, Any]] | None = []
        for q in parts:
            path = folder(out_dir, position) / f"rank{q}.pt"
            try:
                states.append(torch.load(path, weights_only=True))  # type: ignore[union-attr]
            except Exception as e:  # noqa: BLE001 - any unreadable file: try the previous checkpoint
                why = (str(e).splitlines() or [""])[0] or type(e).__name__
                unreadable.append(f"checkpoint {path} cannot be read ({why})")
                print(f"warning: {unreadable[-1]}; falling back to the previous complete checkpoint", flush=True)
                states = None
                break
        (bad,) = D.allreduce_sum([float(states is None)], timeout_s, f"checkpoint check at epoch {position[0]}")
        if bad == 0 and states is not None:
            _drop_newer(out_dir, rank, position)
            return position, states
    if unreadable:
        raise PipeDreamError(f"{unreadable[0]} and no older complete checkpoint exists; remove "
                             f"{out_dir / 'checkpoints'} to start from scratch")
    if complete:
        raise D.PeerFailed("another rank cannot read its checkpoints")
    _drop_newer(out_dir, rank, (-1, -1))
    return None


def _drop_newer(out_dir: Path, rank: int, position: tuple[int, int]) -> None:
    """Rank 0: remove the folders newer than the checkpoint resumed from (skipped ones), which the resumed run
    writes again: a stale part in one must not complete it. No rank trains past the next collective without
    rank 0, so none writes there before this."""
    if rank == 0:
        for _, pos in positions(out_dir):
            if pos > position:
                shutil.rmtree(folder(out_dir, pos), ignore_errors=True)
