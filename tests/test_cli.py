"""Command line: bad input gives one clear line, exit status 2 and no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


def _run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipedream.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def _assert_clean_error(proc: subprocess.CompletedProcess[str], needle: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], proc.stderr


def test_unknown_model(tmp_path: Path) -> None:
    _assert_clean_error(_run("profile", "--model", "nosuchnet", "--out-dir", str(tmp_path)), "unknown model 'nosuchnet'")
    assert not any(tmp_path.iterdir())


def test_broken_yaml(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("scale: reduced\nmodels: [unclosed\n")
    _assert_clean_error(_run("report", "--config", str(bad)), "broken YAML")


def test_schema_violation_names_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text((REPO / "experiments" / "ci.yaml").read_text().replace("batch_size: 32", "batch_size: -32", 2))
    _assert_clean_error(_run("report", "--config", str(bad)), "profile/batch_size")


@pytest.mark.parametrize("cmd", ["profile", "report"])
def test_help_explains(cmd: str) -> None:
    proc = _run(cmd, "--help")
    assert proc.returncode == 0 and "--" in proc.stdout


def test_unknown_training_key_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text((REPO / "experiments" / "ci.yaml").read_text().replace("seed: 0}", "seed: 0, warmup_steps: 9}", 1))
    _assert_clean_error(_run("check", "--config", str(bad)), "warmup_steps")


def test_every_training_key_of_the_schema_is_a_train_flag() -> None:
    """The workflow turns each models.<m>.train key into a `pipedream train` flag: none may be ignored."""
    from dataclasses import fields

    import yaml

    from pipedream.runtime.config import TrainConfig

    schema = yaml.safe_load((REPO / "workflows" / "schemas" / "config.schema.yaml").read_text())
    train = schema["properties"]["models"]["additionalProperties"]["properties"]["train"]["properties"]
    assert set(train) <= {f.name for f in fields(TrainConfig)}
