"""`pipedream train` under faults: a failed run stops every process it started, blames the rank that failed
first in one short line, ends its MLflow run FAILED (KILLED for a signal) and leaves the previous results as
they were."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from pipedream.runtime.supervise import LAUNCHER_PID_ENV
from pipedream.runtime.worker import FAULT_ENV
from tests.conftest import REPO
from tests.tiny import write_data

# How long the launcher may take to end the job once a fault is seen: stop the other processes, mark the MLflow run
# and exit. Well under the run's own limit (--timeout-s 1800) and the 500 epochs these runs ask for, and with room
# for a slow shared machine (a frozen worker's job includes its 5 s comm timeout).
PROMPT_S = 15.0

pytestmark = pytest.mark.slow


def _start(tmp_path: Path, mode: str, *extra: str, fault: str | None = None,
           store: str | None = None) -> subprocess.Popen[str]:
    data = tmp_path / "data"
    if not data.is_dir():
        write_data(data)
    env = {**os.environ, "PYTHONPATH": str(REPO), "MLFLOW_TRACKING_URI": store or f"sqlite:///{tmp_path}/mlflow.db"}
    env.pop(FAULT_ENV, None)
    if fault:
        env[FAULT_ENV] = fault
    argv = [sys.executable, "-m", "pipedream.cli", "train", "--mode", mode, "--model", "tests.tiny:tiny_model",
            "--workers", "2", "--batch-size", "8", "--train-subset", "0", "--val-subset", "0", "--data-dir", str(data),
            "--out-dir", str(tmp_path / "run"), "--experiment", "tiny/faults", "--no-progress", "--comm-timeout-s", "5",
            *extra]
    return subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _processes_of(launcher_pid: int) -> list[psutil.Process]:
    """Every live process started for the launcher (torchrun and the workers carry its pid in their environment)."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(LAUNCHER_PID_ENV) == str(launcher_pid) and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.Error:
            continue
    return found


def _workers_running(launcher_pid: int, count: int = 2, timeout_s: float = 60.0) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        procs = [p for p in _processes_of(launcher_pid) if "RANK" in p.environ()]
        if len(procs) >= count:
            return procs
        time.sleep(0.2)
    raise AssertionError("workers did not start")


def _finish(proc: subprocess.Popen[str], tmp_path: Path) -> tuple[int, str, float]:
    """Wait for the launcher; assert nothing of the run is left; return (status, its one error line, seconds)."""
    _, err = proc.communicate(timeout=120)
    ended = time.monotonic()
    left = _processes_of(proc.pid)
    assert left == [], [p.cmdline() for p in left]
    lines = [ln for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0] and len(errors[0]) <= 200, err
    assert "Traceback" not in err
    return proc.returncode, errors[0], ended


@pytest.fixture(autouse=True)
def _store(tmp_path: Path, new_store: Callable[[Path], str]) -> None:
    """Each run logs to an MLflow store of its own in ``tmp_path``, its tables created already."""
    new_store(tmp_path)


def _mlflow_status(tmp_path: Path) -> list[str]:
    os.environ["MLFLOW_TRACKING_URI"], old = f"sqlite:///{tmp_path}/mlflow.db", os.environ["MLFLOW_TRACKING_URI"]
    try:
        from pipedream.tracking import _mlflow

        mlflow = _mlflow()
        exp = mlflow.get_experiment_by_name("tiny/faults")
        return [r.info.status for r in mlflow.MlflowClient().search_runs([exp.experiment_id])]
    finally:
        os.environ["MLFLOW_TRACKING_URI"] = old


@pytest.mark.parametrize("mode,rank", [("pipedream", 0), ("pipedream", 1), ("dp", 0), ("dp", 1)])
def test_a_killed_rank_is_blamed_and_nothing_is_left(tmp_path: Path, mode: str, rank: int) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.json").write_text("previous results\n")
    status, line, _ = _finish(_start(tmp_path, mode, "--epochs", "3", fault=f"{rank}:2"), tmp_path)
    assert status == 2
    assert f"training failed: rank {rank} was killed by SIGKILL; log: " in line, line
    assert (tmp_path / "run" / "metrics.json").read_text() == "previous results\n"  # replaced only by success
    assert _mlflow_status(tmp_path) == ["FAILED"]


def test_a_frozen_worker_ends_the_job_within_the_comm_timeout(tmp_path: Path) -> None:
    proc = _start(tmp_path, "pipedream", "--epochs", "50", fault="1:2:STOP")
    _workers_running(proc.pid)
    frozen = None
    while frozen is None and proc.poll() is None:  # wait for the freeze, then time the end from it
        frozen = next((p for p in _processes_of(proc.pid) if p.status() == psutil.STATUS_STOPPED), None)
        time.sleep(0.05)
    t0 = time.monotonic()
    status, line, ended = _finish(proc, tmp_path)
    assert status == 2 and "rank 1 was stopped (SIGSTOP)" in line, line
    assert ended - t0 < 5 + PROMPT_S  # --comm-timeout-s 5, then the launcher's teardown
    assert _mlflow_status(tmp_path) == ["FAILED"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_launcher_stops_every_worker(tmp_path: Path, sig: signal.Signals) -> None:
    proc = _start(tmp_path, "pipedream", "--epochs", "500")
    _workers_running(proc.pid)
    time.sleep(1.0)
    proc.send_signal(sig)
    t0 = time.monotonic()
    status, line, ended = _finish(proc, tmp_path)
    assert ended - t0 < PROMPT_S
    assert status == 128 + sig and line == f"error: interrupted by {sig.name}"
    assert _mlflow_status(tmp_path) == ["KILLED"]
    assert not (tmp_path / "run").exists()


def test_a_killed_torchrun_takes_its_workers_along(tmp_path: Path) -> None:
    proc = _start(tmp_path, "dp", "--epochs", "500")
    workers = _workers_running(proc.pid)
    torchrun = psutil.Process(workers[0].ppid())
    torchrun.kill()
    t0 = time.monotonic()
    status, line, ended = _finish(proc, tmp_path)
    assert ended - t0 < PROMPT_S
    assert status == 2 and "training failed: torchrun was killed by SIGKILL" in line, line


def test_an_mlflow_store_that_cannot_be_opened_stops_the_workers(tmp_path: Path) -> None:
    """The MLflow run starts while the workers start (pipedream/commands/train.py): a store that cannot be opened
    stops them at once, and its error is the one line."""
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    proc = _start(tmp_path, "pipedream", "--epochs", "500", store=f"sqlite:///{blocker}/mlflow.db")
    t0 = time.monotonic()
    status, line, ended = _finish(proc, tmp_path)
    assert status != 0 and str(blocker) in line and "interrupted" not in line, line
    assert ended - t0 < 30 + PROMPT_S  # the workers' start-up (seconds each on a shared machine), then teardown
    assert not (tmp_path / "run").exists()


def test_the_timeout_stops_every_worker(tmp_path: Path) -> None:
    status, line, _ = _finish(_start(tmp_path, "pipedream", "--epochs", "500", "--timeout-s", "12"), tmp_path)
    assert status == 2 and "training did not finish within --timeout-s 12 s" in line, line
    assert _mlflow_status(tmp_path) == ["FAILED"]
    log = tmp_path / "run.partial" / "train.log"
    size = log.stat().st_size
    time.sleep(1.0)
    assert log.stat().st_size == size  # nothing more is written after the error line
