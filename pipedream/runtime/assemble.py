"""The trained model as one piece: every stage saves its weights, the launcher reassembles them.

At the end of training, replica 0 of every stage writes ``<out_dir>/final/stage<s>.pt`` (its stage
module's ``state_dict``, whose keys are the whole model's parameter and buffer names) and rank 0
writes ``final/layout.json`` (the number of stages). The DP baseline writes the whole model as one
stage. :func:`final_metric` rebuilds the registry model, loads the stages into it and calls the
model's own quality metric (top-1, BLEU, perplexity, ...), so both modes are scored by the same code,
outside the timed training.

With ``score_epochs`` the same files are also written at the end of every epoch, under ``<out_dir>/epochs/<k>/``,
and :func:`epoch_metrics` scores each of them after training (BLEU has no cheap per-minibatch form): neither the
writing (kept out of ``wall_time_s``) nor the scoring counts towards time-to-accuracy, in both modes alike.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import torch
from torch import nn

from pipedream.errors import PipeDreamError
from pipedream.io import atomic_write_json

EPOCHS_DIR = "epochs"  # <out_dir>/epochs/<k>/: the model at the end of epoch k (score_epochs)


def model_dir(out_dir: Path, epoch: int | None = None) -> Path:
    """Where a model's stages go: ``out_dir/final`` (the trained model) or ``out_dir/epochs/<epoch>``."""
    return out_dir / "final" if epoch is None else out_dir / EPOCHS_DIR / str(epoch)


def save_stage(out_dir: Path, stage: int, module: nn.Module, num_stages: int | None, epoch: int | None = None) -> None:
    """Write stage ``stage``'s weights; ``num_stages`` on the one rank that writes the layout; ``epoch``:
    the model at the end of that epoch (1-based) rather than the final one."""
    d = model_dir(out_dir, epoch)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".stage{stage}.pt.tmp"
    torch.save(module.state_dict(), tmp)
    tmp.replace(d / f"stage{stage}.pt")
    if num_stages is not None:
        atomic_write_json(d / "layout.json", {"stages": num_stages})


def save_epoch(out_dir: Path, stage: int, module: nn.Module, num_stages: int | None, epoch: int, writes: bool,
               timeout_s: float) -> float:
    """End of ``epoch`` with ``score_epochs``: :func:`save_stage` on the ranks that ``writes`` (one per stage),
    then wait for every rank (a barrier, at most ``timeout_s``). Returns the seconds spent, which the
    caller keeps out of ``wall_time_s`` and so out of time-to-accuracy."""
    from pipedream.runtime import distributed as D

    t0 = time.time()
    if writes:
        save_stage(out_dir, stage, module, num_stages, epoch=epoch)
    D.barrier(timeout_s, f"epoch {epoch}'s model saved")
    return time.time() - t0


def load_into(out_dir: Path, model: nn.Module, epoch: int | None = None) -> nn.Module:
    """Load the saved stages (the final ones, or those of ``epoch``) into ``model`` (the same
    architecture); returns it.

    Raises:
        PipeDreamError: missing files, or stages whose names do not cover the model exactly.
    """
    d = model_dir(out_dir, epoch)
    layout_path = d / "layout.json"
    if not layout_path.is_file():
        what = "the workers did not finish" if epoch is None else f"epoch {epoch}'s model was not saved"
        raise PipeDreamError(f"{layout_path} not found; {what}")
    state: dict[str, torch.Tensor] = {}
    for s in range(int(json.loads(layout_path.read_text())["stages"])):
        path = d / f"stage{s}.pt"
        if not path.is_file():
            raise PipeDreamError(f"{path} not found; stage {s} did not finish")
        state.update(torch.load(path, weights_only=True))
    aliases: dict[int, list[str]] = {}  # tied weights: one tensor under several names, saved under one of them
    for name, value in model.state_dict(keep_vars=True).items():
        aliases.setdefault(id(value), []).append(name)
    for names in aliases.values():
        saved = next((n for n in names if n in state), None)
        for n in names:
            if saved is not None:
                state.setdefault(n, state[saved])
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise PipeDreamError(f"the saved stages in {d} do not fit the model: {e}") from None
    return model


def final_metric(out_dir: Path, model_name: str, preset: str, seed: int, train_subset: int | None,
                 val_subset: int | None, batch_size: int) -> tuple[str, float] | None:
    """(metric name, value) of the reassembled model on the validation set, or None without a metric hook."""
    scored = _score(out_dir, model_name, preset, seed, train_subset, val_subset, batch_size, [None])
    return None if scored is None else (scored[0], scored[1][0])


def epoch_metrics(out_dir: Path, model_name: str, preset: str, seed: int, train_subset: int | None,
                  val_subset: int | None, batch_size: int, epochs: list[int]) -> tuple[str, list[float]] | None:
    """(metric name, one value per epoch of ``epochs`` (1-based)) of the models saved at the end of those
    epochs, on the validation set, or None without a metric hook.

    Raises:
        PipeDreamError: an epoch's model is missing (that epoch was trained without ``score_epochs``).
    """
    return _score(out_dir, model_name, preset, seed, train_subset, val_subset, batch_size, list(epochs))


def remove_epoch_models(out_dir: Path) -> None:
    """Delete ``out_dir/epochs`` (one whole model per epoch: large at full scale) once it is scored."""
    shutil.rmtree(out_dir / EPOCHS_DIR, ignore_errors=True)


def _score(out_dir: Path, model_name: str, preset: str, seed: int, train_subset: int | None, val_subset: int | None,
           batch_size: int, epochs: list[int | None]) -> tuple[str, list[float]] | None:
    """The model's metric on each saved model of ``epochs`` (None: the final one); one model, one data set."""
    from pipedream.models import build_model, get_spec

    spec = get_spec(model_name)
    evaluate = getattr(spec, "evaluate", None)
    make = getattr(spec, "make_datasets", None)
    if evaluate is None or make is None:
        return None
    model = build_model(model_name, preset, seed)
    _, val = make(preset, train_subset, val_subset, seed)
    with torch.no_grad():
        values = [float(evaluate(load_into(out_dir, model, epoch), val, batch_size)) for epoch in epochs]
    return str(getattr(spec, "metric", "metric")), values
