"""The benchmarks' command lines and the drift benchmark's statistics (benchmarks/*/main.py), against hand
computations; the benchmarks' measurements themselves are never asserted (speed is not a test)."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = sorted(p.parent.name for p in (ROOT / "benchmarks").glob("*/main.py"))


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", ROOT / "benchmarks" / name / "main.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_benchmark_explains_itself(name: str) -> None:
    """``--help`` exits 0 and prints the usage (argparse formats every help string: a bare ``%`` breaks it)."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / name / "main.py"), "--help"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("usage:")


def test_the_benchmarks_are_found() -> None:
    assert {"allreduce", "drift", "host", "memory", "planner", "runtime", "simulator"} <= set(BENCHMARKS)


def test_drift_window_means_slide_by_a_quarter_window() -> None:
    """Steps ending at 0.5, 1.5, ..., 7.5 s costing 1, 2, ..., 8 s; windows of 4 s from 0 to 8 s slide by 1 s:
    [0, 4) holds 1..4 (mean 2.5), [1, 5) 2..5 (3.5), ..., [4, 8) 5..8 (6.5)."""
    drift = load("drift")
    series = [(i + 0.5, float(i + 1)) for i in range(8)]
    assert drift.window_means(series, 4.0, 0.0, 8.0) == pytest.approx([2.5, 3.5, 4.5, 5.5, 6.5])
    assert drift.window_means(series, 4.0, 0.0, 3.9) == []  # no whole window


def test_drift_floor_and_correlation_by_hand() -> None:
    drift = load("drift")
    median, one, every = drift.floor(0.1, 14)
    assert median == pytest.approx(0.06745)
    assert one == pytest.approx(math.erf(1.5 / math.sqrt(2)))  # |z| <= 1.5: 0.8664
    assert every == pytest.approx(one ** 14)
    assert drift.cv([1.0, 3.0]) == pytest.approx(0.5)  # population sd 1 over mean 2
    assert math.isnan(drift.cv([2.0]))
    assert drift.correlation([1.0, 2.0, 3.0], [2.0, 4.0, 7.0]) == pytest.approx(0.9933, abs=1e-4)
    assert drift.correlation([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]) == pytest.approx(-1.0)
    assert math.isnan(drift.correlation([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))
