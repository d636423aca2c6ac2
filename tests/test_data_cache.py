"""The disk cache of decoded data sets (pipedream/data/cache.py): a hit returns the bytes first built, a changed
source or a disabled cache builds again, an unwritable folder is no error; the cached readers return what the
uncached ones return."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import pytest

from pipedream.data import cache
from pipedream.data.fashion_mnist import read_idx


def _counting(payload: bytes) -> tuple[list[int], object]:
    calls: list[int] = []

    def build() -> bytes:
        calls.append(1)
        return payload

    return calls, build


def test_a_hit_skips_the_build_and_a_changed_source_builds_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "c"))
    source = tmp_path / "data.txt"
    source.write_text("one")
    calls, build = _counting(b"decoded one")
    assert cache.derived(source, "t1", build) == b"decoded one"
    assert cache.derived(source, "t1", build) == b"decoded one"
    assert len(calls) == 1
    assert cache.derived(source, "t2", build) == b"decoded one" and len(calls) == 2  # another tag: built again
    source.write_text("two!")  # new size and modification time
    os.utime(source, ns=(source.stat().st_atime_ns, source.stat().st_mtime_ns + 10**9))
    calls2, build2 = _counting(b"decoded two")
    assert cache.derived(source, "t1", build2) == b"decoded two" and len(calls2) == 1
    assert sorted(p.name.split(".")[2] for p in (tmp_path / "c").iterdir()) == ["t1", "t1", "t2"]  # no temporaries


def test_off_and_an_unwritable_folder_build_every_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "data.txt"
    source.write_text("x")
    calls, build = _counting(b"y")
    monkeypatch.setenv(cache.CACHE_ENV, cache.OFF)
    assert cache.derived(source, "t", build) == b"y" and cache.derived(source, "t", build) == b"y"
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(cache.CACHE_ENV, str(blocker / "sub"))  # a folder under a file cannot be made
    assert cache.derived(source, "t", build) == b"y"
    assert len(calls) == 3


def test_the_default_folder_follows_xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cache.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.cache_dir() == tmp_path / "pipedream"


def test_read_idx_from_the_cache_equals_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "c"))
    pixels = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    path = tmp_path / "images-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(bytes([0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4]) + pixels.tobytes()))
    first, again = read_idx(path), read_idx(path)
    assert np.array_equal(first, pixels) and np.array_equal(again, pixels)
    assert len(list((tmp_path / "c").iterdir())) == 1
