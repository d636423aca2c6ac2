"""Configuration of one training run, shared by the PipeDream workers and the DP baseline.

The same dataclass is filled from the command line (``python -m pipedream.runtime.worker ...`` under
torchrun, built by ``pipedream train``) or directly by tests and benchmarks.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from torch import nn

from pipedream.errors import PipeDreamError

SCHEDULES = ("1f1b", "gpipe", "2bw")
WEIGHT_SYNC = ("stash", "vertical")
OPTIMIZERS = ("sgd", "adam")


@dataclass
class TrainConfig:
    """One training run.

    Attributes:
        model, preset: registry model and preset (:func:`pipedream.models.build_model`).
        plan: plan JSON path (PipeDream mode); None splits the layers evenly into a straight pipeline.
        schedule: ``1f1b`` (PipeDream 1F1B-RR), ``gpipe`` or ``2bw``.
        microbatches: microbatches per minibatch (GPipe, 2BW); the batch size must be a multiple, and so
            must this of every stage's replicas (replicas take turns over a minibatch's microbatches).
        weight_sync: ``stash`` (weight stashing) or ``vertical`` (vertical sync) for 1F1B (§3.3), on
            unreplicated and replicated stages alike.
        epochs, batch_size, lr, momentum, weight_decay, optimizer, seed: training hyper-parameters;
            ``batch_size`` is the minibatch of one pipeline (PipeDream) or of one worker (DP).
        train_subset, val_subset: sample counts drawn from the splits with ``seed`` (None = all).
        max_minibatches: cap on training minibatches per epoch (tests, smoke runs).
        data_dir: Fashion-MNIST folder (None = ``$PIPEDREAM_FASHION_MNIST`` or the Debian path).
        out_dir: where ``metrics.json`` (and checkpoints, debug dumps, error files) go.
        timeout_s: longest wait for any message or collective, s.
        emulate_bandwidth_Bps: throttle every link to this many bytes/s (None = raw link).
        checkpoint: save each stage's state at every epoch boundary under ``out_dir/checkpoints``.
        checkpoint_every: also checkpoint after every this many minibatches inside an epoch (the
            pipeline is flushed there; implies ``checkpoint``); None = epoch boundaries only.
        resume: continue from the newest complete checkpoint in ``out_dir/checkpoints``.
        progress: show a tqdm bar on one rank.
        debug_dump: write per-rank traces, first gradients and final weights (tests).
        model_factory: builds the model instead of the registry (tests); not settable from the CLI.
    """

    model: str = "vgg16"
    preset: str = "reduced"
    plan: str | None = None
    schedule: str = "1f1b"
    microbatches: int = 1
    weight_sync: str = "stash"
    epochs: int = 1
    batch_size: int = 32
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 5e-4
    optimizer: str = "sgd"
    seed: int = 0
    train_subset: int | None = None
    val_subset: int | None = None
    max_minibatches: int | None = None
    data_dir: str | None = None
    out_dir: str = "results/runs/tmp"
    timeout_s: float = 60.0
    emulate_bandwidth_Bps: float | None = None
    checkpoint: bool = False
    checkpoint_every: int | None = None
    resume: bool = False
    progress: bool = True
    debug_dump: bool = False
    model_factory: Callable[[], nn.Sequential] | None = field(default=None, repr=False)

    def validate(self) -> None:
        """Raise PipeDreamError naming the first bad setting and how to fix it."""
        if self.schedule not in SCHEDULES:
            raise PipeDreamError(f"unknown --schedule {self.schedule!r}; use one of {', '.join(SCHEDULES)}")
        if self.weight_sync not in WEIGHT_SYNC:
            raise PipeDreamError(f"unknown --weight-sync {self.weight_sync!r}; use one of {', '.join(WEIGHT_SYNC)}")
        if self.optimizer not in OPTIMIZERS:
            raise PipeDreamError(f"unknown --optimizer {self.optimizer!r}; use one of {', '.join(OPTIMIZERS)}")
        if self.epochs < 1 or self.batch_size < 1 or self.microbatches < 1:
            raise PipeDreamError("--epochs, --batch-size and --microbatches must be positive")
        if self.batch_size % self.microbatches:
            raise PipeDreamError(f"--batch-size {self.batch_size} is not a multiple of --microbatches "
                                 f"{self.microbatches}")
        if self.schedule == "1f1b" and self.microbatches != 1:
            raise PipeDreamError("--microbatches applies to --schedule gpipe or 2bw; 1F1B uses whole minibatches")
        if self.checkpoint_every is not None and self.checkpoint_every < 1:
            raise PipeDreamError("--checkpoint-every must be a positive number of minibatches")
        if self.timeout_s <= 0:
            raise PipeDreamError("--timeout-s must be positive")
        if self.emulate_bandwidth_Bps is not None and self.emulate_bandwidth_Bps <= 0:
            raise PipeDreamError("--emulate-bandwidth must be a positive number of bytes/s")

    def to_args(self) -> list[str]:
        """Command-line arguments that :func:`from_args` turns back into this config."""
        out: list[str] = []
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "model_factory" or v is None:
                continue
            flag = "--" + f.name.replace("_", "-")
            if isinstance(v, bool):
                out.append(flag if v else "--no-" + flag[2:])
            else:
                out += [flag, str(v)]
        return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one option per :class:`TrainConfig` field (used by the worker and DP entry points)."""
    defaults = TrainConfig()
    for f in fields(TrainConfig):
        if f.name == "model_factory":
            continue
        flag = "--" + f.name.replace("_", "-")
        default: Any = getattr(defaults, f.name)
        if isinstance(default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)
        else:
            kind = {"int": int, "float": float}.get(str(f.type).split(" |")[0], str)
            parser.add_argument(flag, type=kind, default=default)


def from_args(ns: argparse.Namespace) -> TrainConfig:
    """Build and validate a config from parsed arguments."""
    cfg = TrainConfig(**{f.name: getattr(ns, f.name) for f in fields(TrainConfig) if f.name != "model_factory"})
    cfg.validate()
    return cfg
