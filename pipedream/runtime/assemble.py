"""The trained model as one piece: every stage saves its final weights, the launcher reassembles them.

At the end of training, replica 0 of every stage writes ``<out_dir>/final/stage<s>.pt`` (its stage
module's ``state_dict``) and rank 0 writes ``final/layout.json`` (the layer range of every stage). The
DP baseline writes the whole model as one stage. :func:`final_metric` rebuilds the registry model,
loads the stages into it and calls the model's own quality metric (top-1, BLEU, perplexity, ...), so
both modes are scored by the same code, outside the timed training.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from pipedream.errors import PipeDreamError
from pipedream.io import atomic_write_json


def save_stage(out_dir: Path, stage: int, module: nn.Module, layers: range, write_layout: list[range] | None) -> None:
    """Write stage ``stage``'s weights (layers ``layers`` of the model); ``write_layout`` on one rank."""
    d = out_dir / "final"
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".stage{stage}.pt.tmp"
    torch.save(module.state_dict(), tmp)
    tmp.replace(d / f"stage{stage}.pt")
    if write_layout is not None:
        atomic_write_json(d / "layout.json", [[r.start, r.stop] for r in write_layout])


def load_into(out_dir: Path, model: nn.Sequential) -> nn.Sequential:
    """Load the saved stages into ``model`` (the same architecture); returns it.

    Raises:
        PipeDreamError: missing or mismatching files.
    """
    d = out_dir / "final"
    layout_path = d / "layout.json"
    if not layout_path.is_file():
        raise PipeDreamError(f"{layout_path} not found; the workers did not finish")
    for s, (start, stop) in enumerate(json.loads(layout_path.read_text())):
        state = torch.load(d / f"stage{s}.pt", weights_only=True)
        try:
            nn.Sequential(*(model[i] for i in range(start, stop))).load_state_dict(state)
        except RuntimeError as e:
            raise PipeDreamError(f"stage {s} weights do not fit layers {start}..{stop - 1}: {e}") from None
    return model


def final_metric(out_dir: Path, model_name: str, preset: str, seed: int, train_subset: int | None,
                 val_subset: int | None, batch_size: int) -> tuple[str, float] | None:
    """(metric name, value) of the reassembled model on the validation set, or None without a metric hook."""
    if ":" in model_name:
        return None
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
