"""S2VT, sequence to sequence video to text (Venugopalan et al. 2015; paper §5.1: MSVD, METEOR).

Two stacked LSTMs run over ``F + L`` steps: during the first ``F`` (encoding) steps the first LSTM
reads one frame feature per step while the second reads the first's output next to a padding word;
during the last ``L`` (decoding) steps the first LSTM reads padding and the second reads the previous
caption word and predicts the next. The sequence, each layer taking and returning one value:

================  ==========================================  =====================================
layer             input                                       output
================  ==========================================  =====================================
FrameEncoder      ``x (B, F*P + L)`` float32 (packed)         ``(feats (B, F, D), prev (B, L) int64)``
VisualLSTM        ``(feats, prev)``                           ``(h1 (B, F+L, H), prev)``
WordEmbedding     ``(h1, prev)``                              ``(h1, words (B, F+L, E))``
LanguageLSTM      ``(h1, words)``                             ``h2 (B, L, H)`` (decoding steps)
Classifier        ``h2``                                      ``logits (B, L, V)``
================  ==========================================  =====================================

``reduced``: frames are raw 44x44 Fashion-MNIST clips (:mod:`pipedream.data.moving_fmnist`), ``P`` =
44*44 pixels; ``FrameEncoder`` is a small CNN applied to every frame (two conv blocks and a linear
projection to ``D`` = 128), H = 128, 23-word vocabulary, 0.53 M parameters.
``full``: the S2VT paper's sizes: 80 frames of 4096-d VGG-16 fc7 features (``P`` = 4096) projected
linearly to ``D`` = 500, LSTMs of 1000 units, a 13k-word vocabulary, 37.6 M parameters. There is no
MSVD loader (the data cannot be installed offline): the full preset trains on synthetic clips only
(``--data synthetic``, for epoch times), and ``pipedream check`` refuses it with real data.
The metric is BLEU-4 (sacrebleu): the paper's METEOR needs a Java runtime that the reproduction does
not assume.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pipedream.data.base import SampleSet
from pipedream.data.synthetic import Noise, SyntheticSpec
from pipedream.errors import PipeDreamError
from pipedream.models import ModelSpec, register


@dataclass(frozen=True)
class S2vtConfig:
    """Sizes of one S2VT: frames, per-frame input, feature/word/hidden widths, vocabulary, dropout."""

    frames: int
    frame_shape: tuple[int, ...]  # (H, W) raw pixels for the CNN encoder, (D_in,) for precomputed features
    feature: int
    embed: int
    hidden: int
    vocab: int
    max_words: int  # caption length including eos
    dropout: float


CONFIGS = {
    "full": S2vtConfig(80, (4096,), 500, 500, 1000, 13_000, 20, 0.5),
    "reduced": S2vtConfig(8, (44, 44), 128, 32, 128, 23, 7, 0.1),
}
PAD, EOS = 0, 1  # as in pipedream.data.moving_fmnist


class FrameEncoder(nn.Module):
    """Unpack ``x`` and encode each frame: ``(B, F*P + L) -> (feats (B, F, D), prev (B, L))``."""

    def __init__(self, cfg: S2vtConfig) -> None:
        super().__init__()
        self.cfg = cfg
        if len(cfg.frame_shape) == 1:  # precomputed features (the S2VT paper's VGG fc7)
            self.net: nn.Module = nn.Sequential(nn.Dropout(cfg.dropout), nn.Linear(cfg.frame_shape[0], cfg.feature))
        else:
            h, w = cfg.frame_shape
            self.net = nn.Sequential(
                nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                nn.Flatten(1), nn.Linear(16 * (h // 4) * (w // 4), cfg.feature), nn.ReLU(),
            )
        self.pixels = cfg.frames * math.prod(cfg.frame_shape)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b = x.shape[0]
        frames = x[:, :self.pixels].reshape(b * self.cfg.frames, *((1, *self.cfg.frame_shape)
                                                                    if len(self.cfg.frame_shape) == 2 else self.cfg.frame_shape))
        feats = self.net(frames).reshape(b, self.cfg.frames, -1)
        return feats, x[:, self.pixels:].long()


class VisualLSTM(nn.Module):
    """First LSTM over the frame features followed by ``L`` padding steps: ``(B, F+L, H)``."""

    def __init__(self, cfg: S2vtConfig) -> None:
        super().__init__()
        self.dropout = nn.Dropout(cfg.dropout)
        self.lstm = nn.LSTM(cfg.feature, cfg.hidden, batch_first=True)

    def forward(self, inp: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        feats, prev = inp
        padding = feats.new_zeros(feats.shape[0], prev.shape[1], feats.shape[2])
        return self.lstm(self.dropout(torch.cat([feats, padding], dim=1)))[0], prev


class WordEmbedding(nn.Module):
    """Embed the decoder input words, with zero "padding words" for the ``F`` encoding steps."""

    def __init__(self, cfg: S2vtConfig) -> None:
        super().__init__()
        self.frames = cfg.frames
        self.embed = nn.Embedding(cfg.vocab, cfg.embed, padding_idx=PAD)

    def forward(self, inp: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        h1, prev = inp
        words = self.embed(prev)
        return h1, torch.cat([words.new_zeros(words.shape[0], self.frames, words.shape[2]), words], dim=1)


class LanguageLSTM(nn.Module):
    """Second LSTM over ``[h1; words]`` for all ``F + L`` steps; returns the ``L`` decoding steps."""

    def __init__(self, cfg: S2vtConfig) -> None:
        super().__init__()
        self.frames = cfg.frames
        self.dropout = nn.Dropout(cfg.dropout)
        self.lstm = nn.LSTM(cfg.hidden + cfg.embed, cfg.hidden, batch_first=True)

    def forward(self, inp: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        h1, words = inp
        return self.lstm(self.dropout(torch.cat([h1, words], dim=-1)))[0][:, self.frames:]


class Classifier(nn.Module):
    """``(B, L, H) -> logits (B, L, V)``."""

    def __init__(self, cfg: S2vtConfig) -> None:
        super().__init__()
        self.dropout = nn.Dropout(cfg.dropout)
        self.proj = nn.Linear(cfg.hidden, cfg.vocab)

    def forward(self, h2: torch.Tensor) -> torch.Tensor:
        return self.proj(self.dropout(h2))


def build_s2vt(cfg: S2vtConfig) -> nn.Sequential:
    """The five-layer S2VT sequence of ``cfg``."""
    return nn.Sequential(FrameEncoder(cfg), VisualLSTM(cfg), WordEmbedding(cfg), LanguageLSTM(cfg), Classifier(cfg))


def caption_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean word cross-entropy (nats) of logits ``(B, L, V)`` against ``target (B, L)``, pads ignored."""
    return F.cross_entropy(output.flatten(0, 1), target.flatten(), ignore_index=PAD)


