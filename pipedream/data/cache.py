"""A disk cache of bytes derived from an installed data file, so that the workers of a run read a data set in
milliseconds instead of each decoding it again.

Every worker process of a run loads its data set (:mod:`pipedream.runtime.task`), and so do the profile and the
launcher's final score. Decompressing Fashion-MNIST's training images takes about 1 s of CPU, parsing the Ding
dictionary's 268k lines about 2-3 s; on W workers sharing c cores that is W/c times as much wall time before the
first minibatch. :func:`derived` keeps the result in a file named by the source's path, size and modification
time and the caller's tag, so an edited or replaced source is decoded again; the file is written to a temporary
name and renamed into place, so workers that miss together each write a whole file and never read a partial one.

The folder is ``$PIPEDREAM_CACHE``, else ``$XDG_CACHE_HOME/pipedream``, else ``~/.cache/pipedream``;
``PIPEDREAM_CACHE=off`` turns the cache off. A folder that cannot be written is no error: the data is derived
as without a cache.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

CACHE_ENV = "PIPEDREAM_CACHE"
OFF = "off"


def cache_dir() -> Path | None:
    """The cache folder (module docstring), or None where ``$PIPEDREAM_CACHE`` is ``off``."""
    value = os.environ.get(CACHE_ENV, "")
    if value == OFF:
        return None
    if value:
        return Path(value)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pipedream"


def derived(source: Path, tag: str, build: Callable[[], bytes]) -> bytes:
    """``build()``, the bytes derived from the file ``source``, read from the cache where an earlier call of the
    same ``tag`` on the same file (path, size and modification time) left them, else built and kept there.

    ``tag`` names the derivation and its version (change it when ``build`` changes what it returns). Errors of
    ``build`` (a missing or malformed source) propagate; an unreadable or unwritable cache is skipped.
    """
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
        pass
    data = build()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.")
    except OSError:
        return data
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
    return data
