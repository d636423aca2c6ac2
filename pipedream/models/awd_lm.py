"""AWD-LSTM language model (Merity, Keskar & Socher 2018) as a flat sequence (paper §5.1: PTB, perplexity).

The regularisers that make it AWD: DropConnect on the hidden-to-hidden weights of every LSTM
(``WeightDropLSTM``: a fresh dropout mask on ``weight_hh`` per minibatch), variational ("locked")
dropout — one mask per sequence shared over time — on the embedding output, between LSTM layers and
on the last LSTM output, and embedding dropout (whole word rows of the embedding matrix dropped).
Layers: ``EmbeddingDropout``, three ``WeightDropLSTM`` layers, ``Decoder``; each takes and returns one
tensor: ``tokens (B, T) int64 -> (B, T, E) -> (B, T, H) -> ... -> logits (B, T, V)``.

``full``: the AWD-LSTM PTB recipe: embedding 400, hidden 1150, 3 layers, dropouts 0.1 (embedding),
0.65 (input), 0.3 (between layers), 0.4 (output), 0.5 (weight drop), decoder tied to the embedding
(24 M parameters; a pipeline that splits them needs the tied weight kept in one stage or synced).
``reduced``: embedding 128, hidden 256, same 3 layers and dropouts scaled for a small model, decoder
NOT tied so that no parameter is shared between the first and last pipeline stage (3.7 M parameters).
Not modelled: the activation regularisers (AR/TAR), NT-ASGD, and hidden state carried between
minibatches (each ``bptt`` window starts from zero state, :mod:`pipedream.data.language_model`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from pipedream.data.base import SampleSet
from pipedream.data.synthetic import SyntheticSpec, sequence_spec
from pipedream.models import ModelSpec, register


@dataclass(frozen=True)
class AwdConfig:
    """Sizes and dropout probabilities of one AWD-LSTM."""

    vocab: int
    embed: int
    hidden: int
    layers: int
    dropout_embedding: float  # whole word rows of the embedding matrix
    dropout_input: float  # locked dropout on the embedding output
    dropout_hidden: float  # locked dropout between LSTM layers
    dropout_output: float  # locked dropout on the last LSTM output
    weight_drop: float  # DropConnect on hidden-to-hidden weights
    tie_weights: bool
    bptt: int  # tokens per training window


CONFIGS = {
    "full": AwdConfig(10_000, 400, 1150, 3, 0.1, 0.65, 0.3, 0.4, 0.5, True, 70),
    "reduced": AwdConfig(10_000, 128, 256, 3, 0.1, 0.3, 0.2, 0.3, 0.3, False, 35),
}


def locked_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Variational dropout of ``x (B, T, D)``: one mask per sequence and feature, shared over time."""
    if not training or p == 0:
        return x
    mask = x.new_empty(x.shape[0], 1, x.shape[2]).bernoulli_(1 - p) / (1 - p)
    return x * mask


