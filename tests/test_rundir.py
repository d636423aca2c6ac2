"""A run's folder is replaced only by a run that succeeded (pipedream.rundir)."""

from __future__ import annotations

from pathlib import Path

from pipedream import rundir


def test_commit_swaps_in_the_finished_run_and_drops_the_old(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.json").write_text("old")
    work, note = rundir.prepare(out, resume=False)
    assert work == tmp_path / "run.partial" and note is None and list(work.iterdir()) == []
    (work / "metrics.json").write_text("new")
    assert (out / "metrics.json").read_text() == "old"  # untouched until the run succeeds
    rundir.commit(work, out)
    assert (out / "metrics.json").read_text() == "new" and not work.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_resume_starts_from_the_finished_runs_checkpoints_without_touching_them(tmp_path: Path) -> None:
    out = tmp_path / "run"
    (out / "checkpoints" / "e1-m0").mkdir(parents=True)
    (out / "checkpoints" / "e1-m0" / "COMPLETE").write_text("1 0\n")
    work, note = rundir.prepare(out, resume=True)
    assert note == "--resume: continuing from the checkpoint after epoch 1 + 0 minibatches"
    assert (work / "checkpoints" / "e1-m0" / "COMPLETE").samefile(out / "checkpoints" / "e1-m0" / "COMPLETE")
    _, note = rundir.prepare(tmp_path / "fresh", resume=True)
    assert note is not None and note.endswith("training starts from scratch")
