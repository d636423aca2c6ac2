"""Atomic file writes, so an interrupted run never leaves a half-written result behind."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from pipedream.errors import PipeDreamError


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and ``os.replace``.

    Raises:
        PipeDreamError: ``path`` is an existing directory.
    """
    if path.is_dir():
        raise PipeDreamError(f"{path} is a directory; give a file name to write")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")
