"""The C allocator of every process that computes a training step on the CPU: jemalloc for the workers, glibc with
its freed memory kept for everything else (the profile, the host probe's copies, the stage probe).

PyTorch's CPU tensors come from the C library's ``malloc`` (``posix_memalign``). glibc serves a request of
more than its mmap threshold (128 KiB at first, raised up to 32 MiB as such blocks are freed) with a fresh
``mmap`` and returns it with ``munmap`` when freed, and it gives the top of the heap back to the system once
more than the trim threshold (128 KiB at first) is free there. A training step that allocates and frees
the same activations and gradients every time then takes a page fault on every 4 KiB page of every new block,
every step, the kernel zeroing each page; how many depends on the order of a process's first allocations, so
each fresh process is a draw. Measured on the 2-core CI VM (Intel Xeon, glibc 2.36, one thread, the profile's
step of the reduced models, median of 25 steps, 2026-11-29): S2VT 15,456 minor faults a step in one process
and none in the next, VGG-16 3,257, 3,680, 896 or none, ResNet-50, AlexNet and GNMT-8 none; with an Adam step
between steps, as a worker has, every one of those five models faulted in some processes
(``benchmarks/malloc``, which also gives the step's time both ways). In one S2VT DP run (4 workers, 3 epochs
of 16 steps) the workers took 181,565, 453,015, 470,280 and 916,208 minor faults by default, the last about
15,300 a step more than the first over the 48 steps (every allreduce waits for it), and 147,201-149,693 each with
the heap kept (start-up and validation).

:func:`keep_freed_memory` sets glibc's ``M_MMAP_THRESHOLD`` to 1 GiB (blocks up to that size come from the heap)
and ``M_TRIM_THRESHOLD`` to 2 GiB - 1 (free memory at the heap's top stays), with ``mallopt(3)``, the C library's
own interface (see glibc's manual, "Malloc Tunable Parameters"). In a loop of the same step, as the profile and the
probes run it, a step's blocks are then reused after the first steps and nothing is faulted in; the price is
memory: a process keeps its peak heap resident (``posix_memalign``'s padding keeps a block from fitting exactly
where a freed one of the same size was, so the heap can hold a few freed copies of a large block: one 64 MiB
block allocated and freed over and over settles at 448 MiB more resident, 7 blocks).

A worker is not such a loop: weight versions, messages, optimizer steps and two minibatches in flight allocate
between its large blocks, and glibc's heap then fragments without end. On the 2-core CI VM (AMD EPYC, glibc 2.36,
2026-11-30, AWD-LM's 2-2 pipeline, one epoch) the two decoder-stage workers grew from 1.1 to 2.7 and 2.9 GB
resident in 35 s; in another run one of them faulted its 90 MB logits gradient (21,875 pages) in again in 25 of 128
backwards (546,918 minor faults, 2.7 s of system time in its backwards; the slowest took up to 198-385 ms of CPU
against a median of 82-101 ms in two such runs): the stage computed at 1.13-1.37x its profiled work in eleven runs
within the hour, 1.04-1.09x in five (the heap's layout is a draw). With glibc as it is the same worker stayed at
0.9 GB but faulted some 120,000 pages a second (1.64x).

The workers therefore run on jemalloc (Debian ``libjemalloc2``, conda-forge ``jemalloc``), preloaded
(:func:`worker_env`, ``LD_PRELOAD``) with :data:`JEMALLOC_CONF`: no separate arena for blocks over 8 MiB
(``oversize_threshold:0``; jemalloc's own default returns those to the system at once: that decoder-stage worker
faulted some 116,000 pages a second (1.79x), as many as on glibc as it is) and no purging of freed pages
(``dirty_decay_ms:-1,muzzy_decay_ms:-1``). The same AWD-LM worker then stayed at 0.93-0.98 GB, took 240-630 faults
a second (its stage-0 peers the most), its backwards 78-113 ms of CPU, its stage at 1.09x its work. Where jemalloc
is not installed the workers fall back to :func:`keep_freed_memory` (one warning line). ``PIPEDREAM_MALLOC``:
``default`` leaves every process's allocator as it is (``benchmarks/malloc`` compares), ``keep`` gives the workers
glibc with freed memory kept, ``jemalloc`` (and unset) jemalloc where installed. ``PIPEDREAM_JEMALLOC``: the path
of ``libjemalloc.so.2`` where it is not in a standard directory (a cluster's module tree, a home directory, the
device kit of ``benchmarks/cores``); set to a path that is no file, the run stops with an error before any worker
starts, rather than running on another allocator than asked.
"""

from __future__ import annotations

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
    for d in dirs:
        path = Path(d) / JEMALLOC
        if path.is_file():
            return str(path)
    return None


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
    try:
        if "libjemalloc" in Path(maps).read_text():
            return "jemalloc"
    except OSError:
        pass
    return "glibc" if glibc() else "other"
