"""Checkpoints in one process: the interval's formula, the snapshot's copy, the persist's completion marker, and a
resume that skips incomplete and unreadable checkpoints (the multi-process runs: tests/test_restarts.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from pipedream.costmodel import CheckpointCost, checkpoint_interval, checkpoint_overhead, flush_s
from pipedream.errors import PipeDreamError
from pipedream.runtime import checkpoint as ckpt


@pytest.fixture
def one_rank() -> Iterator[None]:
    """A process group of this process alone (gloo), for the collectives of a resume."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_flush_is_the_bubble_of_a_flushed_1f1b_segment() -> None:
    # 6 minibatches on 4 stages: 9 slots of 10/9 s, 3 of them the bubble
    assert flush_s(10.0, 6, 4) == pytest.approx(10.0 * 3 / 9)
    assert flush_s(10.0, 6, 1) == 0.0


@pytest.mark.parametrize("cost", [CheckpointCost(1.0, 0.07, 0.0), CheckpointCost(1.0, 0.07, 10.0),
                                  CheckpointCost(0.2, 0.05, 3.0, 0.3), CheckpointCost(2.0, 0.0, 0.0)])
def test_interval_is_the_most_frequent_within_the_bound(cost: CheckpointCost) -> None:
    """Checked against the overhead itself, interval by interval."""
    every = checkpoint_interval(cost, 0.035)
    assert checkpoint_overhead(cost, every) <= 0.035
    assert all(checkpoint_overhead(cost, n) > 0.035 for n in range(1, every))


def test_overhead_by_hand() -> None:
    # snapshot 0.07 s a minibatch of 1 s: every 2 minibatches is 3.5%; a persist of 10 s held over 9 minibatches
    # adds its last second to the next snapshot
    assert checkpoint_interval(CheckpointCost(1.0, 0.07, 0.0), 0.035) == 2
    assert checkpoint_overhead(CheckpointCost(1.0, 0.07, 10.0), 9) == pytest.approx((0.07 + 1.0) / 9)
    assert checkpoint_interval(CheckpointCost(1.0, 0.07, 10.0), 0.035) == 10  # max(2, ceil(10.07 / 1.035))
    with pytest.raises(ValueError):
        checkpoint_interval(CheckpointCost(0.0, 0.1, 0.0), 0.035)


def test_snapshot_is_a_copy_and_the_last_part_completes_the_checkpoint(tmp_path: Path) -> None:
    """Two ranks' checkpointers in one process: rank 0's persist waits for rank 1's part, then writes COMPLETE;
    what training changes after the snapshot is not in the checkpoint."""
    w = torch.zeros(3)
    rank0, rank1 = (ckpt.Checkpointer(tmp_path, r, 2, timeout_s=30) for r in (0, 1))
    rank0.snapshot((0, 4), {"w": w})
    w += 1  # training goes on
    assert ckpt.complete_positions(tmp_path) == []  # rank 1's part is missing
    rank1.snapshot((0, 4), {"w": w})
    rank0.wait()
    rank1.wait()
    assert ckpt.complete_positions(tmp_path) == [(0, 4)]
    part0 = torch.load(tmp_path / "checkpoints" / "e0-m4" / "rank0.pt", weights_only=True)
    assert torch.equal(part0["w"], torch.zeros(3))
    assert len(rank0.snapshot_s) == len(rank0.persist_s) == 1


