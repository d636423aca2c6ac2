"""The C allocator of every process that computes a training step on the CPU: jemalloc for the workers, glibc with
its freed memory kept for everything else (the profile).

glibc serves a request above its mmap threshold with a fresh ``mmap`` and returns it when freed, and trims the top
of its heap once enough is free there: a training step that allocates and frees the same activations and gradients
every time then faults every page of every new block in again, every step, the kernel zeroing each page. A
worker's allocations (weight versions, messages, optimizer steps, minibatches in flight between its large blocks)
also fragment glibc's heap without end: a worker's resident memory grows by gigabytes within an epoch and its
compute slows by the faults.

:func:`keep_freed_memory` sets glibc's ``M_MMAP_THRESHOLD`` to 1 GiB and ``M_TRIM_THRESHOLD`` to 2 GiB - 1 with
``mallopt(3)`` (glibc's manual, "Malloc Tunable Parameters"): in a loop of the same step a step's blocks are reused
after the first steps, at the price of keeping the peak heap resident. The workers run on jemalloc (Debian
``libjemalloc2``, conda-forge ``jemalloc``), preloaded (:func:`worker_env`, ``LD_PRELOAD``) with
:data:`JEMALLOC_CONF`: no separate arena for blocks over 8 MiB (``oversize_threshold:0``) and no purging of freed
pages (``dirty_decay_ms:-1,muzzy_decay_ms:-1``); without jemalloc they fall back to :func:`keep_freed_memory` (one
warning line). ``PIPEDREAM_MALLOC``: ``default`` leaves every process's allocator as it is, ``keep`` gives the
workers glibc with freed memory kept, ``jemalloc`` (and unset) jemalloc where installed. ``PIPEDREAM_JEMALLOC``: the
path of ``libjemalloc.so.2`` where it is not in a standard directory (a cluster's module tree, a home directory);
a path that is no file stops the run with an error before any worker starts.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from pathlib import Path

from pipedream.errors import PipeDreamError

ENV = "PIPEDREAM_MALLOC"
LIBRARY_ENV = "PIPEDREAM_JEMALLOC"  # jemalloc's path, where it is not in a standard directory (module docstring)
# mallopt(3) parameter numbers (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 1 << 30
JEMALLOC = "libjemalloc.so.2"
# jemalloc's options for the workers (module docstring; jemalloc's manual, "opt.oversize_threshold", "opt.dirty_decay_ms")
JEMALLOC_CONF = "oversize_threshold:0,dirty_decay_ms:-1,muzzy_decay_ms:-1"
TRIM_THRESHOLD_BYTES = 2**31 - 1  # mallopt takes an int


def keep_freed_memory() -> bool:
    """Make this process's ``malloc`` keep freed blocks for reuse instead of returning them to the system
    (module docstring): ``M_MMAP_THRESHOLD`` 1 GiB, ``M_TRIM_THRESHOLD`` 2 GiB - 1 byte. Affects allocations from
    now on; calling it again changes nothing.

    Returns:
        True when both were set; False where the C library is not glibc (macOS, musl: left as they are), where
        ``PIPEDREAM_MALLOC=default`` asks to leave them, or where ``mallopt`` refused. Never raises.
    """
    if os.environ.get(ENV, "").strip().lower() == "default" or not glibc():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))


def glibc() -> bool:
    """Whether this process runs on glibc, whose ``mallopt`` thresholds :func:`keep_freed_memory` sets
    (:func:`platform.libc_ver`)."""
    return platform.libc_ver()[0] == "glibc"


def jemalloc_library(dirs: Sequence[str | Path] | None = None, environ: Mapping[str, str] | None = None) -> str | None:
    """Path of jemalloc's shared library (:data:`JEMALLOC`), or None where it is not installed: without ``dirs``,
    ``$PIPEDREAM_JEMALLOC`` (:data:`LIBRARY_ENV`) where set, else the first of this Python's prefix's ``lib`` (a
    conda environment's ``jemalloc``), ``/usr/local/lib``, the multiarch ``/usr/lib/<triplet>`` (Debian's
    ``libjemalloc2``), ``/usr/lib64`` and ``/usr/lib`` that holds it; with ``dirs``, the first of them.

    Args:
        dirs: directories to look in, in order (the variable is not read then).
        environ: where to read the variable (default ``os.environ``).
    Raises:
        PipeDreamError: ``$PIPEDREAM_JEMALLOC`` names no file.
    """
    environ = os.environ if environ is None else environ
    given = environ.get(LIBRARY_ENV, "").strip()
    if dirs is None and given:
        if not Path(given).is_file():
            raise PipeDreamError(f"{LIBRARY_ENV}={given} is not a file: point it at {JEMALLOC} (Debian: "
                                 f"/usr/lib/x86_64-linux-gnu/{JEMALLOC}) or unset it")
        return given
    if dirs is None:
        multiarch = sysconfig.get_config_var("MULTIARCH") or ""
        dirs = [Path(sys.prefix) / "lib", Path(sys.base_prefix) / "lib", "/usr/local/lib",
                *([f"/usr/lib/{multiarch}"] if multiarch else []), "/usr/lib64", "/usr/lib"]
    return next((str(Path(d) / JEMALLOC) for d in dirs if (Path(d) / JEMALLOC).is_file()), None)


def wants_jemalloc(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the workers should run on jemalloc: ``PIPEDREAM_MALLOC`` unset or ``jemalloc``, not ``default`` or
    ``keep`` (glibc; module docstring). ``environ``: default ``os.environ``."""
    environ = os.environ if environ is None else environ
    return environ.get(ENV, "").strip().lower() not in ("default", "keep")


def worker_env(environ: Mapping[str, str] | None = None, library: str | None = None) -> dict[str, str]:
    """The variables a worker process must start with for its allocator (module docstring): ``LD_PRELOAD`` with
    jemalloc first and ``MALLOC_CONF`` with :data:`JEMALLOC_CONF` first (a user's own options after it, so theirs
    win), or nothing: with ``PIPEDREAM_MALLOC`` ``default`` or ``keep``, or where jemalloc is not installed (the
    worker then keeps glibc's freed memory, :func:`keep_freed_memory`).

    Args:
        environ: the environment the workers inherit (default ``os.environ``).
        library: jemalloc's path (default :func:`jemalloc_library`).
    Raises:
        PipeDreamError: ``$PIPEDREAM_JEMALLOC`` names no file (:func:`jemalloc_library`).
    """
    environ = os.environ if environ is None else environ
    if not wants_jemalloc(environ):
        return {}
    library = library or jemalloc_library(environ=environ)
    if library is None:
        return {}
    preload = environ.get("LD_PRELOAD", "").strip()
    conf = environ.get("MALLOC_CONF", "").strip()
    return {"LD_PRELOAD": f"{library} {preload}".strip() if library not in preload.split() else preload,
            "MALLOC_CONF": f"{JEMALLOC_CONF},{conf}" if conf else JEMALLOC_CONF}


def allocator_in_use(maps: str | Path = "/proc/self/maps") -> str:
    """``"jemalloc"`` where this process has jemalloc mapped (``maps``, Linux), else ``"glibc"`` or ``"other"``."""
    with contextlib.suppress(OSError):
        if "libjemalloc" in Path(maps).read_text():
            return "jemalloc"
    return "glibc" if glibc() else "other"
