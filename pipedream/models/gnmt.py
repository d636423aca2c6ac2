"""GNMT-8 and GNMT-16 (Wu et al. 2016) as flat sequences of LSTM layers (paper §5.1: WMT16 En-De, BLEU).

The architecture of the paper's GNMT (the MLPerf ``rnn_translator`` it was taken from): an encoder
whose first LSTM layer is bidirectional, a decoder whose first LSTM layer feeds a normalised
Bahdanau attention over the encoder output, the attention context concatenated to the input of every
later decoder layer, residual connections from the third layer of each stack on, dropout 0.2 on LSTM
inputs, and a linear classifier. GNMT-8 has 4 + 4 LSTM layers, GNMT-16 8 + 8. Embeddings, linear
layers and LSTMs are created and initialised by fairseq's ``fairseq.models.lstm`` helpers.

The sequence (``E`` encoder and ``D`` decoder LSTM layers; every layer takes and returns one value):

====================  =====================================  ======================================
layer                 input                                  output
====================  =====================================  ======================================
SourceEmbedding       ``x (B, 2, L)`` int64 (packed input)   ``(emb (B,L,E) f32, src (B,L), prev (B,L))``
BidirectionalEncoder  ``(emb, src, prev)``                   ``(h (B,L,2H), src, prev)``
EncoderLayer x (E-1)  ``(h, src, prev)``                     ``(h (B,L,H), src, prev)``
AttentionDecoder      ``(h, src, prev)``                     ``(y (B,T,H), ctx (B,T,H))``
DecoderLayer x (D-1)  ``(y, ctx)``                           ``(y, ctx)``
Classifier            ``(y, ctx)``                           ``logits (B, T, V)``
====================  =====================================  ======================================

``full``: 32320-symbol vocabulary, width 1024: GNMT-8 193.8 M parameters (the released profile:
193.77 M), GNMT-16 277.7 M. ``reduced``: 6400-word vocabularies, width 128: 3.9 M and 5.3 M.

``x[:, 0]`` holds source ids, ``x[:, 1]`` the decoder input (eos then the target), right-padded with
fairseq's pad id 1 (:mod:`pipedream.data.translation`). Integer ``src``/``prev`` ride along the tuple so
that any layer boundary can be a stage boundary; they need no gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from pipedream.data.base import SampleSet
from pipedream.data.synthetic import Noise, SyntheticSpec
from pipedream.models import ModelSpec, register

PAD = 1  # fairseq Dictionary: bos 0, pad 1, eos 2, unk 3
EOS = 2
NSPECIAL = 4


@dataclass(frozen=True)
class GnmtConfig:
    """Sizes of one GNMT variant: vocabulary (both sides), widths, LSTM layers per stack, dropout."""

    vocab: int
    embed: int
    hidden: int
    encoder_layers: int
    decoder_layers: int
    dropout: float = 0.2


FULL_VOCAB = 32320  # the MLPerf/GNMT shared BPE vocabulary
REDUCED_VOCAB = 6400  # the word-level Ding vocabularies (words seen twice: about 5.8k En, 6.2k De) fit
CONFIGS = {
    ("gnmt8", "full"): GnmtConfig(FULL_VOCAB, 1024, 1024, 4, 4),
    ("gnmt16", "full"): GnmtConfig(FULL_VOCAB, 1024, 1024, 8, 8),
    ("gnmt8", "reduced"): GnmtConfig(REDUCED_VOCAB, 128, 128, 4, 4),
    ("gnmt16", "reduced"): GnmtConfig(REDUCED_VOCAB, 128, 128, 8, 8),
}
EXAMPLE_LENGTH = {"full": 24, "reduced": 17}  # tokens per sentence in profiling input (release profile: 24)


def _fairseq_lstm():  # lazy: importing fairseq takes seconds, and only these models need it
    from fairseq.models import lstm

    return lstm


def _run_lstm(lstm: nn.LSTM, x: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
    """Run ``lstm`` over ``x (B, L, in)``; with ``lengths`` padded steps are skipped (packed)."""
    if lengths is None:
        return lstm(x)[0]
    packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
    return pad_packed_sequence(lstm(packed)[0], batch_first=True, total_length=x.shape[1])[0]


def _lengths(src: torch.Tensor) -> torch.Tensor:
    return (src != PAD).sum(1).clamp(min=1)


class SourceEmbedding(nn.Module):
    """Unpack ``x (B, 2, L)`` and embed the source: ``(emb (B, L, E), src (B, L), prev (B, L))``."""

    def __init__(self, cfg: GnmtConfig) -> None:
        super().__init__()
        self.embed = _fairseq_lstm().Embedding(cfg.vocab, cfg.embed, PAD)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        src, prev = x[:, 0], x[:, 1]
        return self.embed(src), src, prev


class BidirectionalEncoder(nn.Module):
    """Encoder layer 1: a bidirectional LSTM over the source, ``(B, L, E) -> (B, L, 2H)``."""

    def __init__(self, cfg: GnmtConfig) -> None:
        super().__init__()
        self.dropout = nn.Dropout(cfg.dropout)
        self.lstm = _fairseq_lstm().LSTM(cfg.embed, cfg.hidden, batch_first=True, bidirectional=True)

    def forward(self, inp: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        emb, src, prev = inp
        return _run_lstm(self.lstm, self.dropout(emb), _lengths(src)), src, prev


class EncoderLayer(nn.Module):
    """A unidirectional encoder LSTM layer, ``(B, L, in) -> (B, L, H)``, residual if ``residual``."""

    def __init__(self, in_dim: int, cfg: GnmtConfig, residual: bool) -> None:
        super().__init__()
        self.residual = residual
        self.dropout = nn.Dropout(cfg.dropout)
        self.lstm = _fairseq_lstm().LSTM(in_dim, cfg.hidden, batch_first=True)

    def forward(self, inp: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        h, src, prev = inp
        out = _run_lstm(self.lstm, self.dropout(h), _lengths(src))
        return (out + h if self.residual else out), src, prev


class BahdanauAttention(nn.Module):
    """Normalised Bahdanau attention: ``score(q, k) = g * v/|v| . tanh(W_q q + W_k k + b)``."""

    def __init__(self, query_dim: int, key_dim: int, units: int) -> None:
        super().__init__()
        lstm = _fairseq_lstm()
        self.linear_q = lstm.Linear(query_dim, units, bias=False)
        self.linear_k = lstm.Linear(key_dim, units, bias=False)
        self.v = nn.Parameter(torch.empty(units).uniform_(-0.1, 0.1))
        self.g = nn.Parameter(torch.tensor(units ** -0.5))
        self.b = nn.Parameter(torch.zeros(units))

    def forward(self, q: torch.Tensor, keys: torch.Tensor, pad_mask: torch.Tensor) -> torch.Tensor:
        """Context ``(B, T, Dk)`` for queries ``q (B, T, Dq)`` over ``keys (B, S, Dk)``; ``pad_mask (B, S)``."""
        v = self.g * self.v / self.v.norm()
        e = torch.tanh(self.linear_q(q).unsqueeze(2) + self.linear_k(keys).unsqueeze(1) + self.b)  # (B, T, S, U)
        scores = (e @ v).masked_fill(pad_mask.unsqueeze(1), float("-inf"))  # (B, T, S)
        return torch.softmax(scores, dim=-1) @ keys


class AttentionDecoder(nn.Module):
    """Decoder layer 1: embed ``prev``, LSTM, attention over the encoder output -> ``(y, ctx)``."""

    def __init__(self, cfg: GnmtConfig) -> None:
        super().__init__()
        lstm = _fairseq_lstm()
        self.embed = lstm.Embedding(cfg.vocab, cfg.embed, PAD)
        self.dropout = nn.Dropout(cfg.dropout)
        self.lstm = lstm.LSTM(cfg.embed, cfg.hidden, batch_first=True)
        self.attention = BahdanauAttention(cfg.hidden, cfg.hidden, cfg.hidden)

    def forward(self, inp: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        h, src, prev = inp
        y = self.lstm(self.dropout(self.embed(prev)))[0]
        return y, self.attention(y, h, src == PAD)


class DecoderLayer(nn.Module):
    """A decoder LSTM layer over ``[y; ctx]``, ``(B, T, 2H) -> (B, T, H)``, residual if ``residual``."""

    def __init__(self, cfg: GnmtConfig, residual: bool) -> None:
        super().__init__()
        self.residual = residual
        self.dropout = nn.Dropout(cfg.dropout)
        self.lstm = _fairseq_lstm().LSTM(2 * cfg.hidden, cfg.hidden, batch_first=True)

    def forward(self, inp: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        y, ctx = inp
        out = self.lstm(torch.cat([self.dropout(y), ctx], dim=-1))[0]
        return (out + y if self.residual else out), ctx


class Classifier(nn.Module):
    """Output projection ``(B, T, H) -> logits (B, T, V)``."""

    def __init__(self, cfg: GnmtConfig) -> None:
        super().__init__()
        self.dropout = nn.Dropout(cfg.dropout)
        self.proj = _fairseq_lstm().Linear(cfg.hidden, cfg.vocab)

    def forward(self, inp: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return self.proj(self.dropout(inp[0]))


def build_gnmt(cfg: GnmtConfig) -> nn.Sequential:
    """The GNMT sequence of ``cfg``: 1 + E + D + 1 layers (embedding, LSTM layers, classifier)."""
    layers: list[nn.Module] = [SourceEmbedding(cfg), BidirectionalEncoder(cfg),
                               EncoderLayer(2 * cfg.hidden, cfg, residual=False)]
    layers += [EncoderLayer(cfg.hidden, cfg, residual=True) for _ in range(cfg.encoder_layers - 2)]
    layers += [AttentionDecoder(cfg), DecoderLayer(cfg, residual=False)]
    layers += [DecoderLayer(cfg, residual=True) for _ in range(cfg.decoder_layers - 2)]
    layers.append(Classifier(cfg))
    return nn.Sequential(*layers)


def translation_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy (nats) of logits ``(B, T, V)`` against ``target (B, T)``, pads ignored."""
    return F.cross_entropy(output.flatten(0, 1), target.flatten(), ignore_index=PAD)


