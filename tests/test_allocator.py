"""The C allocator settings of every process that computes a step (pipedream/allocator.py): with them a block
freed and allocated again is reused, without them glibc maps it anew and faults in every page each time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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


jemalloc = pytest.mark.skipif(allocator.jemalloc_library() is None,
                              reason="jemalloc is not installed (make test installs Debian's libjemalloc2)")


def _child(env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD + "from pipedream.allocator import allocator_in_use\n"
                          "print(json.dumps({'allocator': allocator_in_use()}))"],
                         env={**os.environ, "OMP_NUM_THREADS": "1", **env}, capture_output=True, text=True, check=True)
    lines = out.stdout.strip().splitlines()
    return {**json.loads(lines[-2]), **json.loads(lines[-1])}


@jemalloc
def test_a_worker_runs_on_jemalloc_that_keeps_freed_blocks():
    env = allocator.worker_env({})
    assert env["MALLOC_CONF"] == allocator.JEMALLOC_CONF
    got = _child(env)
    assert got["allocator"] == "jemalloc", got
    assert got["faults"][0] >= 16_000  # 64 MiB: 16,384 pages of 4 KiB faulted in once
    assert max(got["faults"][-5:]) < 100, got


@jemalloc
def test_jemalloc_as_it_is_gives_a_large_block_back_every_time():
    # why worker_env sets MALLOC_CONF: jemalloc's own defaults put blocks over 8 MiB in an arena that returns
    # them to the system when freed, so every page is faulted in again (as glibc's default does)
    got = _child({"LD_PRELOAD": allocator.jemalloc_library(), "MALLOC_CONF": ""})
    assert got["allocator"] == "jemalloc"
    assert min(got["faults"][-5:]) >= 16_000, got


def test_worker_env_preloads_jemalloc_before_the_users_own(tmp_path):
    lib = str(tmp_path / allocator.JEMALLOC)
    assert allocator.worker_env({}, library=lib) == {"LD_PRELOAD": lib, "MALLOC_CONF": allocator.JEMALLOC_CONF}
    got = allocator.worker_env({"LD_PRELOAD": "/x/libfoo.so", "MALLOC_CONF": "narenas:2"}, library=lib)
    assert got == {"LD_PRELOAD": f"{lib} /x/libfoo.so", "MALLOC_CONF": f"{allocator.JEMALLOC_CONF},narenas:2"}
    assert allocator.worker_env({"LD_PRELOAD": lib}, library=lib)["LD_PRELOAD"] == lib  # not twice


@pytest.mark.parametrize("mode", ["default", "keep", " Keep "])
def test_worker_env_leaves_glibc_on_request(mode, tmp_path):
    assert allocator.worker_env({allocator.ENV: mode}, library=str(tmp_path / allocator.JEMALLOC)) == {}


def test_jemalloc_library_is_the_first_directory_that_holds_it(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    assert allocator.jemalloc_library([a, b]) is None
    (b / allocator.JEMALLOC).write_bytes(b"")
    assert allocator.jemalloc_library([a, b]) == str(b / allocator.JEMALLOC)


def test_pipedream_jemalloc_names_the_library_where_no_standard_directory_holds_it(tmp_path):
    lib = tmp_path / "opt" / allocator.JEMALLOC  # e.g. a cluster's module tree or a home directory
    lib.parent.mkdir()
    lib.write_bytes(b"")
    env = {allocator.LIBRARY_ENV: str(lib)}
    assert allocator.jemalloc_library(environ=env) == str(lib)
    assert allocator.jemalloc_library([tmp_path], environ=env) is None  # directories given: only those
    assert allocator.worker_env(env) == {"LD_PRELOAD": str(lib), "MALLOC_CONF": allocator.JEMALLOC_CONF}
    assert allocator.worker_env({**env, allocator.ENV: "keep"}) == {}  # glibc asked for: the path is not read


def test_a_pipedream_jemalloc_that_names_no_file_is_an_error(tmp_path):
    from pipedream.errors import PipeDreamError

    missing = tmp_path / "nowhere" / allocator.JEMALLOC
    with pytest.raises(PipeDreamError, match=f"^PIPEDREAM_JEMALLOC={missing} is not a file: point it at "):
        allocator.jemalloc_library(environ={allocator.LIBRARY_ENV: str(missing)})
    with pytest.raises(PipeDreamError, match="PIPEDREAM_JEMALLOC"):
        allocator.worker_env({allocator.LIBRARY_ENV: str(tmp_path)})  # a directory is no library either


@jemalloc
def test_a_worker_preloads_jemalloc_from_pipedream_jemalloc(tmp_path):
    lib = tmp_path / "kit" / "lib" / allocator.JEMALLOC  # a copy where no standard search looks
    lib.parent.mkdir(parents=True)
    lib.write_bytes(Path(allocator.jemalloc_library(environ={})).read_bytes())
    env = allocator.worker_env({allocator.LIBRARY_ENV: str(lib)})
    assert env["LD_PRELOAD"] == str(lib)
    out = subprocess.run([sys.executable, "-c", "print(open('/proc/self/maps').read())"],
                         env={**os.environ, **env}, capture_output=True, text=True, check=True)
    assert str(lib) in out.stdout  # this copy is what the child runs on


def test_train_refuses_a_pipedream_jemalloc_that_names_no_file_before_any_worker(tmp_path):
    env = {**os.environ, allocator.LIBRARY_ENV: str(tmp_path / allocator.JEMALLOC)}
    env.pop(allocator.ENV, None)
    out = subprocess.run([sys.executable, "-m", "pipedream.cli", "train", "--model", "vgg16", "--mode", "dp",
                          "--workers", "2", "--out-dir", str(tmp_path / "run")], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip() == (f"error: PIPEDREAM_JEMALLOC={tmp_path / allocator.JEMALLOC} is not a file: point it "
                                  "at libjemalloc.so.2 (Debian: /usr/lib/x86_64-linux-gnu/libjemalloc.so.2) or unset it")
    assert not (tmp_path / "run").exists()  # nothing staged, no run started


def test_allocator_in_use_reads_the_maps(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libjemalloc.so.2\n")
    assert allocator.allocator_in_use(maps) == "jemalloc"
    maps.write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
    assert allocator.allocator_in_use(maps) == ("glibc" if allocator.glibc() else "other")


def test_the_launcher_warns_once_where_jemalloc_is_missing(monkeypatch, capsys):
    from pipedream.runtime import launch

    monkeypatch.setattr(launch, "worker_env", lambda: {})
    monkeypatch.delenv(allocator.ENV, raising=False)
    assert launch.workers_allocator() == {}
    err = capsys.readouterr().err
    assert err.startswith("warning: libjemalloc.so.2 not found") and err.count("\n") == 1
    monkeypatch.setenv(allocator.ENV, "keep")
    assert launch.workers_allocator() == {}
    assert capsys.readouterr().err == ""
