"""GPT (decoder-only, causal LM loss) and BERT (encoder, masked-LM loss) as flat sequences of layers
(PipeDream-2BW's models: GPT of 1.3, 2.2 and 3.8 billion parameters and BERT).

Layers: :class:`Embedding` (token + learned position embeddings, dropout: ``(B, T) int64 -> (B, T, h)``),
``layers`` identical :class:`Block` s (pre-LayerNorm transformer blocks, GPT-2's arrangement: ``x + attn(ln(x))``,
then ``x + mlp(ln(x))`` with a ``4h`` GELU MLP; causal attention for GPT, bidirectional for BERT), and
:class:`Head` (final LayerNorm and the vocabulary projection, ``(B, T, h) -> (B, T, V)``). The repeated blocks
are what PipeDream-2BW's planner cuts (:mod:`pipedream.planner.twobw`); the embedding goes with the first
stage, the head with the last. The head is not tied to the embedding, so that no parameter is shared
between the first and the last stage (Megatron-LM's pipelines keep two copies and sum their gradients;
we keep them apart).

Parameters: a block has ``12 h^2 + 13 h`` (QKV ``3h^2 + 3h``, output projection ``h^2 + h``, MLP
``8h^2 + 5h``, two LayerNorms ``4h``); the embedding ``(V + s) h``; the head ``h V + 2h``. The paper's totals
count the vocabulary matrix once (tied): ``h V`` fewer.

Presets. ``reduced``: a tiny model (8 blocks of width 128, 4 heads) that trains on CPU in seconds on Penn
Treebank tokens (:mod:`pipedream.data.language_model`; its 2,000 most frequent words, :data:`PTB_VOCAB`; windows
of 32 tokens). ``full``: the paper's configurations, for planning, paper-scale prediction and synthetic-data runs
(never built at full size in tests: use the ``meta`` device). Only the totals (1.3, 2.2, 3.8-3.9 billion) come
from the paper (taken from a transcription of its text); the layer counts and widths below are ours, chosen so
that ``12 L h^2`` plus the embeddings matches those totals with a sequence of 512 and GPT-2's vocabulary of 50,257:
``gpt`` 24 x 2048 (1.31 B tied, GPT-3 XL's shape), ``gpt_2.2b`` 32 x 2304 (2.16 B), ``gpt_3.8b`` 48 x 2560
(3.91 B). BERT's ``full`` is BERT-Large's shape (24 x 1024, 16 heads, sequence 512, vocabulary 30,522).

BERT's masked-LM data: 15% of a window's positions, drawn per sample from ``(seed, split, index)``, are
replaced by a ``[MASK]`` id (the vocabulary's last id) and are the only targets; the rest are
:data:`IGNORE` (BERT's 80/10/10 replacement and next-sentence prediction are left out).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pipedream.data.base import Sample, SampleSet, stack_samples
from pipedream.data.synthetic import SyntheticSpec, sequence_spec
from pipedream.models import ModelSpec, register
from pipedream.models.awd_lm import perplexity  # the same metric, -100 targets skipped

IGNORE = -100  # target id of a position the masked-LM loss skips (F.cross_entropy's default ignore_index)
# The reduced models' Penn Treebank vocabulary, <unk> and <eos> included (the rest become <unk>): 2,000 rather than
# 10,000 keeps the head (2 h V FLOPs a token) near one block (24 h^2) at width 128, so the last stage is not 5x the rest
PTB_VOCAB = 2_000
GPT2_VOCAB = 50_257  # GPT-2's byte-pair vocabulary
BERT_VOCAB = 30_522  # BERT's WordPiece vocabulary
MASK_FRACTION = 0.15  # BERT's share of masked positions


@dataclass(frozen=True)
class TransformerConfig:
    """Sizes of one transformer language model.

    Attributes:
        vocab: vocabulary size ``V`` (BERT: the ``[MASK]`` id included).
        seq: tokens per sample ``s``.
        hidden: width ``h``.
        heads: attention heads (``hidden`` a multiple of it).
        layers: transformer blocks ``L``.
        causal: causal attention and next-token targets (GPT) or bidirectional and masked targets (BERT).
        dropout: dropout probability after the embeddings, on attention weights and after each residual branch.
    """

    vocab: int
    seq: int
    hidden: int
    heads: int
    layers: int
    causal: bool
    dropout: float = 0.1

    def block_parameters(self) -> int:
        """Parameters of one block: ``12 h^2 + 13 h``."""
        return 12 * self.hidden**2 + 13 * self.hidden

    def parameters(self) -> int:
        """Parameters of the model as built (untied head): ``L (12 h^2 + 13 h) + (V + s) h + h V + 2 h``."""
        h = self.hidden
        return self.layers * self.block_parameters() + (self.vocab + self.seq) * h + h * self.vocab + 2 * h


_REDUCED_GPT = TransformerConfig(vocab=PTB_VOCAB, seq=32, hidden=128, heads=4, layers=8, causal=True)
GPT_CONFIGS = {  # model name -> {preset: config}
    "gpt": {"reduced": _REDUCED_GPT,
            "full": TransformerConfig(GPT2_VOCAB, 512, 2048, 16, 24, causal=True)},
    "gpt_2.2b": {"reduced": _REDUCED_GPT,
                 "full": TransformerConfig(GPT2_VOCAB, 512, 2304, 24, 32, causal=True)},
    "gpt_3.8b": {"reduced": _REDUCED_GPT,
                 "full": TransformerConfig(GPT2_VOCAB, 512, 2560, 32, 48, causal=True)},
}
BERT_CONFIGS = {
    "reduced": TransformerConfig(vocab=PTB_VOCAB + 1, seq=32, hidden=128, heads=4, layers=8, causal=False),
    "full": TransformerConfig(BERT_VOCAB, 512, 1024, 16, 24, causal=False),
}
NAMES = (*GPT_CONFIGS, "bert")  # the registered names of this module
REDUCED_ALIASES = {"gpt_2.2b": "gpt", "gpt_3.8b": "gpt"}  # models whose reduced preset is another's


def _init(module: nn.Module) -> None:
    """GPT-2's initialisation: N(0, 0.02) weights, zero biases, unit LayerNorms."""
    for m in module.modules():
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)


