"""Translation data for GNMT-8/16 (paper §5.1: WMT16 English-German, BLEU).

``reduced``: the example sentences of the Ding German-English dictionary (Debian ``trans-de-en``,
``/usr/share/trans/de-en``, GPL-2+). Each line is ``German :: English``; both sides hold the same
number of ``|``-separated groups, and a group lists alternatives separated by ``;``. We keep, per
group, the first German and the first English alternative that are full sentences (a capital first
letter, ending in ``.``, ``!`` or ``?``, no brackets, slashes or other dictionary markup), one pair per
English sentence: about 16k pairs. Text is lower-cased and split into words and punctuation;
:data:`VAL_PAIRS` pairs, chosen by a fixed permutation, are held out for validation. The vocabulary
is word level (fairseq ``Dictionary``), built from the training side only.
``full``: a fairseq-binarized WMT16 En-De folder (``fairseq-preprocess`` output: ``dict.en.txt``,
``dict.de.txt``, ``train.en-de.en.{bin,idx}``, ``valid.en-de...``), path from ``root`` or
``$PIPEDREAM_WMT16``.

Samples and batches (the GNMT models' input contract, :mod:`pipedream.models.gnmt`): a sample is
``(source ids + eos, target ids + eos)``; a batch is ``(x (B, 2, L), target (B, L))`` int64
(:func:`make_collate`).
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path
from typing import Any

import torch

from pipedream.data.base import Rows, Sample, SampleSet, require_module, subset_indices
from pipedream.data.cache import derived
from pipedream.errors import PipeDreamError

DING_PATH = Path("/usr/share/trans/de-en")
DING_ENV = "PIPEDREAM_DING"
WMT16_ENV = "PIPEDREAM_WMT16"
VAL_PAIRS = 1000
MAX_TOKENS = 16  # words and punctuation per side, without eos
SPLIT_SEED = 20190001  # fixed: the train/val partition does not depend on a run's seed
_FULL_SENTENCE = re.compile(r"^[A-ZÄÖÜ][^\[\]{}()<>/|;:=+*#~\"]*[.!?]$")
_TOKEN = re.compile(r"\w+|[^\w\s]")
_FAIRSEQ = "pip install --no-build-isolation fairseq-fixed==0.12.3.1"


def tokenize(text: str) -> list[str]:
    """Lower-cased words and punctuation marks of ``text``."""
    return _TOKEN.findall(text.lower())


def read_ding(path: Path | None = None) -> list[tuple[str, str]]:
    """Full-sentence ``(english, german)`` pairs of the Ding dictionary, in file order, one per English sentence
    (parsed once per file and kept in :mod:`pipedream.data.cache`).

    Raises:
        PipeDreamError: the file is missing (names the Debian package).
    """
    path = Path(path or os.environ.get(DING_ENV, DING_PATH))
    data = derived(path, "ding1", lambda: json.dumps(_parse_ding(path)).encode())
    return [(e, d) for e, d in json.loads(data)]


def _parse_ding(path: Path) -> list[tuple[str, str]]:
    """:func:`read_ding` without the cache."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise PipeDreamError(f"Ding dictionary {path} not found; install it with `apt-get install trans-de-en` "
                             f"(or `make data`), or point ${DING_ENV} at a copy") from None
    pairs: dict[str, str] = {}
    for line in lines:
        if line.startswith("#") or " :: " not in line or not ("." in line or "!" in line or "?" in line):
            continue
        de, en = line.split(" :: ", 1)
        for de_group, en_group in zip(de.split(" | "), en.split(" | "), strict=False):
            d = next((a.strip() for a in de_group.split(";") if _FULL_SENTENCE.match(a.strip())), None)
            e = next((a.strip() for a in en_group.split(";") if _FULL_SENTENCE.match(a.strip())), None)
            if d and e:
                pairs.setdefault(e, d)
    return list(pairs.items())


def _pair(dataset: Any, row: int) -> Sample:
    """``(source ids, target ids)`` of row ``row`` of a fairseq ``LanguagePairDataset``."""
    item = dataset[row]
    return item["source"], item["target"]


def make_collate(pad: int, eos: int, length: int | None = None):
    """Collate ``(source, target)`` id tensors into ``x (B, 2, L)`` and ``target (B, L)`` (fairseq padding).

    ``L`` is ``length`` when given (every minibatch has the same shape, so a pipeline stage boundary
    has a fixed size), else the longest sentence of the minibatch.
    """
    data_utils = require_module("fairseq.data.data_utils", _FAIRSEQ)

    def collate(samples: list[Sample]) -> tuple[torch.Tensor, torch.Tensor]:
        src = data_utils.collate_tokens([s[0] for s in samples], pad, eos, left_pad=False)
        tgt = data_utils.collate_tokens([s[1] for s in samples], pad, eos, left_pad=False)
        prev = data_utils.collate_tokens([s[1] for s in samples], pad, eos, left_pad=False,
                                         move_eos_to_beginning=True)
        size = length or max(src.shape[1], tgt.shape[1])
        grow = lambda t: torch.nn.functional.pad(t, (0, size - t.shape[1]), value=pad)  # noqa: E731
        return torch.stack([grow(src), grow(prev)], dim=1).long(), grow(tgt).long()

    return collate