@torch.no_grad()
def greedy_captions(model: nn.Sequential, x: torch.Tensor, pixels: int, max_words: int) -> list[list[int]]:
    """Greedy caption ids (up to eos) for the clips of a packed batch ``x`` (its caption part ignored)."""
    frames = x[:, :pixels]
    prev = torch.full((x.shape[0], 1), EOS, dtype=torch.long)
    for _ in range(max_words):
        nxt = model(torch.cat([frames, prev.float()], dim=1))[:, -1].argmax(-1)
        prev = torch.cat([prev, nxt.unsqueeze(1)], dim=1)
        if bool((prev[:, 1:] == EOS).any(1).all()):
            break
    return [row[1:] for row in prev.tolist()]


def bleu4(model: nn.Module, val: SampleSet, batch_size: int = 256) -> float:
    """Corpus BLEU-4 (sacrebleu, 0-100) of greedy captions of ``val``'s clips (eval mode)."""
    from pipedream.data.moving_fmnist import decode
    from pipedream.data.translation import corpus_bleu

    assert isinstance(model, nn.Sequential) and isinstance(model[0], FrameEncoder)
    was = model.training
    model.eval()
    hyps: list[str] = []
    for start in range(0, len(val), batch_size):
        x, _ = val.batch(range(start, min(start + batch_size, len(val))))
        hyps += [decode(ids) for ids in greedy_captions(model, x, model[0].pixels, model[0].cfg.max_words)]
    model.train(was)
    return corpus_bleu(hyps, val.info["references"])


def _datasets(preset: str, train_subset: int | None, val_subset: int | None, seed: int) -> tuple[SampleSet, SampleSet]:
    if preset == "full":
        raise PipeDreamError("full-size S2VT has no real data (no MSVD loader); train it with --data synthetic "
                             "(epoch times only) or use the reduced preset (moving Fashion-MNIST clips)")
    from pipedream.data.moving_fmnist import clip_datasets

    return clip_datasets(train_subset, val_subset, seed)


SYNTHETIC_SIZES = {"full": (48_000, 4_000),  # MSVD: 1,200 train and 100 val clips x about 40 captions
                   "reduced": (60_000, 10_000)}  # one moving Fashion-MNIST clip per image


def _synthetic(preset: str) -> SyntheticSpec:
    """``synthetic`` hook: standard-normal frames (``F x P`` values) and a full-length random caption,
    packed like :func:`pipedream.data.moving_fmnist.collate`: input ``(F*P + L,)`` float32 (frames, then
    the decoder input: eos and the caption shifted), target ``(L,)`` ids ending in eos."""
    cfg = CONFIGS[preset]
    pixels = cfg.frames * math.prod(cfg.frame_shape)

    def sample(g: torch.Generator, noise: Noise) -> tuple[torch.Tensor, torch.Tensor]:
        target = torch.randint(EOS + 1, cfg.vocab, (cfg.max_words,), generator=g)
        target[-1] = EOS
        prev = torch.cat([torch.tensor([EOS]), target[:-1]]).float()
        return torch.cat([noise((pixels,), g), prev]), target

    return SyntheticSpec(sample, *SYNTHETIC_SIZES[preset], {"vocab": cfg.vocab, "frames": cfg.frames})


def _example(preset: str, batch_size: int, seed: int) -> torch.Tensor:
    cfg = CONFIGS[preset]
    g = torch.Generator().manual_seed(seed)
    pixels = torch.randn(batch_size, cfg.frames * math.prod(cfg.frame_shape), generator=g)
    words = torch.randint(2, cfg.vocab, (batch_size, cfg.max_words), generator=g).float()
    words[:, 0] = EOS
    return torch.cat([pixels, words], dim=1)


register(ModelSpec("s2vt", "video_captioning", lambda preset: build_s2vt(CONFIGS[preset]),
                   lambda preset: (CONFIGS[preset].frames * math.prod(CONFIGS[preset].frame_shape)
                                   + CONFIGS[preset].max_words,),
                   "moving_fashion_mnist", criterion=caption_loss, ignore_index=PAD, metric="bleu4",
                   make_datasets=_datasets, evaluate=bleu4, example=_example, synthetic=_synthetic))
