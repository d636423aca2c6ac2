"""Captioned moving Fashion-MNIST clips: the generated stand-in for MSVD (paper §5.1, S2VT).

No real captioned video installs offline, so clips are made from real Fashion-MNIST images: one
28x28 article slides across a ``CANVAS`` x ``CANVAS`` black canvas for ``FRAMES`` frames in a straight
line (left, right, up or down) at 1 (slowly) or 2 (quickly) pixels a frame, starting where it never
leaves the canvas, so it never bounces. The caption says what moves, how fast and where:
``"a sandal moves quickly left"``, ``"an ankle boot moves slowly up"``. Clip ``i`` of a split is a pure
function of ``(split, i)``: the article image (train clips use Fashion-MNIST train images, validation
clips the t10k images), the direction, speed and start position all come from a generator seeded by
the clip index, so every run and every rank sees the same clips.

A sample is ``(frames (FRAMES, CANVAS, CANVAS) uint8, caption ids + eos (L,) int64)``; a batch is the
packed S2VT input ``x (B, FRAMES*CANVAS*CANVAS + L)`` float32 — normalised pixels, then the decoder
input ids (eos then the caption, right-padded to ``L`` = :data:`MAX_WORDS`) as exact floats — and ``target (B, L)`` int64
(:mod:`pipedream.models.s2vt`).
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from pipedream.data.base import Rows, Sample, SampleSet, subset_indices

FRAMES = 8
CANVAS = 44  # 28 + (FRAMES - 1) * 2 pixels of the fastest motion, plus 2 of slack
SPEEDS = {"slowly": 1, "quickly": 2}  # pixels per frame
DIRECTIONS = {"left": (0, -1), "right": (0, 1), "up": (-1, 0), "down": (1, 0)}  # (row, column) steps
ARTICLES = ("t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "ankle boot")
SPECIALS = ("<pad>", "<eos>", "<unk>")
PAD, EOS, UNK = 0, 1, 2
VOCAB = [*SPECIALS, "a", "an", "moves", *SPEEDS, *DIRECTIONS,
         *sorted({w for a in ARTICLES for w in a.split()})]
CLIPS = {"train": 60_000, "val": 10_000}  # one clip per Fashion-MNIST image by default
_SPLIT_SEED = {"train": 1_000_003, "val": 2_000_003}
MEAN, STD = 0.1, 0.25  # of the mostly black canvas, in [0, 1] units


def caption(article: str, speed: str, direction: str) -> str:
    """The caption of one clip, e.g. ``"an ankle boot moves slowly up"``."""
    return f"{'an' if article[0] in 'aeiou' else 'a'} {article} moves {speed} {direction}"


MAX_WORDS = 1 + max(len(caption(a, s, d).split()) for a in ARTICLES for s in SPEEDS for d in DIRECTIONS)  # with eos


def encode(text: str) -> torch.Tensor:
    """Caption word ids followed by eos, int64 ``(words + 1,)``; unknown words map to ``<unk>``."""
    index = {w: i for i, w in enumerate(VOCAB)}
    return torch.tensor([index.get(w, UNK) for w in text.split()] + [EOS], dtype=torch.long)


def decode(ids: list[int]) -> str:
    """Words of ``ids`` up to the first eos (pads dropped)."""
    ids = ids[:ids.index(EOS)] if EOS in ids else ids
    return " ".join(VOCAB[i] for i in ids if i != PAD)


def motion(clip_seed: int) -> tuple[str, str, int, int]:
    """Speed word, direction word and top-left start ``(row, column)`` of the clip seeded ``clip_seed``."""
    g = torch.Generator().manual_seed(clip_seed)
    speed = list(SPEEDS)[int(torch.randint(len(SPEEDS), (1,), generator=g))]
    direction = list(DIRECTIONS)[int(torch.randint(len(DIRECTIONS), (1,), generator=g))]
    travel = (FRAMES - 1) * SPEEDS[speed]
    room = CANVAS - 28
    start = []
    for d in DIRECTIONS[direction]:  # along the motion, start far enough from the edge it moves towards
        lo, hi = (travel, room) if d < 0 else (0, room - travel if d > 0 else room)
        start.append(int(torch.randint(lo, hi + 1, (1,), generator=g)))
    return speed, direction, start[0], start[1]


def make_clip(image: torch.Tensor, label: int, clip_seed: int) -> tuple[torch.Tensor, str]:
    """Frames ``(FRAMES, CANVAS, CANVAS)`` uint8 of ``image (28, 28)`` moving, and the clip's caption."""
    speed, direction, r0, c0 = motion(clip_seed)
    dr, dc = (d * SPEEDS[speed] for d in DIRECTIONS[direction])
    frames = torch.zeros(FRAMES, CANVAS, CANVAS, dtype=torch.uint8)
    for f in range(FRAMES):
        r, c = r0 + f * dr, c0 + f * dc
        frames[f, r:r + 28, c:c + 28] = image
    return frames, caption(ARTICLES[label], speed, direction)


def _clip(images: torch.Tensor, labels: torch.Tensor, split: str, clip: int) -> Sample:
    k = clip % len(labels)
    frames, text = make_clip(images[k], int(labels[k]), _SPLIT_SEED[split] + clip)
    return frames, encode(text)


def collate(samples: list[Sample]) -> tuple[torch.Tensor, torch.Tensor]:
    """Pack clips into ``x (B, FRAMES*CANVAS*CANVAS + L)`` float32 and ``target (B, L)`` int64.

    ``L`` = :data:`MAX_WORDS` (the longest caption and eos) for every minibatch, so shapes are fixed.
    """
    length = MAX_WORDS
    target = torch.full((len(samples), length), PAD, dtype=torch.long)
    prev = torch.full((len(samples), length), PAD, dtype=torch.long)
    for row, (_, ids) in enumerate(samples):
        target[row, :len(ids)] = ids
        prev[row, 0] = EOS
        prev[row, 1:len(ids)] = ids[:-1]
    pixels = torch.stack([s[0] for s in samples]).flatten(1).float().div_(255.0).sub_(MEAN).div_(STD)
    return torch.cat([pixels, prev.float()], dim=1), target


def clip_datasets(train_subset: int | None, val_subset: int | None, seed: int,
                  root: Path | None = None) -> tuple[SampleSet, SampleSet]:
    """Train clips from Fashion-MNIST train images, validation clips from the t10k images.

    Raises:
        PipeDreamError: Fashion-MNIST is not installed (from its loader, naming the Debian package).
    """
    from pipedream.data import fashion_mnist

    splits = fashion_mnist.load(root)
    out = []
    for split, data, size, s in (("train", splits[0], train_subset, seed), ("val", splits[1], val_subset, seed + 1)):
        rows = subset_indices(CLIPS[split], size, s)
        references = None
        if split == "val":
            references = [caption(ARTICLES[int(data.labels[r % len(data)])], *motion(_SPLIT_SEED[split] + r)[:2])
                          for r in rows]
        info = {"source": "generated from Fashion-MNIST", "vocab": VOCAB, "references": references}
        out.append(SampleSet(Rows(functools.partial(_clip, data.images, data.labels, split), rows), collate, info))
    return out[0], out[1]
