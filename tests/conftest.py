"""Shared fixtures: paths to the shipped V100 profiles and an isolated MLflow store."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

# the multi-process tests start several workers on one machine: gloo on the CPU even where GPUs are
# (NCCL takes one GPU per worker); tests/test_gpu.py switches it off for its own workers
os.environ.setdefault("PIPEDREAM_FORCE_GLOO", "1")

REPO = Path(__file__).resolve().parent.parent
PROFILES = REPO / "experiments" / "data" / "profiles"
PROFILE_NAMES = ["alexnet", "vgg16", "resnet50", "gnmt", "gnmt_large"]


def log_training_run(experiment: str, run_name: str, params: dict[str, Any], epochs: list[dict[str, float]],
                     final_metrics: dict[str, float] | None = None, tags: dict[str, str] | None = None,
                     artifacts: Iterable[Path] = ()) -> str:
    """Log one finished training run at once (a :class:`pipedream.tracking.LiveRun` started and finished in one
    call) and return its MLflow run id."""
    from pipedream.tracking import LiveRun

    run = LiveRun(experiment, run_name, params, tags)
    run.log_epochs(epochs)
    run.finish(final_metrics, artifacts=artifacts)
    return run.run_id


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``first`` (a minute or more each) run first: with ``-n 2`` the other worker meanwhile works
    through the short tests, instead of the run ending with one worker idle while the long test finishes."""
    items.sort(key=lambda item: item.get_closest_marker("first") is None)


@pytest.fixture(autouse=True, scope="session")
def _no_runs_in_the_checkouts_store(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every test (and every process it starts) logs to a throw-away MLflow store, never to the
    checkout's results/mlflow.db, which holds the user's own runs."""
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db"


@pytest.fixture(autouse=True, scope="session")
def _no_files_in_the_users_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Data sets decoded by the tests (and the processes they start) are kept in a throw-away folder, not in the
    user's ~/.cache/pipedream (:mod:`pipedream.data.cache`)."""
    from pipedream.data.cache import CACHE_ENV

    os.environ[CACHE_ENV] = str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="session")
def _empty_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An sqlite MLflow store with its tables created (MLflow's migrations take about a second of CPU a store)."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    path = tmp_path_factory.mktemp("mlflow-empty") / "mlflow.db"
    SqlAlchemyStore(f"sqlite:///{path}", str(path.parent / "mlartifacts"))
    return path


@pytest.fixture
def new_store(_empty_store: Path) -> Callable[[Path], str]:
    """``new_store(folder)`` puts an empty MLflow store at ``folder/mlflow.db`` and returns its URI."""
    def put(folder: Path) -> str:
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_empty_store, folder / "mlflow.db")
        return f"sqlite:///{folder}/mlflow.db"
    return put


@pytest.fixture
def mlflow_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, new_store: Callable[[Path], str]) -> Path:
    """An empty sqlite MLflow store in a temporary folder (also the working directory)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", new_store(tmp_path))
    return tmp_path