@torch.no_grad()
def greedy_translate(model: nn.Sequential, src: torch.Tensor, max_len: int) -> list[list[int]]:
    """Greedy decoding: target ids (without eos) for each source row of ``src (B, S)``.

    The encoder layers run once; the decoder layers rerun on the growing prefix (no state cache).
    """
    k = next(i for i, m in enumerate(model) if isinstance(m, AttentionDecoder))
    prev = torch.full_like(src, PAD)
    prev[:, 0] = EOS
    h, src_, _ = model[:k](torch.stack([src, prev], dim=1))
    out = torch.full((src.shape[0], 1), EOS, dtype=torch.long)
    done = torch.zeros(src.shape[0], dtype=torch.bool)
    for _ in range(max_len):
        nxt = model[k:]((h, src_, out))[:, -1].argmax(-1)
        nxt = nxt.masked_fill(done, PAD)
        out = torch.cat([out, nxt.unsqueeze(1)], dim=1)
        done |= nxt == EOS
        if bool(done.all()):
            break
    return [[t for t in row.tolist()[1:] if t != PAD] for row in out]


def bleu(model: nn.Module, val: SampleSet, batch_size: int = 256) -> float:
    """Corpus BLEU (sacrebleu, 0-100) of greedy translations of ``val`` by ``model`` (eval mode)."""
    from pipedream.data.translation import MAX_TOKENS, corpus_bleu

    assert isinstance(model, nn.Sequential)
    was = model.training
    model.eval()
    tgt_dict = val.info["tgt_dict"]
    hyps, refs = [], []
    for start in range(0, len(val), batch_size):
        rows = range(start, min(start + batch_size, len(val)))
        x, y = val.batch(rows)
        for ids, tgt in zip(greedy_translate(model, x[:, 0], 2 * MAX_TOKENS), y, strict=True):
            ids = ids[:ids.index(EOS)] if EOS in ids else ids
            hyps.append(" ".join(tgt_dict[i] for i in ids))
            refs.append(tgt_dict.string(tgt[(tgt != PAD) & (tgt != EOS)]))
    if "references" in val.info:
        refs = val.info["references"]
    model.train(was)
    return corpus_bleu(hyps, refs)