class Embedding(nn.Module):
    """Token plus learned position embeddings, then dropout: ``(B, T) int64 -> (B, T, h)``."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.positions = nn.Embedding(cfg.seq, cfg.hidden)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        return self.drop(self.tokens(ids) + self.positions(pos))


class Block(nn.Module):
    """One pre-LayerNorm transformer block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``; ``(B, T, h)`` in and out."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        h = cfg.hidden
        if h % cfg.heads:
            raise ValueError(f"hidden {h} is not a multiple of heads {cfg.heads}")
        self.heads, self.causal, self.p = cfg.heads, cfg.causal, cfg.dropout
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.fc, self.out = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, dropout_p=self.p if self.training else 0.0)
        x = x + self.drop(self.proj(a.transpose(1, 2).reshape(b, t, h)))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))


class Head(nn.Module):
    """Final LayerNorm and the vocabulary projection (no bias): ``(B, T, h) -> logits (B, T, V)``."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(cfg.hidden)
        self.proj = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.ln(x))


def build_transformer(cfg: TransformerConfig) -> nn.Sequential:
    """``Embedding``, ``cfg.layers`` ``Block`` s, ``Head``; GPT-2's initialisation."""
    model = nn.Sequential(Embedding(cfg), *(Block(cfg) for _ in range(cfg.layers)), Head(cfg))
    _init(model)
    return model


def lm_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy (nats) of logits ``(B, T, V)`` against ``target (B, T)``; positions whose
    target is :data:`IGNORE` (BERT's unmasked ones) do not count."""
    return F.cross_entropy(output.flatten(0, 1), target.flatten(), ignore_index=IGNORE)


class _Masked(Sequence[Sample]):
    """BERT's view of language-model windows: sample ``i`` is ``(masked ids, targets)`` with
    :data:`MASK_FRACTION` of the positions (at least one) masked, drawn from ``(seed, split, i)``."""

    def __init__(self, windows: Sequence[Sample], mask_id: int, seed: int, split: int) -> None:
        self.windows, self.mask_id, self.seed, self.split = windows, mask_id, seed, split

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int) -> Sample:  # type: ignore[override]
        ids = self.windows[i][0]
        g = torch.Generator().manual_seed((self.seed * 2 + self.split) * 1_000_003 + i)
        k = max(1, round(MASK_FRACTION * len(ids)))
        where = torch.randperm(len(ids), generator=g)[:k]
        inputs, targets = ids.clone(), torch.full_like(ids, IGNORE)
        targets[where] = ids[where]
        inputs[where] = self.mask_id
        return inputs, targets


def _lm_data(cfg: TransformerConfig, train_subset: int | None, val_subset: int | None,
             seed: int) -> tuple[SampleSet, SampleSet]:
    """Penn Treebank windows of ``cfg.seq`` tokens: GPT's next-token pairs, or BERT's masked windows."""
    from pipedream.data.language_model import lm_datasets

    words = cfg.vocab if cfg.causal else cfg.vocab - 1  # BERT's last id is [MASK]
    train, val = lm_datasets(cfg.seq, words, train_subset, val_subset, seed)
    if cfg.causal:
        return train, val
    return tuple(SampleSet(_Masked(s.samples, words, seed, k), stack_samples, {**s.info, "mask_id": words})  # type: ignore[return-value]
                 for k, s in enumerate((train, val)))


PTB_TOKENS = 929_589, 73_760  # Mikolov's PTB train and valid tokens, eos included


def _synthetic(cfg: TransformerConfig) -> SyntheticSpec:
    """Random windows of ``cfg.seq`` ids with next-id targets, as many as PTB has (timing only: BERT's
    loss then counts every position, not 15%)."""
    return sequence_spec(cfg.vocab, cfg.seq, PTB_TOKENS[0] // cfg.seq, PTB_TOKENS[1] // cfg.seq)


def _example(cfg: TransformerConfig, batch_size: int, seed: int) -> torch.Tensor:
    return torch.randint(0, cfg.vocab, (batch_size, cfg.seq), generator=torch.Generator().manual_seed(seed))


def _spec(name: str, configs: dict[str, TransformerConfig]) -> ModelSpec:
    causal = configs["reduced"].causal
    return ModelSpec(name, "language_model", lambda preset: build_transformer(configs[preset]),
                     lambda preset: (configs[preset].seq,), "penn_treebank", criterion=lm_loss, metric="perplexity",
                     ignore_index=None if causal else IGNORE,
                     make_datasets=lambda preset, tr, va, seed: _lm_data(configs[preset], tr, va, seed),
                     evaluate=perplexity, example=lambda preset, batch, seed: _example(configs[preset], batch, seed),
                     synthetic=lambda preset: _synthetic(configs[preset]))


def config_of(name: str, preset: str) -> TransformerConfig:
    """The :class:`TransformerConfig` of registered model ``name`` (``gpt``, ``gpt_2.2b``, ``gpt_3.8b``,
    ``bert``) at ``preset``; raises KeyError for another name."""
    return BERT_CONFIGS[preset] if name == "bert" else GPT_CONFIGS[name][preset]


for _name, _configs in GPT_CONFIGS.items():
    register(_spec(_name, _configs))
register(_spec("bert", BERT_CONFIGS))
