"""Tiny models, data and single-process references for the runtime tests (not a test module)."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import torch
from torch import nn

from pipedream.data import fashion_mnist as fm
from pipedream.plan import Plan
from pipedream.runtime.stage import straight_plan


def tiny_model() -> nn.Sequential:
    """8 layers on (B, 3, 32, 32): conv, relu, flatten, linear, tanh, linear, tanh, linear -> 10 logits."""
    return nn.Sequential(nn.Conv2d(3, 4, 3, stride=4), nn.ReLU(), nn.Flatten(), nn.Linear(256, 16), nn.Tanh(),
                         nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 10))


def tiny_dropout_model() -> nn.Sequential:
    """Like :func:`tiny_model` with a dropout layer, so resuming must restore the RNG too."""
    return nn.Sequential(nn.Conv2d(3, 4, 3, stride=4), nn.ReLU(), nn.Flatten(), nn.Linear(256, 16), nn.Dropout(0.2),
                         nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 10))


def bn_model() -> nn.Sequential:
    """7 layers with BatchNorm (its running statistics are buffers the forward updates): conv, batchnorm, relu,
    flatten, linear, tanh, linear -> 10 logits."""
    return nn.Sequential(nn.Conv2d(3, 4, 3, stride=4), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(256, 16),
                         nn.Tanh(), nn.Linear(16, 10))


class Flat(nn.Module):
    """Flatten into fresh storage (a copy, not a view of the input)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1).clone()


def deep_model() -> nn.Sequential:
    """8 layers, a copying flatten, then linear 3072->32 and tanh (stage 0 of a [3, 3, 2] split), linear 32->32,
    tanh, linear 32->32 (stage 1), tanh, linear 32->10 (stage 2). No layer's output is a view of another
    tensor, so the memory model's activation bytes per microbatch are what autograd saves."""
    return nn.Sequential(Flat(), nn.Linear(3 * 32 * 32, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 32),
                         nn.Tanh(), nn.Linear(32, 10))


def linear_model() -> nn.Sequential:
    """A two-layer linear model (no nonlinearity): the 2BW update rule is checked on it."""
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 8), nn.Linear(8, 10))


def stash_model() -> nn.Sequential:
    """Flatten, linear, tanh, linear, tanh, linear (6 layers), for the weight-stashing test on 2 stages
    (layers 0-4, then 5). The first stage's backward passes through its second linear layer, so it
    reads that layer's weights: the weight version used there shows in the gradients."""
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 10))


def bucket_model() -> nn.Sequential:
    """8 layers whose last five hold ~1.1 MiB of parameters: flatten, linear 3072->32, tanh (stage 0 of a
    [3, 5] split), linear 32->512, tanh, linear 512->512, tanh, linear 512->10 (stage 1). In backward order,
    layers 7 and 5 (20,520 + 1,050,624 bytes) fill DDP's 1 MiB first bucket, so a small bucket cap gives
    stage 1 a second bucket with layer 3 (67,584 bytes)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 32), nn.Tanh(), nn.Linear(32, 512), nn.Tanh(),
                         nn.Linear(512, 512), nn.Tanh(), nn.Linear(512, 10))


def write_idx(path: Path, array: np.ndarray) -> None:
    """Write a uint8 array as a gzip-compressed IDX file (the format :func:`pipedream.data.fashion_mnist.read_idx`
    reads)."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wb") as f:
        f.write(header + array.tobytes())


def write_data(root: Path, n_train: int = 128, n_val: int = 32, seed: int = 0) -> Path:
    """Random-pixel IDX files with Fashion-MNIST's names under ``root``; returns ``root``."""
    rng = np.random.default_rng(seed)
    for (img, lbl), n in ((fm.FILES["train"], n_train), (fm.FILES["val"], n_val)):
        write_idx(root / img, rng.integers(0, 256, (n, 28, 28)))
        write_idx(root / lbl, rng.integers(0, 10, (n,)))
    return root


def reference_batches(root: Path, batch_size: int, seed: int, epoch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The minibatches a run with the same settings trains on in ``epoch``, as (input, labels)."""
    train, _ = fm.datasets(root, None, None, seed)
    return [train.batch(rows) for rows in fm.minibatch_indices(len(train), batch_size, seed, epoch)]


def build(factory, seed: int = 0) -> nn.Sequential:  # type: ignore[no-untyped-def]
    """The model the workers start from (they seed with ``cfg.seed`` before calling the factory)."""
    torch.manual_seed(seed)
    return factory()


def stage_params(model: nn.Sequential, layers: range) -> dict[str, torch.Tensor]:
    """Parameters of layers ``layers`` of ``model`` under the whole model's names (as stages name them)."""
    return {f"{i}.{n}": p for i in layers for n, p in model[i].named_parameters()}


class _Split(nn.Module):
    """Image -> (features (B, 16) float, ids (B,) int64): a tuple with an integer passenger."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(3 * 32 * 32, 16)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat = x.flatten(1)
        return torch.tanh(self.proj(flat)), (flat[:, :8].sum(1) > 0).long()


class _Mix(nn.Module):
    """(h, ids) -> (tanh(W h + E[ids]), ids)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.emb = nn.Embedding(2, 16)

    def forward(self, inp: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        h, ids = inp
        return torch.tanh(self.lin(h) + self.emb(ids)), ids


class _Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 10)

    def forward(self, inp: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return self.lin(inp[0])


def tuple_model() -> nn.Sequential:
    """4 layers whose boundaries carry ``(float features, int64 ids)`` tuples (like GNMT's layers)."""
    return nn.Sequential(_Split(), _Mix(), _Mix(), _Head())


class SkipNet(nn.Module):
    """(B, 3, 32, 32) -> 10 logits, a DAG: ``c = tanh(fc3(tanh(fc2(a)))) + a`` skips over fc2 and fc3."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, stride=4)
        self.fc1 = nn.Linear(256, 16)
        self.fc2 = nn.Linear(16, 16)
        self.fc3 = nn.Linear(16, 16)
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.tanh(self.fc1(torch.relu(self.conv(x)).flatten(1)))
        c = torch.tanh(self.fc3(torch.tanh(self.fc2(a)))) + a
        return self.head(c)


def op_plan(model: nn.Module, stages: list[list[str]], replicas: list[int] | None = None) -> Plan:
    """A plan over ``model``'s op-granularity graph from fx node names per stage (tests' hand-made cuts)."""
    from pipedream.runtime.split import node_ids, trace

    ids = {n.name: i for n, i in node_ids(trace(model, "op")).items()}
    plan = straight_plan("t", sum(map(len, stages)), [len(s) for s in stages], replicas)
    for stage, names in zip(plan.stages, stages, strict=True):
        stage.nodes = [ids[n] for n in names]
    plan.extra["granularity"] = "op"
    return plan


def tied_model() -> nn.Sequential:
    """Like :func:`stash_model` with one more linear layer whose weight is layer 3's (tied): flatten, linear,
    tanh, linear (3), tanh, linear (5, weight of 3), tanh, linear -> 10 logits. A [4, 4] split puts the
    two users of the tied weight in different stages."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                          nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 10))
    model[5].weight = model[3].weight
    return model
