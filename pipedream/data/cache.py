"""A disk cache of bytes derived from an installed data file: Fashion-MNIST decompressed (about 1 s of CPU) and the
Ding pairs parsed (2-3 s) once, not again in every worker, profile and final score of every run.

The folder is ``$PIPEDREAM_CACHE``, else ``$XDG_CACHE_HOME/pipedream``, else ``~/.cache/pipedream``; ``off`` turns
the cache off, and a folder that cannot be written is no error. An entry is named by the source's path, size and
modification time and the caller's tag, so an edited source is decoded again; it is written to a temporary name
and renamed into place, so workers that miss together never read a partial file.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

from pipedream.io import atomic_write_bytes

CACHE_ENV = "PIPEDREAM_CACHE"
OFF = "off"


def cache_dir() -> Path | None:
    """The cache folder (module docstring), or None where ``$PIPEDREAM_CACHE`` is ``off``."""
    value = os.environ.get(CACHE_ENV, "")
    if value == OFF:
        return None
    return Path(value) if value else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pipedream"


def derived(source: Path, tag: str, build: Callable[[], bytes]) -> bytes:
    """``build()``, the bytes derived from the file ``source``: from the cache where a call with the same ``tag``
    on the same file left them, else built and kept. ``tag`` names the derivation and its version. Errors of
    ``build`` (a missing or malformed source) propagate; an unreadable or unwritable cache is skipped."""
    folder = cache_dir()
    try:
        stat = source.stat()
    except OSError:
        return build()  # build() says what is wrong with the source
    if folder is None:
        return build()
    key = f"{source.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{tag}"
    path = folder / f"{source.name}.{tag}.{hashlib.sha1(key.encode()).hexdigest()[:16]}"
    try:
        return path.read_bytes()
    except OSError:
        data = build()
    try:
        atomic_write_bytes(path, data)
    except OSError:
        pass  # no cache here: the data as derived
    return data
