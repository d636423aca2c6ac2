"""The C allocator settings of every process that computes a step (pipedream/allocator.py): with them a block
freed and allocated again is reused, without them glibc maps it anew and faults in every page each time."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pipedream import allocator

CHILD = """
import json, resource, sys
import torch
from pipedream.allocator import keep_freed_memory
kept = keep_freed_memory()
faults = []
for _ in range(20):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = torch.empty(64 << 20, dtype=torch.uint8)
    block.fill_(1)  # touch every page
    del block
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"kept": kept, "faults": faults}))
"""

glibc = pytest.mark.skipif(not allocator.glibc(), reason="mallopt's thresholds are glibc's")


def _faults(mode: str) -> dict:
    env = dict(os.environ, PIPEDREAM_MALLOC=mode, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@glibc
def test_a_freed_block_is_reused_without_faults():
    got = _faults("keep")
    assert got["kept"] is True
    # the first 64 MiB blocks are faulted in (16,384 pages of 4 KiB each; posix_memalign's padding keeps the
    # first few from fitting where the last one was, 7 on glibc 2.36), then a block reuses freed pages
    assert got["faults"][0] >= 16_000
    assert max(got["faults"][-5:]) < 100, got


@glibc
def test_glibc_as_it_is_faults_a_large_block_in_every_time():
    got = _faults("default")
    assert got["kept"] is False
    # 64 MiB is over glibc's largest dynamic mmap threshold (32 MiB): mapped and unmapped every time
    assert min(got["faults"][-5:]) >= 16_000, got


def test_leaving_the_allocator_alone_on_request(monkeypatch):
    monkeypatch.setenv(allocator.ENV, "default")
    assert allocator.keep_freed_memory() is False
