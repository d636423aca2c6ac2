"""Per-stage checkpoints at epoch and N-minibatch boundaries, and resume.

A checkpoint is taken at a *position* ``(epochs done, minibatches done in the next epoch)``: at the
end of every epoch ``(e, 0)`` and, with ``--checkpoint-every N``, after every N minibatches inside
an epoch, where the pipeline is flushed (the epoch's schedule runs as segments of N minibatches).
Every rank writes ``<out_dir>/checkpoints/e<epochs>-m<minibatches>/rank<r>.pt`` with its stage's weights,
optimizer state, stored weight versions, RNG state, the metrics rows so far and its partial sums of the epoch in
progress (atomically); after a barrier rank 0 writes ``COMPLETE`` there: a folder without it is never resumed
from. The data-loader position is the position itself (each epoch's sample order is fixed by the seed and the
epoch), so a resumed run continues exactly where the interrupted run would have. Files are read with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn

from pipedream.errors import PipeDreamError
from pipedream.io import atomic_write_text
from pipedream.runtime import distributed as D
from pipedream.runtime.versions import WeightVersions

MARKER = "COMPLETE"
_NAME = re.compile(r"^e(\d+)-m(\d+)$")


def _dir(out_dir: Path, position: tuple[int, int]) -> Path:
    return out_dir / "checkpoints" / f"e{position[0]}-m{position[1]}"


def latest_complete(out_dir: Path) -> tuple[int, int]:
    """The newest position ``(epochs, minibatches)`` with a complete checkpoint, ``(0, 0)`` if none."""
    return max(complete_positions(out_dir), default=(0, 0))


def save_stage(out_dir: Path, position: tuple[int, int], stage: int, rank: int, stage_ranks: list[list[int]],
               module: nn.Module, optimizer: torch.optim.Optimizer, versions: WeightVersions,
               rows: list[dict[str, float]], partial: list[float] | None = None) -> None:
    """Write this rank's checkpoint at ``position``; rank 0 marks it complete after all ranks wrote.

    ``partial``: this rank's running sums of the epoch in progress (mid-epoch checkpoints).
    """
    d = _dir(out_dir, position)
    d.mkdir(parents=True, exist_ok=True)
    state = {"position": list(position), "stage": stage, "stage_ranks": stage_ranks, "module": module.state_dict(),
             "optimizer": optimizer.state_dict(), "versions": versions.state(), "rng": torch.get_rng_state(),
             "rows": rows, "partial": partial or []}
    tmp = d / f".rank{rank}.pt.tmp"
    torch.save(state, tmp)
    tmp.replace(d / f"rank{rank}.pt")
    D.barrier(600.0, f"checkpoint at epoch {position[0]} + {position[1]} minibatches")
    if rank == 0:
        atomic_write_text(d / MARKER, f"{position[0]} {position[1]}\n")


def complete_positions(out_dir: Path) -> list[tuple[int, int]]:
    """Every position with a complete checkpoint (its ``COMPLETE`` marker written), newest first."""
    root = out_dir / "checkpoints"
    done = [(int(m[1]), int(m[2])) for p in root.glob("e*-m*") if (m := _NAME.match(p.name)) and (p / MARKER).is_file()]
    return sorted(done, reverse=True)


def load_stage(out_dir: Path, stage: int, rank: int, stage_ranks: list[list[int]], module: nn.Module,
               optimizer: torch.optim.Optimizer, versions: WeightVersions
               ) -> tuple[tuple[int, int], list[dict[str, float]], list[float]]:
    """Restore this rank from the newest complete checkpoint that every rank can read (every rank calls it).

    A checkpoint some rank cannot read (truncated, corrupt) is skipped for the next older complete one, by
    all ranks alike; the rank that cannot read it prints a ``warning:`` naming the file.

    Returns:
        (position, metrics rows, partial sums of the epoch in progress); ``((0, 0), [], [])`` when
        there is no checkpoint.
    Raises:
        PipeDreamError: the checkpoint was written for another plan, or none of the complete checkpoints can
            be read (naming this rank's unreadable file; :class:`~pipedream.runtime.distributed.PeerFailed` on
            the ranks that could read theirs).
    """
    unreadable: list[str] = []
    for position in complete_positions(out_dir):
        path = _dir(out_dir, position) / f"rank{rank}.pt"
        try:
            state = torch.load(path, weights_only=True)
        except Exception as e:  # noqa: BLE001 - any unreadable file: try the previous checkpoint
            why = (str(e).splitlines() or [""])[0] or type(e).__name__
            unreadable.append(f"checkpoint {path} cannot be read ({why})")
            print(f"warning: {unreadable[-1]}; --resume falls back to the previous complete checkpoint", flush=True)
            state = None
        (bad,) = D.allreduce_sum([float(state is None)], 600.0, f"checkpoint check at epoch {position[0]}")
        if bad == 0 and state is not None:
            break
    else:
        if unreadable:
            raise PipeDreamError(f"{unreadable[0]} and no older complete checkpoint exists; remove "
                                 f"{out_dir / 'checkpoints'} to start from scratch")
        if complete_positions(out_dir):
            raise D.PeerFailed("another rank cannot read its checkpoints")
        return (0, 0), [], []
    if state["stage"] != stage or state["stage_ranks"] != stage_ranks:
        raise PipeDreamError(f"checkpoint {path} is for stage {state['stage']} of {state['stage_ranks']}, not stage "
                             f"{stage} of {stage_ranks}; resume with the same plan or start a fresh --out-dir")
    module.load_state_dict(state["module"])
    optimizer.load_state_dict(state["optimizer"])
    versions.load_state(state["versions"])
    torch.set_rng_state(state["rng"])
    return position, list(state["rows"]), [float(x) for x in state["partial"]]
