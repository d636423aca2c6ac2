"""A user's Hugging Face GPT-2 (tiny config, random weights, nothing downloaded) and its data, as a user
writes them for ``--model tests.hf_gpt2:make`` (not a test module)."""

from __future__ import annotations

import torch

from pipedream.models import ModelSpec

VOCAB, LENGTH = 64, 16


def gpt2(dropout: float = 0.1) -> torch.nn.Module:
    """GPT-2 with 2 blocks of width 16; its input and output embeddings are tied (GPT-2's default)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=16, n_layer=2, n_head=2, bos_token_id=0,
                        eos_token_id=0, resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout)
    return GPT2LMHeadModel(config)


def counting(preset: str, train_subset: int | None, val_subset: int | None, seed: int) -> tuple[list, list]:
    """Sequences that count up (mod the vocabulary) from a random start: input tokens and the next tokens.
    Plain lists of ``(input, target)`` samples; the harness draws the subsets."""
    g = torch.Generator().manual_seed(seed)
    seq = (torch.randint(0, VOCAB, (160, 1), generator=g) + torch.arange(LENGTH + 1)) % VOCAB
    samples = [(s[:-1], s[1:]) for s in seq]
    return samples[:128], samples[128:]


def make() -> ModelSpec:
    return ModelSpec(name="gpt2", task="language_model", build=lambda preset: gpt2(), make_datasets=counting)


def make_without_dropout() -> ModelSpec:
    """The same model without dropout: a pipeline and one process draw no random numbers, so they compare exactly."""
    return ModelSpec(name="gpt2", task="language_model", build=lambda preset: gpt2(0.0), make_datasets=counting)
