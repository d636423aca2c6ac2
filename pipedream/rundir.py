"""A run's output folder is replaced only by a run that succeeded.

``pipedream train --out-dir D`` writes into ``D.partial`` (:func:`prepare`) and, once everything is written,
swaps it with ``D`` in one ``renameat2(RENAME_EXCHANGE)`` (:func:`commit`), then deletes the old results. A
failed or interrupted run leaves ``D`` as it was and its own files (``train.log``, checkpoints) in
``D.partial``, where ``--resume`` continues.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import sys
from pathlib import Path

from pipedream.runtime.checkpoint import latest_complete

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def staging(out_dir: Path) -> Path:
    """Where a run into ``out_dir`` writes until it succeeds: ``<out_dir>.partial``."""
    return out_dir.with_name(out_dir.name + ".partial")


def prepare(out_dir: Path, resume: bool) -> tuple[Path, str | None]:
    """Make the staging folder of a run into ``out_dir`` and return it, with a note for the user or None.

    Without ``resume`` it starts empty (an earlier failed run's files there are deleted). With ``resume`` it
    continues an interrupted run's staging folder if there is one, else starts from hard links to
    ``out_dir/checkpoints`` (checkpoint files are only ever replaced, never written in place, so ``out_dir``
    stays as it is); the note says where training resumes, or that it starts from scratch.
    """
    work = staging(out_dir)
    if not resume:
        shutil.rmtree(work, ignore_errors=True)
    elif not work.is_dir() and (out_dir / "checkpoints").is_dir():
        shutil.copytree(out_dir / "checkpoints", work / "checkpoints", copy_function=os.link)
    work.mkdir(parents=True, exist_ok=True)
    for stale in ("run.json", "prediction.json"):
        (work / stale).unlink(missing_ok=True)
    shutil.rmtree(work / "errors", ignore_errors=True)
    if not resume:
        return work, None
    epochs, minibatches = latest_complete(work)
    if (epochs, minibatches) == (0, 0):
        return work, f"--resume: no complete checkpoint in {work}; training starts from scratch"
    return work, f"--resume: continuing from the checkpoint after epoch {epochs} + {minibatches} minibatches"


def commit(work: Path, out_dir: Path) -> None:
    """Put the finished run ``work`` in place of ``out_dir`` atomically, then delete the old results."""
    if not out_dir.exists():
        os.rename(work, out_dir)
        return
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.renameat2(_AT_FDCWD, os.fsencode(work), _AT_FDCWD, os.fsencode(out_dir), _RENAME_EXCHANGE) == 0:
            shutil.rmtree(work)  # now the old results
            return
    old = out_dir.with_name(out_dir.name + ".old")  # no exchange here: two renames, the old kept until the second
    shutil.rmtree(old, ignore_errors=True)
    os.rename(out_dir, old)
    os.rename(work, out_dir)
    shutil.rmtree(old)
