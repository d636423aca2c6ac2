"""Per-stage checkpoints at epoch boundaries, and resume.

Every rank writes ``<out_dir>/checkpoints/epoch<e>/rank<r>.pt`` with its stage's weights, optimizer
state, stored weight versions, RNG state and the metrics rows so far; after a barrier rank 0 writes
``COMPLETE`` in that folder. The data-loader position is the epoch number (each epoch's sample order is
fixed by the seed and the epoch), so resuming at an epoch boundary continues exactly where the
interrupted run would have. Files are read with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from pipedream.errors import PipeDreamError
from pipedream.runtime import distributed as D
from pipedream.runtime.versions import WeightVersions

MARKER = "COMPLETE"


def _dir(out_dir: Path, epoch: int) -> Path:
    return out_dir / "checkpoints" / f"epoch{epoch}"


def latest_complete(out_dir: Path) -> int:
    """The newest epoch with a complete checkpoint, 0 if none."""
    root = out_dir / "checkpoints"
    done = [int(p.name[5:]) for p in root.glob("epoch*") if (p / MARKER).is_file() and p.name[5:].isdigit()]
    return max(done, default=0)


def save_stage(out_dir: Path, epoch: int, stage: int, rank: int, stage_ranks: list[list[int]], module: nn.Module,
               optimizer: torch.optim.Optimizer, versions: WeightVersions, rows: list[dict[str, float]]) -> None:
    """Write this rank's checkpoint after ``epoch`` (1-based) epochs; rank 0 marks it complete after all wrote."""
    d = _dir(out_dir, epoch)
    d.mkdir(parents=True, exist_ok=True)
    state = {"epoch": epoch, "stage": stage, "stage_ranks": stage_ranks, "module": module.state_dict(),
             "optimizer": optimizer.state_dict(), "versions": versions.state(), "rng": torch.get_rng_state(),
             "rows": rows}
    tmp = d / f".rank{rank}.pt.tmp"
    torch.save(state, tmp)
    tmp.replace(d / f"rank{rank}.pt")
    D.barrier(600.0, f"checkpoint of epoch {epoch}")
    if rank == 0:
        (d / MARKER).write_text(f"{epoch}\n")


def load_stage(out_dir: Path, stage: int, rank: int, stage_ranks: list[list[int]], module: nn.Module,
               optimizer: torch.optim.Optimizer, versions: WeightVersions) -> tuple[int, list[dict[str, float]]]:
    """Restore this rank from the newest complete checkpoint; returns (epochs done, metrics rows).

    Starts from scratch (0, []) when there is none.

    Raises:
        PipeDreamError: the checkpoint was written for another plan.
    """
    epoch = latest_complete(out_dir)
    if epoch == 0:
        return 0, []
    path = _dir(out_dir, epoch) / f"rank{rank}.pt"
    state = torch.load(path, weights_only=True)
    if state["stage"] != stage or state["stage_ranks"] != stage_ranks:
        raise PipeDreamError(f"checkpoint {path} is for stage {state['stage']} of {state['stage_ranks']}, not stage "
                             f"{stage} of {stage_ranks}; resume with the same plan or start a fresh --out-dir")
    module.load_state_dict(state["module"])
    optimizer.load_state_dict(state["optimizer"])
    versions.load_state(state["versions"])
    torch.set_rng_state(state["rng"])
    return int(state["epoch"]), list(state["rows"])