class EmbeddingDropout(nn.Module):
    """Embedding with row dropout, then locked dropout: ``(B, T) int64 -> (B, T, E)``."""

    def __init__(self, cfg: AwdConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.embed)
        nn.init.uniform_(self.embed.weight, -0.1, 0.1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        w = self.embed.weight
        if self.training and self.cfg.dropout_embedding > 0:
            p = self.cfg.dropout_embedding
            w = w * (w.new_empty(w.shape[0], 1).bernoulli_(1 - p) / (1 - p))
        return locked_dropout(F.embedding(tokens, w), self.cfg.dropout_input, self.training)


class WeightDropLSTM(nn.Module):
    """One LSTM layer with DropConnect on ``weight_hh`` and locked dropout on its output.

    ``(B, T, in) -> (B, T, out)``. The raw weight stays the parameter (``lstm.weight_hh_l0``); the
    dropped copy is passed with ``torch.func.functional_call``, so gradients reach the raw weight.
    """

    def __init__(self, in_dim: int, out_dim: int, weight_drop: float, output_dropout: float) -> None:
        super().__init__()
        self.lstm = nn.LSTM(in_dim, out_dim, batch_first=True)
        self.weight_drop, self.output_dropout = weight_drop, output_dropout
        bound = 1 / math.sqrt(out_dim)
        for p in self.lstm.parameters():
            nn.init.uniform_(p, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raw = self.lstm.weight_hh_l0
        dropped = F.dropout(raw, self.weight_drop, self.training)
        out = functional_call(self.lstm, {"weight_hh_l0": dropped}, (x,))[0]
        return locked_dropout(out, self.output_dropout, self.training)


class Decoder(nn.Module):
    """Output projection ``(B, T, E) -> logits (B, T, V)``, optionally tied to the embedding."""

    def __init__(self, cfg: AwdConfig, embedding: nn.Embedding | None) -> None:
        super().__init__()
        self.proj = nn.Linear(cfg.embed, cfg.vocab)
        nn.init.zeros_(self.proj.bias)
        if embedding is not None:
            self.proj.weight = embedding.weight  # weight tying (Inan et al. 2017; Press & Wolf 2017)
        else:
            nn.init.uniform_(self.proj.weight, -0.1, 0.1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.proj(h)


def build_awd_lm(cfg: AwdConfig) -> nn.Sequential:
    """Embedding, ``cfg.layers`` weight-dropped LSTMs (the last one back to the embedding width), decoder."""
    emb = EmbeddingDropout(cfg)
    layers: list[nn.Module] = [emb]
    for i in range(cfg.layers):
        last = i == cfg.layers - 1
        layers.append(WeightDropLSTM(cfg.embed if i == 0 else cfg.hidden, cfg.embed if last else cfg.hidden,
                                     cfg.weight_drop, cfg.dropout_output if last else cfg.dropout_hidden))
    layers.append(Decoder(cfg, emb.embed if cfg.tie_weights else None))
    return nn.Sequential(*layers)


def lm_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy (nats) of logits ``(B, T, V)`` against ``target (B, T)``."""
    return F.cross_entropy(output.flatten(0, 1), target.flatten())


@torch.no_grad()
def perplexity(model: nn.Module, val: SampleSet, batch_size: int = 64) -> float:
    """``exp`` of the mean token cross-entropy of ``model`` (eval mode) over every target token of ``val``; a
    target of -100 (``F.cross_entropy``'s ``ignore_index``: BERT's unmasked positions) does not count."""
    was = model.training
    model.eval()
    total, tokens = 0.0, 0
    for start in range(0, len(val), batch_size):
        x, y = val.batch(range(start, min(start + batch_size, len(val))))
        total += float(F.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="sum"))
        tokens += int((y != -100).sum())
    model.train(was)
    return math.exp(total / max(tokens, 1))


def _datasets(preset: str, train_subset: int | None, val_subset: int | None, seed: int) -> tuple[SampleSet, SampleSet]:
    from pipedream.data.language_model import lm_datasets

    cfg = CONFIGS[preset]
    return lm_datasets(cfg.bptt, cfg.vocab, train_subset, val_subset, seed)


PTB_TOKENS = (929_589, 73_760)  # Mikolov's PTB train and valid, eos included


def _synthetic(preset: str) -> SyntheticSpec:
    """``synthetic`` hook: windows of ``bptt`` random ids and their next ids, as many as PTB has."""
    cfg = CONFIGS[preset]
    return sequence_spec(cfg.vocab, cfg.bptt, PTB_TOKENS[0] // cfg.bptt, PTB_TOKENS[1] // cfg.bptt)


def _example(preset: str, batch_size: int, seed: int) -> torch.Tensor:
    cfg = CONFIGS[preset]
    return torch.randint(0, cfg.vocab, (batch_size, cfg.bptt), generator=torch.Generator().manual_seed(seed))


register(ModelSpec("awd_lm", "language_model", lambda preset: build_awd_lm(CONFIGS[preset]),
                   lambda preset: (CONFIGS[preset].bptt,), "penn_treebank", criterion=lm_loss, metric="perplexity",
                   make_datasets=_datasets, evaluate=perplexity, example=_example, synthetic=_synthetic))