def _datasets(name: str):
    def make(preset: str, train_subset: int | None, val_subset: int | None, seed: int) -> tuple[SampleSet, SampleSet]:
        from pipedream.data import translation

        vocab = CONFIGS[(name, preset)].vocab
        if preset == "full":
            return translation.wmt16_datasets(None, vocab, train_subset, val_subset, seed)
        return translation.ding_datasets(vocab, train_subset, val_subset, seed)

    return make


SYNTHETIC_SIZES = {"full": (4_500_000, 3_003),  # about WMT16 En-De's 4.5 M training pairs; newstest2014
                   "reduced": (20_000, 1_000)}  # round numbers of the order of the Ding pairs


def _synthetic(name: str):
    """``synthetic`` hook: sentence pairs of ``EXAMPLE_LENGTH`` random ids (no padding), packed like
    :mod:`pipedream.data.translation`: ``x (2, L)`` source and decoder input (eos, then the target
    shifted), target ``(L,)`` ending in eos."""

    def make(preset: str) -> SyntheticSpec:
        vocab, length = CONFIGS[(name, preset)].vocab, EXAMPLE_LENGTH[preset]

        def sample(g: torch.Generator, noise: Noise) -> tuple[torch.Tensor, torch.Tensor]:
            src = torch.randint(NSPECIAL, vocab, (length,), generator=g)
            tgt = torch.randint(NSPECIAL, vocab, (length,), generator=g)
            tgt[-1] = EOS
            prev = torch.cat([torch.tensor([EOS]), tgt[:-1]])
            return torch.stack([src, prev]), tgt

        return SyntheticSpec(sample, *SYNTHETIC_SIZES[preset], {"vocab": vocab, "length": length})

    return make


def _example(name: str):
    def example(preset: str, batch_size: int, seed: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        x = torch.randint(NSPECIAL, CONFIGS[(name, preset)].vocab, (batch_size, 2, EXAMPLE_LENGTH[preset]), generator=g)
        x[:, 1, 0] = EOS
        return x

    return example


for _name in ("gnmt8", "gnmt16"):
    register(ModelSpec(_name, "translation", lambda preset, n=_name: build_gnmt(CONFIGS[(n, preset)]),
                       lambda preset: (2, EXAMPLE_LENGTH[preset]), "ding_de_en", criterion=translation_loss,
                       ignore_index=PAD, metric="bleu", make_datasets=_datasets(_name), evaluate=bleu,
                       example=_example(_name), synthetic=_synthetic(_name)))
