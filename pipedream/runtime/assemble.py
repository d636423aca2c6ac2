"""The trained model as one piece: every stage saves its final weights, the launcher reassembles them.

At the end of training, replica 0 of every stage writes ``<out_dir>/final/stage<s>.pt`` (its stage
module's ``state_dict``, whose keys are the whole model's parameter and buffer names) and rank 0
writes ``final/layout.json`` (the number of stages). The DP baseline writes the whole model as one
stage. :func:`final_metric` rebuilds the registry model, loads the stages into it and calls the
model's own quality metric (top-1, BLEU, perplexity, ...), so both modes are scored by the same code,
outside the timed training.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from pipedream.errors import PipeDreamError
from pipedream.io import atomic_write_json


def save_stage(out_dir: Path, stage: int, module: nn.Module, num_stages: int | None) -> None:
    """Write stage ``stage``'s weights; ``num_stages`` on the one rank that writes the layout."""
    d = out_dir / "final"
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".stage{stage}.pt.tmp"
    torch.save(module.state_dict(), tmp)
    tmp.replace(d / f"stage{stage}.pt")
    if num_stages is not None:
        atomic_write_json(d / "layout.json", {"stages": num_stages})


def load_into(out_dir: Path, model: nn.Module) -> nn.Module:
    """Load the saved stages into ``model`` (the same architecture); returns it.

    Raises:
        PipeDreamError: missing files, or stages whose names do not cover the model exactly.
    """
    d = out_dir / "final"
    layout_path = d / "layout.json"
    if not layout_path.is_file():
        raise PipeDreamError(f"{layout_path} not found; the workers did not finish")
    state: dict[str, torch.Tensor] = {}
    for s in range(int(json.loads(layout_path.read_text())["stages"])):
        path = d / f"stage{s}.pt"
        if not path.is_file():
            raise PipeDreamError(f"{path} not found; stage {s} did not finish")
        state.update(torch.load(path, weights_only=True))
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise PipeDreamError(f"the saved stages in {d} do not fit the model: {e}") from None
    return model


def final_metric(out_dir: Path, model_name: str, preset: str, seed: int, train_subset: int | None,
                 val_subset: int | None, batch_size: int) -> tuple[str, float] | None:
    """(metric name, value) of the reassembled model on the validation set, or None without a metric hook."""
    from pipedream.models import build_model, get_spec

    spec = get_spec(model_name)
    evaluate = getattr(spec, "evaluate", None)
    make = getattr(spec, "make_datasets", None)
    if evaluate is None or make is None:
        return None
    model = load_into(out_dir, build_model(model_name, preset, seed))
    _, val = make(preset, train_subset, val_subset, seed)
    with torch.no_grad():
        return str(getattr(spec, "metric", "metric")), float(evaluate(model, val, batch_size))
