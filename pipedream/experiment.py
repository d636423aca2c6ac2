"""Experiment configuration files (experiments/*.yaml), validated against the workflow's JSON schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import yaml

from pipedream.errors import PipeDreamError
from pipedream.io import read_text
from pipedream.paths import SCHEMA, shipped

# Time-to-accuracy targets (models.<m>.threshold.metric) that runs can reach. The workers measure these
# every epoch on the validation set:
EPOCH_METRICS = ("top1", "token_accuracy", "perplexity")
# the models' own BLEU (pipedream.models.gnmt.bleu, pipedream.models.s2vt.bleu4) is scored after training on
# the model saved at the end of every epoch (`pipedream train` with score_epochs) and added to each epoch's row:
SCORED_METRICS = ("bleu", "bleu4")
# METEOR (S2VT's paper metric) needs a Java runtime and is never scored: a threshold on it gives no TTA
THRESHOLD_METRICS = EPOCH_METRICS + SCORED_METRICS


def load_yaml(path: str | Path, what: str = "config file", hint: str = "") -> Any:
    """Parse a YAML file; raises PipeDreamError naming the file (as ``what``) if it is missing, with
    ``hint`` appended, and the file and line on a syntax error. A relative path that does not exist
    in the working directory is looked up in the checkout (:func:`pipedream.paths.shipped`)."""
    path = shipped(path)
    text = read_text(path, what, "a YAML file", "YAML", hint)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise PipeDreamError(f"{path}{where}: broken YAML ({getattr(e, 'problem', e)}); fix the syntax") from None


def load_config(path: str | Path) -> dict[str, Any]:
    """Load and validate an experiment config.

    Raises:
        PipeDreamError: broken YAML, or a key that violates workflows/schemas/config.schema.yaml
            (the message names the key path and the rule).
    """
    cfg = load_yaml(path)
    if cfg is None:
        raise PipeDreamError(f"{path} is empty; start from experiments/ci.yaml")
    schema = yaml.safe_load(SCHEMA.read_text())
    try:
        jsonschema.validate(cfg, schema)
    except jsonschema.ValidationError as e:
        key = "/".join(str(p) for p in e.absolute_path) or "<top level>"
        raise PipeDreamError(f"{path}: invalid value at '{key}': {e.message}") from None
    return cfg


def model_data(cfg: dict[str, Any], model: str) -> str:
    """What ``model`` of config ``cfg`` trains on: its ``train.data``, else the top-level ``data`` (which
    ``snakemake --config data=synthetic`` sets), else ``real``."""
    return str(cfg["models"][model]["train"].get("data") or cfg.get("data") or "real")