@functools.lru_cache(maxsize=2)
def _ding_corpus(path: str, vocab_size: int) -> tuple[dict[str, list], tuple[Any, Any], dict[str, tuple[list, list]]]:
    """Tokenised train/val pairs, the two fairseq dictionaries, and the id tensors (cached per path)."""
    fdata = require_module("fairseq.data", _FAIRSEQ)
    pairs = [(tokenize(e), tokenize(d)) for e, d in read_ding(Path(path))]
    pairs = [(e, d) for e, d in pairs if 1 <= len(e) <= MAX_TOKENS and 1 <= len(d) <= MAX_TOKENS]
    order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(SPLIT_SEED)).tolist()
    split = {"val": [pairs[i] for i in sorted(order[:VAL_PAIRS])], "train": [pairs[i] for i in sorted(order[VAL_PAIRS:])]}
    dicts = []
    for side in (0, 1):
        d = fdata.Dictionary()
        for p in split["train"]:
            for w in p[side]:
                d.add_symbol(w)
        d.finalize(threshold=2, nwords=vocab_size, padding_factor=1)
        dicts.append(d)

    def ids(d: Any, words: list[str]) -> torch.Tensor:  # Dictionary.encode_line without its per-line parsing
        return torch.tensor([d.indices.get(w, d.unk_index) for w in words] + [d.eos_index], dtype=torch.long)

    encoded = {name: ([ids(dicts[0], e) for e, _ in rows], [ids(dicts[1], d) for _, d in rows])
               for name, rows in split.items()}
    return split, (dicts[0], dicts[1]), encoded


def ding_datasets(vocab_size: int, train_subset: int | None, val_subset: int | None, seed: int,
                  path: Path | None = None) -> tuple[SampleSet, SampleSet]:
    """English->German Ding pairs as fairseq data; dictionaries hold at most ``vocab_size`` symbols.

    Returns ``(train, val)``; ``info`` carries the ``src_dict``/``tgt_dict`` (fairseq ``Dictionary``)
    and, for val, the tokenised German ``references`` (strings, before unknown-word mapping).
    """
    fdata = require_module("fairseq.data", _FAIRSEQ)
    split, (src_dict, tgt_dict), encoded = _ding_corpus(str(path or os.environ.get(DING_ENV, DING_PATH)), vocab_size)
    out = []
    for name, size, s in (("train", train_subset, seed), ("val", val_subset, seed + 1)):
        rows = split[name]
        src, tgt = encoded[name]
        lp = fdata.LanguagePairDataset(src, [len(t) for t in src], src_dict, tgt, [len(t) for t in tgt], tgt_dict,
                                       left_pad_source=False)
        keep = subset_indices(len(rows), size, s)
        info: dict[str, Any] = {"source": str(path or os.environ.get(DING_ENV, DING_PATH)), "src_dict": src_dict,
                                "tgt_dict": tgt_dict, "pairs": len(keep)}
        if name == "val":
            info["references"] = [" ".join(rows[i][1]) for i in keep]
        out.append(SampleSet(Rows(functools.partial(_pair, lp), keep),
                             make_collate(src_dict.pad(), src_dict.eos(), MAX_TOKENS + 1), info))
    return out[0], out[1]


def wmt16_datasets(root: Path | None, vocab_size: int, train_subset: int | None, val_subset: int | None,
                   seed: int) -> tuple[SampleSet, SampleSet]:
    """fairseq-binarized WMT16 En->De from ``root`` (or ``$PIPEDREAM_WMT16``); nothing is downloaded.

    Raises:
        PipeDreamError: no path, missing files, or a dictionary larger than the model's ``vocab_size``.
    """
    fdata = require_module("fairseq.data", _FAIRSEQ)
    if root is None:
        if WMT16_ENV not in os.environ:
            raise PipeDreamError(f"full-size GNMT needs fairseq-binarized WMT16 En-De: set ${WMT16_ENV} to the "
                                 "fairseq-preprocess output folder (dict.en.txt, train.en-de.en.bin, ...)")
        root = Path(os.environ[WMT16_ENV])
    root = Path(root)
    dicts = {}
    for lang in ("en", "de"):
        f = root / f"dict.{lang}.txt"
        if not f.is_file():
            raise PipeDreamError(f"{f} not found; is {root} a fairseq-preprocess output folder for en-de?")
        dicts[lang] = fdata.Dictionary.load(str(f))
        if len(dicts[lang]) > vocab_size:
            raise PipeDreamError(f"{f} has {len(dicts[lang])} symbols but the full GNMT has {vocab_size}")
    out = []
    for name, size, s in (("train", train_subset, seed), ("valid", val_subset, seed + 1)):
        sides = []
        for lang in ("en", "de"):
            prefix = root / f"{name}.en-de.{lang}"
            ds = fdata.data_utils.load_indexed_dataset(str(prefix), dicts[lang])
            if ds is None:
                raise PipeDreamError(f"binarized split {prefix}.bin/.idx not found in {root}")
            sides.append(ds)
        lp = fdata.LanguagePairDataset(sides[0], sides[0].sizes, dicts["en"], sides[1], sides[1].sizes, dicts["de"],
                                       left_pad_source=False)
        keep = subset_indices(len(lp), size, s)
        info = {"source": str(root), "src_dict": dicts["en"], "tgt_dict": dicts["de"], "pairs": len(keep)}
        out.append(SampleSet(Rows(functools.partial(_pair, lp), keep), make_collate(dicts["en"].pad(), dicts["en"].eos()), info))
    return out[0], out[1]


def corpus_bleu(hypotheses: list[str], references: list[str]) -> float:
    """Corpus BLEU (0-100) of tokenised hypotheses against one reference each, with sacrebleu.

    Raises:
        PipeDreamError: sacrebleu is not installed.
    """
    sacrebleu = require_module("sacrebleu", "pip install sacrebleu==2.6.0")
    return float(sacrebleu.corpus_bleu(hypotheses, [references]).score)
