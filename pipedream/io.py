"""Reading input files with one-line errors, and atomic writes, so an interrupted run never leaves a
half-written result behind."""

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
    atomic_write_bytes(path, text.encode())


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` as :func:`atomic_write_text` writes text (the same errors; OSError of the disk)."""
    if path.is_dir():
        raise PipeDreamError(f"{path} is a directory; give a file name to write")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def read_text(path: Path, what: str, give: str, expected: str, missing: str = "") -> str:
    """The UTF-8 text of an input file.

    Args:
        what: what the file is, for messages (``"profile"``, ``"plan"``, ``"config file"``).
        give: what to pass instead of a directory (``"the plan's JSON file"``).
        expected: what its content should be (``"JSON"``, ``"YAML"``, ``"a graph.txt profile"``).
        missing: appended to the not-found message, e.g. ``"; run `pipedream plan` first"``.
    Raises:
        PipeDreamError: ``path`` is a directory, does not exist, or is not UTF-8 text.
    """
    if path.is_dir():
        raise PipeDreamError(f"{what} {path} is a directory; give {give}")
    if not path.is_file():
        raise PipeDreamError(f"{what} {path} not found{missing}")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise PipeDreamError(f"{what} {path} is not a text file; expected {expected}") from None


def read_json_object(path: Path, what: str, give: str, fix: str, missing: str = "") -> dict[str, Any]:
    """A JSON file holding an object, read with :func:`read_text`; ``fix`` ends the message of a file
    that is not valid JSON or not an object.

    Raises:
        PipeDreamError: as :func:`read_text`, or the content is not a JSON object.
    """
    try:
        doc = json.loads(read_text(path, what, give, "JSON", missing))
    except json.JSONDecodeError as e:
        raise PipeDreamError(f"{what} {path} is not valid JSON ({e}); {fix}") from None
    if not isinstance(doc, dict):
        raise PipeDreamError(f"{what} {path} is not a JSON object; {fix}")
    return doc
