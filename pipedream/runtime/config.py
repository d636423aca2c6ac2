"""Configuration of one training run: the one definition of every training option.

:class:`TrainConfig` is filled from the command line of the workers (``python -m pipedream.runtime.worker
...`` under torchrun), of ``pipedream train`` (:func:`add_arguments` adds one flag per field, with its
help and default) and of the workflow (:func:`flags_from_experiment` turns a config file's
``models.<m>.train`` section into the same flags), or directly by tests and benchmarks. The defaults
below are the only ones: nothing else declares them again. Importing this module does not import torch.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipedream.costmodel import DDP_BUCKET_CAP_BYTES
from pipedream.errors import PipeDreamError
from pipedream.torch_schedules import TORCH_CLASSES

if TYPE_CHECKING:
    from torch import nn

SCHEDULES = ("1f1b", "gpipe", "2bw", "pipedream_flush")  # our runtime's
TORCH_SCHEDULES = tuple(TORCH_CLASSES)  # torch.distributed.pipelining's, by our names: --runtime torch runs them
RUNTIMES = ("pipedream", "torch")
WEIGHT_SYNC = ("stash", "vertical")
OPTIMIZERS = ("sgd", "adam", "muon")
LR_POLICIES = ("constant", "polynomial", "step")
DP_BATCH = ("per_worker", "global")
STAGE_LR = ("sgd", "all", "none")
PRESETS = ("reduced", "full")
DATA = ("real", "synthetic")


def _opt(default: Any, help: str, choices: tuple[str, ...] | None = None) -> Any:  # noqa: A002 - argparse's name
    """A field with its command-line help (and choices) as metadata."""
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass
class TrainConfig:
    """One training run. Every settable field's meaning, default and choices are its command-line help (the
    ``help`` and ``choices`` metadata that :func:`add_arguments` offers: ``pipedream train --help``), written
    only there.

    Beyond the help: ``batch_size`` must be a multiple of ``microbatches``, and ``microbatches`` of every
    stage's replicas (replicas take turns over a minibatch's microbatches); ``compat`` runs 1F1B with
    :func:`pipedream.schedules.warmup_count` instead of :func:`pipedream.schedules.warmup_count_consistent`.
    The last three fields have no command-line form (:data:`NOT_CLI`).

    Attributes:
        model_factory: builds the model instead of the registry (tests, :func:`pipedream.train`).
        datasets: ``(train, val)`` instead of the model's data, or a function returning them
            (:func:`pipedream.train`); subsets are drawn from them.
        criterion: ``criterion(output, target) -> loss`` for ``model_factory``'s model (default: cross-entropy of
            the logits, :func:`pipedream.models.classification_loss`).
    """

    model: str = _opt("vgg16", "registered model (pipedream.models), or package.module:fn, a function of yours "
                      "that returns an nn.Module or a ModelSpec (docs/your-own-model.md)")
    preset: str = _opt("reduced", "model size: reduced (CPU) or full (the paper's)", PRESETS)
    plan: str | None = _opt(None, "plan JSON from `pipedream plan` (pipedream mode; default: an even split of the "
                                  "layers into a straight pipeline)")
    schedule: str = _opt("1f1b", "pipedream mode: 1F1B-RR with weight stashing, GPipe, PipeDream-2BW, or "
                                 "PipeDream-Flush (1F1B over each minibatch's microbatches, then a flush: one "
                                 "weight version); with --runtime torch one of torch's: gpipe, pipedream_flush "
                                 "(Schedule1F1B), interleaved_1f1b, looped_bfs, interleaved_zb, zbv, dualpipev "
                                 "(default there: the plan's)", tuple(dict.fromkeys(SCHEDULES + TORCH_SCHEDULES)))
    runtime: str = _opt("pipedream", "pipedream mode: our runtime (PipeDream's schedules, weight stashing, vertical "
                                     "sync, 2BW) or torch: torch.distributed.pipelining's schedule classes run the "
                                     "plan's stages (docs/torch-runtime.md)", RUNTIMES)
    microbatches: int = _opt(1, "microbatches per minibatch (gpipe, 2bw, pipedream_flush; with --runtime torch per "
                                "pipeline, default there: the plan's)")
    recompute: bool = _opt(False, "pipedream mode: recompute each stage's forward in its backward "
                                  "(torch.utils.checkpoint, non-reentrant): a stage keeps only its inputs per "
                                  "microbatch in flight, at the cost of one more forward per backward")
    weight_sync: str = _opt("stash", "1f1b: weight stashing alone or with vertical sync (§3.3)", WEIGHT_SYNC)
    compat: bool = _opt(False, "1f1b: the release runtime's warm-up counts, ceil(downstream workers / replicas), "
                               "instead of counts consistent for replicated stages, and its per-stage learning "
                               "rate for every optimizer (--stage-lr all)")
    stage_lr: str = _opt("sgd", "1f1b: scale stage s's learning rate by replicas(s) / replicas(input stage), as the "
                                "release's runtime does, so every stage takes the same step per sample (a replicated "
                                "stage steps once per round of its replicas' minibatches): for SGD only (default; "
                                "Adam's step does not grow with the averaged gradient), all optimizers, or none",
                         STAGE_LR)
    epochs: int = _opt(1, "passes over the training samples")
    batch_size: int = _opt(32, "samples per minibatch of the pipeline (pipedream) or of each worker (dp)")
    lr: float = _opt(0.01, "learning rate")
    momentum: float = _opt(0.9, "SGD momentum")
    weight_decay: float = _opt(5e-4, "L2 weight decay")
    optimizer: str = _opt("sgd", "sgd (with --momentum), adam, or muon: torch.optim.Muon on the hidden weight "
                                 "matrices (every nn.Linear weight but the output layer's) and Adam on the rest "
                                 "(embeddings, biases, norms, the output layer), both at --lr; robust to 2BW's "
                                 "one-step delay (Zmushko et al., ICML 2026)", OPTIMIZERS)
    seed: int = _opt(0, "seed of the weights, the subsets and the data order")
    lr_policy: str = _opt("constant", "learning-rate policy over the epochs: constant, polynomial "
                                      "(lr * (1 - p/epochs)^lr_power) or step (x0.1 every lr_step_epochs)", LR_POLICIES)
    lr_power: float = _opt(2.0, "power of the polynomial policy")
    lr_step_epochs: float = _opt(30.0, "epochs between the step policy's x0.1 decays")
    lr_warmup_epochs: float = _opt(0.0, "epochs of linear warm-up to a scaled learning rate (Goyal et al. 2017); "
                                        "0: none")
    clip_norm: float = _opt(0.0, "clip gradients to this L2 norm (dp: the model's; pipedream: each stage's); 0: off")
    dp_batch: str = _opt("per_worker", "dp: --batch-size per worker (a minibatch of workers x batch; SGD's lr scaled "
                                       "by workers with warm-up: Goyal et al. 2017) or global (each worker takes "
                                       "batch/workers: the pipeline's minibatch and learning rate)", DP_BATCH)
    train_subset: int | None = _opt(None, "training samples drawn from the training split (default or 0: all)")
    val_subset: int | None = _opt(None, "validation samples drawn from the validation split (default or 0: all)")
    max_minibatches: int | None = _opt(None, "cap on minibatches per epoch (smoke runs)")
    data: str = _opt("real", "real: the model's data set; synthetic: random samples of its input shapes and label "
                             "ranges, generated per sample from --seed (epoch times at paper scale without "
                             "ImageNet/WMT16/PTB/MSVD; accuracy is meaningless), as many as the real set unless "
                             "--train-subset/--val-subset", DATA)
    data_dir: str | None = _opt(None, "data folder (default: the Debian package's or $PIPEDREAM_<DATASET>)")
    out_dir: str | None = _opt(None, "where metrics.json, checkpoints and train.log go (default: "
                                     "results/runs/<model>/<mode>)")
    comm_timeout_s: float = _opt(60.0, "limit for any single wait on a message or collective, s")
    emulate_bandwidth_Bps: float | None = _opt(None, "throttle every link to this many bytes/s (logged); default: raw link")
    bucket_bytes: int = _opt(DDP_BUCKET_CAP_BYTES, "gradient bucket cap in bytes (both modes; DDP's bucket_cap_mb in "
                                                   "bytes): replicas allreduce each bucket as soon as the backward "
                                                   "has produced its gradients, overlapping the rest of the backward")
    checkpoint: bool = _opt(False, "checkpoint at the end of every epoch (both modes; docs/checkpoints.md)")
    checkpoint_every: str | int | None = _opt(None, "also checkpoint every N minibatches inside an epoch (dp: N steps), "
                                                    "or auto: the most frequent interval whose overhead stays within "
                                                    "--checkpoint-overhead, from the snapshot and persist seconds "
                                                    "measured in the first minibatches (CheckFreq); a pipeline is "
                                                    "flushed there (1F1B and 2BW pay a drain); implies --checkpoint")
    checkpoint_overhead: float = _opt(0.035, "--checkpoint-every auto: the largest share of the training time that "
                                             "checkpoints may add (CheckFreq's 3.5%%)")
    resume: bool = _opt(False, "continue from the newest checkpoint in --out-dir")
    score_epochs: bool = _opt(False, "save the model at the end of every epoch and score each with the model's own "
                                     "metric (bleu, bleu4, ...) after training, logged per epoch (writing is excluded "
                                     "from the wall time, scoring runs after training); implied by a "
                                     "--threshold-metric that is the model's metric")
    progress: bool = _opt(True, "a per-minibatch progress bar on one rank")
    debug_dump: bool = _opt(False, "write per-rank traces, first gradients and final weights (tests)")
    measure_memory: bool = _opt(True, "count each stage's bytes (weights, versions, gradients, optimizer state, "
                                      "buffers, saved activations) after every training action of each epoch's first "
                                      "2 x stages + 2 minibatches (past the warm-up); log the per-stage peak "
                                      "(peak_memory_bytes_stage<s>) per epoch")
    model_factory: Callable[[], nn.Module] | None = field(default=None, repr=False)
    datasets: tuple[Any, Any] | Callable[[], tuple[Any, Any]] | None = field(default=None, repr=False)
    criterion: Callable[[Any, Any], Any] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        # 0 samples of a split means the whole split, as on the command line
        self.train_subset = self.train_subset or None
        self.val_subset = self.val_subset or None
        if isinstance(self.checkpoint_every, str) and self.checkpoint_every.strip().isdigit():
            self.checkpoint_every = int(self.checkpoint_every)
        if self.checkpoint_every is not None:
            self.checkpoint = True

    @property
    def warmup(self) -> str:
        """1F1B warm-up counts (:data:`pipedream.schedules.WARMUPS` key): ``release`` with ``compat``."""
        return "release" if self.compat else "consistent"

    def validate(self) -> None:
        """Raise PipeDreamError naming the first bad setting and how to fix it."""
        for f in fields(self):
            value, choices = getattr(self, f.name), f.metadata.get("choices")
            if choices and value not in choices:
                raise PipeDreamError(f"unknown --{f.name.replace('_', '-')} {value!r}; use one of {', '.join(choices)}")
        if self.data == "synthetic" and self.data_dir:
            raise PipeDreamError("--data-dir names real data; leave it out with --data synthetic")
        if self.lr <= 0 or self.lr_power <= 0 or self.lr_step_epochs <= 0:
            raise PipeDreamError("--lr, --lr-power and --lr-step-epochs must be positive")
        if self.clip_norm < 0 or self.lr_warmup_epochs < 0:
            raise PipeDreamError("--clip-norm and --lr-warmup-epochs must be >= 0 (0 turns them off)")
        if self.epochs < 1 or self.batch_size < 1 or self.microbatches < 1:
            raise PipeDreamError("--epochs, --batch-size and --microbatches must be positive")
        if self.batch_size % self.microbatches:
            raise PipeDreamError(f"--batch-size {self.batch_size} is not a multiple of --microbatches "
                                 f"{self.microbatches}")
        if self.runtime == "torch" and self.schedule not in TORCH_SCHEDULES:
            raise PipeDreamError(f"--runtime torch runs torch's schedules, not --schedule {self.schedule}; give one of "
                                 f"{', '.join(TORCH_SCHEDULES)}, or a plan from `pipedream plan --runtime torch`")
        if self.runtime == "torch" and (self.recompute or self.weight_sync != "stash" or self.compat):
            raise PipeDreamError("--recompute, --weight-sync and --compat are options of our runtime; leave them out "
                                 "with --runtime torch")
        if self.runtime == "pipedream" and self.schedule not in SCHEDULES:
            raise PipeDreamError(f"--schedule {self.schedule} is one of torch's schedules: add --runtime torch "
                                 "(torch.distributed.pipelining runs it)")
        if self.schedule == "1f1b" and self.microbatches != 1:
            raise PipeDreamError("--microbatches applies to --schedule gpipe, 2bw or pipedream_flush; 1F1B uses "
                                 "whole minibatches")
        for name in ("train_subset", "val_subset"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise PipeDreamError(f"--{name.replace('_', '-')} must not be negative (got {value}); leave it out "
                                     "(or give 0) for the whole split")
        if self.max_minibatches is not None and self.max_minibatches < 1:
            raise PipeDreamError("--max-minibatches must be a positive number of minibatches")
        every = self.checkpoint_every
        if every is not None and every != "auto" and not (isinstance(every, int) and every >= 1):
            raise PipeDreamError(f"--checkpoint-every {every!r} is neither a positive number of minibatches nor auto")
        if not 0 < self.checkpoint_overhead < 1:
            raise PipeDreamError(f"--checkpoint-overhead {self.checkpoint_overhead:g} is not a fraction between 0 and 1 "
                                 "(0.035 is 3.5%)")
        if self.comm_timeout_s <= 0:
            raise PipeDreamError("--comm-timeout-s must be positive")
        if self.emulate_bandwidth_Bps is not None and self.emulate_bandwidth_Bps <= 0:
            raise PipeDreamError("--emulate-bandwidth must be a positive number of bytes/s")
        if self.bucket_bytes <= 0:
            raise PipeDreamError(f"--bucket-bytes must be a positive number of bytes (got {self.bucket_bytes}); "
                                 f"DDP's default is {DDP_BUCKET_CAP_BYTES}")

    def run_dir(self, mode: str) -> Path:
        """``out_dir``, or ``results/runs/<model>/<mode>`` when it is not set (``mode``: pipedream or dp;
        a ``package.module:function`` model's folder is ``package.module.function``)."""
        if self.out_dir:
            return Path(self.out_dir)
        return Path("results") / "runs" / self.model.replace(":", ".") / mode

    def to_args(self) -> list[str]:
        """Command-line arguments that :func:`from_args` turns back into this config."""
        out: list[str] = []
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in NOT_CLI or v is None:
                continue
            flag = "--" + f.name.replace("_", "-")
            if isinstance(v, bool):
                out.append(flag if v else "--no-" + flag[2:])
            else:
                out += [flag, str(v)]
        return out


NOT_CLI = ("model_factory", "datasets", "criterion")  # Python objects: no command-line form
CLI_HIDDEN = (*NOT_CLI, "debug_dump")  # not offered by `pipedream train`


def add_arguments(parser: argparse.ArgumentParser, hide: tuple[str, ...] = NOT_CLI) -> None:
    """Add one option per :class:`TrainConfig` field (``--batch-size`` for ``batch_size``), with the field's
    default, help and choices; ``hide`` names fields not to offer."""
    for f in fields(TrainConfig):
        if f.name in hide or f.name in NOT_CLI:
            continue
        flag = "--" + f.name.replace("_", "-")
        default: Any = f.default if f.default is not MISSING else None
        help_ = f.metadata.get("help")
        if isinstance(default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=help_)
        else:
            kind = {"int": int, "float": float}.get(str(f.type).split(" |")[0], str)  # the field's annotation
            parser.add_argument(flag, type=kind, default=default, choices=f.metadata.get("choices"), help=help_)


def from_args(ns: argparse.Namespace, plan_extra: dict[str, Any] | None = None) -> TrainConfig:
    """Build and validate a config from parsed arguments (those of :func:`add_arguments`); ``plan_extra``: the run's
    plan's ``extra``, whose schedule ``--runtime torch`` takes by default (:func:`plan_schedule`)."""
    cfg = TrainConfig(**{f.name: getattr(ns, f.name) for f in fields(TrainConfig) if hasattr(ns, f.name)})
    plan_schedule(cfg, plan_extra or {})
    cfg.validate()
    return cfg


def plan_schedule(cfg: TrainConfig, extra: dict[str, Any]) -> None:
    """With ``runtime == "torch"`` and a schedule torch does not have (the default, 1f1b): take the plan's schedule
    and, where ``microbatches`` is left at 1, its microbatches (``extra``: a plan's ``extra``, as ``pipedream plan
    --runtime torch`` or ``--schedule`` writes it). Changes ``cfg`` in place."""
    if cfg.runtime != "torch" or cfg.schedule in TORCH_SCHEDULES or extra.get("schedule") not in TORCH_SCHEDULES:
        return
    cfg.schedule = str(extra["schedule"])
    if cfg.microbatches == 1 and isinstance(extra.get("microbatches"), int):
        cfg.microbatches = int(extra["microbatches"])


def flags_from_experiment(train: dict[str, Any]) -> str:
    """``pipedream train`` flags for an experiment config's ``models.<model>.train`` section.

    Keys are :class:`TrainConfig` field names; a key this function does not know is left to the caller
    (``pipedream check`` reports it). Missing keys take the TrainConfig defaults.

    Example: ``{"epochs": 2, "batch_size": 32}`` -> ``"--epochs 2 --batch-size 32"``.
    """
    known = {f.name for f in fields(TrainConfig)} - set(NOT_CLI)
    return " ".join(f"--{k.replace('_', '-')} {v}" for k, v in train.items() if k in known and v is not None)