def test_a_missing_part_leaves_the_checkpoint_incomplete(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rank0 = ckpt.Checkpointer(tmp_path, 0, 2, timeout_s=0.2)
    rank0.snapshot((1, 0), {"w": torch.ones(2)})
    rank0.wait()
    assert ckpt.complete_positions(tmp_path) == []
    assert f"warning: checkpoint {tmp_path / 'checkpoints' / 'e1-m0'} is incomplete: rank1.pt" in capsys.readouterr().out


def test_only_the_newest_complete_checkpoints_are_kept(tmp_path: Path) -> None:
    ck = ckpt.Checkpointer(tmp_path, 0, 1, timeout_s=30)
    for m in (2, 4, 6, 8):
        ck.snapshot((0, m), {"m": m})
    ck.wait()
    assert ckpt.complete_positions(tmp_path) == [(0, 8), (0, 6)][:ckpt.KEEP]
    assert len(list((tmp_path / "checkpoints").iterdir())) == ckpt.KEEP


def test_resume_skips_incomplete_and_unreadable_checkpoints_naming_them(
        tmp_path: Path, one_rank: None, capsys: pytest.CaptureFixture[str]) -> None:
    ck = ckpt.Checkpointer(tmp_path, 0, 1, timeout_s=30)
    for m in (3, 6):
        ck.snapshot((0, m), {"m": m})
    ck.wait()
    newest = tmp_path / "checkpoints" / "e0-m6" / "rank0.pt"
    newest.write_bytes(newest.read_bytes()[:100])  # half-written after its marker: unreadable
    half = tmp_path / "checkpoints" / "e0-m9"
    half.mkdir()
    (half / "rank0.pt").write_bytes(b"cut off")  # a persist that never completed: no marker
    position, (state,) = ckpt.restore(tmp_path, 0, (0,), timeout_s=30)  # type: ignore[misc]
    assert position == (0, 3) and state["m"] == 3
    out = capsys.readouterr().out
    assert f"warning: checkpoint {half} is incomplete" in out
    assert f"warning: checkpoint {newest} cannot be read" in out
    # the resumed run writes the skipped positions again: their stale folders are gone
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["e0-m3"]


def test_resume_with_no_readable_checkpoint_names_the_file(tmp_path: Path, one_rank: None) -> None:
    ck = ckpt.Checkpointer(tmp_path, 0, 1, timeout_s=30)
    ck.snapshot((1, 0), {"m": 0})
    ck.wait()
    part = tmp_path / "checkpoints" / "e1-m0" / "rank0.pt"
    part.write_bytes(b"not a checkpoint")
    with pytest.raises(PipeDreamError, match=f"checkpoint {part} cannot be read"):
        ckpt.restore(tmp_path, 0, (0,), timeout_s=30)
    assert ckpt.restore(tmp_path / "fresh", 0, (0,), timeout_s=30) is None


class _Measured:
    """What a Checkpointer has measured after two snapshots."""

    snapshot_s = [0.05, 0.07]
    persist_s = [2.0]


def test_auto_interval_from_the_probes(one_rank: None) -> None:
    """Two probe segments of 9 minibatches (2 x 4 stages of 1F1B, rounded up to the round of 3), then the interval of
    the second's costs, rounded up to the round; a resumed run continues with it."""
    cadence = ckpt.Cadence("auto", step=3, stages=4, bound=0.035)
    assert cadence.probe == 9 and cadence.count(100) == 9 and cadence.count(5) == 5 and cadence.due
    cadence.measured(6.0, 9, _Measured(), 30)  # type: ignore[arg-type]
    assert cadence.every is None
    cadence.measured(4.8, 9, _Measured(), 30)  # type: ignore[arg-type]
    flush = 4.8 * 3 / 12
    cost = CheckpointCost((4.8 - flush) / 9, 0.07, 2.0, flush)
    assert cadence.cost == cost
    expected = -(-checkpoint_interval(cost, 0.035) // 3) * 3
    assert cadence.every == expected and cadence.count(1000) == expected
    resumed = ckpt.Cadence("auto", step=3, stages=4, bound=0.035)
    resumed.load_state(cadence.state())
    assert resumed.every == expected and resumed.cost == cost
    fixed = ckpt.Cadence(4, step=3, stages=4, bound=0.035)
    assert fixed.every == 6 and fixed.count(20) == 6
    assert ckpt.Cadence(None, 1, 1, 0.035).count(20) == 20 and not ckpt.Cadence(None, 1, 1, 0.035).due


def test_the_prediction_check_covers_the_checkpoints_overhead() -> None:
    """A DP run of 4 workers, 40 minibatches predicted in 20 s: 10 steps of 2 s; a snapshot of 0.1 s and a persist of
    1 s every 5 steps cost 0.1 / 10 s (no flush), beside the 2% it measured."""
    import argparse

    from pipedream.commands.train import checkpoint_check

    args = argparse.Namespace(mode="dp", dp_batch="per_worker", workers=4)
    prediction = {"predicted_epoch_time_s": 20.0, "shape": {"minibatches": 40}, "checkpoint_flush_s": 0.0}
    row = {"checkpoint_overhead": 0.02, "checkpoint_snapshot_s": 0.1, "checkpoint_persist_s": 1.0,
           "checkpoint_every": 5.0}
    assert checkpoint_check(args, prediction, [row]) == {"checkpoint_overhead": 0.02,
                                                         "predicted_checkpoint_overhead": pytest.approx(0.01)}
    assert checkpoint_check(args, {}, [row]) == {}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["pipedream", "dp"])
def test_an_auto_run_checkpoints_at_the_interval_its_costs_give(tmp_path: Path, mode: str) -> None:
    """Two workers, 32 minibatches an epoch (DP: 16 steps): two probe segments of 4 with a checkpoint after each, then
    the interval of the costs the run logged, within the bound by the formula; the epoch's checkpoints after the
    probes lie on that interval."""
    import json

    from pipedream.baselines import ddp
    from pipedream.runtime import worker
    from pipedream.runtime.config import TrainConfig
    from pipedream.runtime.launch import spawn_local
    from tests.tiny import write_data

    cfg = TrainConfig(model="tests.tiny:tiny_model", data_dir=str(write_data(tmp_path / "data")), epochs=1,
                      batch_size=4, checkpoint_every="auto", out_dir=str(tmp_path / "run"), progress=False,
                      comm_timeout_s=30)
    spawn_local(cfg, 2, fn=ddp.train if mode == "dp" else worker.train)
    (row,) = json.loads((tmp_path / "run" / "metrics.json").read_text())
    cost = CheckpointCost(row["checkpoint_minibatch_s"], row["checkpoint_snapshot_s"], row["checkpoint_persist_s"],
                          row["checkpoint_flush_s"])
    every = int(row["checkpoint_every"])
    assert every == checkpoint_interval(cost, 0.035)  # a round of 1 minibatch (a straight pipeline) or step
    assert row["checkpoint_overhead_predicted"] == checkpoint_overhead(cost, every) <= 0.035
    assert (row["checkpoint_flush_s"] > 0) == (mode == "pipedream")  # 1F1B drains at a checkpoint; DP has no pipeline
    steps = 32 if mode == "pipedream" else 16
    assert row["checkpoints"] == 2 + len(range(8 + every, steps, every))
