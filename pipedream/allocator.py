"""Keep freed memory in the process: the C allocator settings every process that computes a training step on the
CPU runs with (the workers of both modes, the profile, the host probe's copies).

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
(``benchmarks/malloc``, which also gives the step's time both ways). A worker's step, with its optimizer step
and messages between, allocates in another order than the profile's step, so it is a draw of its own: the
prediction timed one allocator's behaviour and the run paid another's. In one S2VT DP run (4 workers, 3 epochs
of 16 steps) the workers took 181,565, 453,015, 470,280 and 916,208 minor faults by default, the last about
15,300 a step more than the first over the 48 steps (every allreduce waits for it), and 147,201-149,693 each with
the heap kept (start-up and validation).

:func:`keep_freed_memory` sets glibc's ``M_MMAP_THRESHOLD`` to 1 GiB (blocks up to that size come from the heap)
and ``M_TRIM_THRESHOLD`` to 2 GiB - 1 (free memory at the heap's top stays), with ``mallopt(3)``, the C library's
own interface (see glibc's manual, "Malloc Tunable Parameters"). After the first steps a step's blocks are reused
and nothing is faulted in; the price is memory: a process keeps its peak heap resident until it exits (a
training process reaches it again every step anyway), and because ``posix_memalign``'s padding keeps a block from
fitting exactly where a freed one of the same size was, the heap can hold a few freed copies of a large block
(one 64 MiB block allocated and freed over and over settles at 448 MiB more resident, 7 blocks; a reduced
VGG-16 DP worker peaked at 801 MiB resident against 778 MiB). Set ``PIPEDREAM_MALLOC=default`` to leave the allocator as
it is (benchmarks/malloc compares the two).
"""

from __future__ import annotations

import ctypes
import os
import platform

ENV = "PIPEDREAM_MALLOC"
# mallopt(3) parameter numbers (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 1 << 30
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
