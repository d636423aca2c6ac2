"""Hugging Face language models of five families with their default configs except sizes (random weights, built
from a Config offline, nothing downloaded) and their token data, as a user brings them (not a test module).

Every config keeps ``use_cache=True``, transformers' default: the capture turns the cache off itself.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

VOCAB, LENGTH = 64, 8
Sample = tuple[torch.Tensor | dict[str, torch.Tensor], torch.Tensor]


def gpt2() -> nn.Module:
    """GPT-2: learned positions, tied input and output embeddings."""
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=16, n_layer=2, n_head=2,
                                      bos_token_id=0, eos_token_id=0))


def llama() -> nn.Module:
    """Llama: rotary embeddings, grouped-query attention (4 query heads share 2 key/value heads), RMSNorm, SwiGLU."""
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=LENGTH))


def t5() -> nn.Module:
    """T5: an encoder and a decoder with relative position buckets, tied embeddings."""
    from transformers import T5Config, T5ForConditionalGeneration

    return T5ForConditionalGeneration(T5Config(vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=1,
                                               num_decoder_layers=1, num_heads=2))


def bart() -> nn.Module:
    """BART: an encoder and a decoder with learned positions."""
    from transformers import BartConfig, BartForConditionalGeneration

    return BartForConditionalGeneration(BartConfig(vocab_size=VOCAB, d_model=16, encoder_layers=1, decoder_layers=1,
                                                   encoder_attention_heads=2, decoder_attention_heads=2,
                                                   encoder_ffn_dim=32, decoder_ffn_dim=32,
                                                   max_position_embeddings=LENGTH))


def bert() -> nn.Module:
    """BERT with its masked-language-model head: bidirectional, no key/value cache in use (its config still says
    ``use_cache=True``)."""
    from transformers import BertConfig, BertForMaskedLM

    return BertForMaskedLM(BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=32, max_position_embeddings=LENGTH))


FAMILIES: dict[str, Callable[[], nn.Module]] = {"gpt2": gpt2, "llama": llama, "t5": t5, "bart": bart, "bert": bert}
ENCODER_DECODER = {"t5", "bart"}


def build(family: str, seed: int = 0) -> nn.Module:
    """The model of ``family`` with weights from ``seed``."""
    torch.manual_seed(seed)
    return FAMILIES[family]()


def counting(family: str, n: int, seed: int) -> list[Sample]:
    """``n`` samples of sequences that count up (mod the vocabulary) from a random start: the tokens of length
    ``LENGTH`` and the next tokens. An encoder-decoder's input is ``{"input_ids", "decoder_input_ids"}`` (both the
    tokens); any other's is the tokens ``(LENGTH,)`` int64."""
    g = torch.Generator().manual_seed(seed)
    seq = (torch.randint(0, VOCAB, (n, 1), generator=g) + torch.arange(LENGTH + 1)) % VOCAB
    if family in ENCODER_DECODER:
        return [({"input_ids": s[:-1], "decoder_input_ids": s[:-1]}, s[1:]) for s in seq]
    return [(s[:-1], s[1:]) for s in seq]


def minibatch(samples: list[Sample]) -> tuple[torch.Tensor | dict[str, torch.Tensor], torch.Tensor]:
    """``(input, target)`` of ``samples`` stacked along a new first dimension, as the harness collates them."""
    from pipedream.data.base import as_sample_set

    return as_sample_set(samples).batch(list(range(len(samples))))
