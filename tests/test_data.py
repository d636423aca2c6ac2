"""Fashion-MNIST reading on tiny IDX files written here, and one check of the installed data set."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pipedream.data import fashion_mnist as fm
from pipedream.errors import PipeDreamError
from tests.tiny import write_idx


def write_tiny(root: Path, n_train: int = 20, n_val: int = 10, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, n_train, dtype=np.uint8)
    write_idx(root / fm.FILES["train"][0], images)
    write_idx(root / fm.FILES["train"][1], labels)
    write_idx(root / fm.FILES["val"][0], images[:n_val])
    write_idx(root / fm.FILES["val"][1], labels[:n_val])
    return images, labels


def test_reads_idx_exactly(tmp_path: Path) -> None:
    images, labels = write_tiny(tmp_path)
    train, val = fm.load(tmp_path)
    assert train.images.dtype == torch.uint8 and train.images.shape == (20, 28, 28)
    assert np.array_equal(train.images.numpy(), images)
    assert train.labels.tolist() == labels.astype(int).tolist()
    assert len(val) == 10


def test_to_input_pads_repeats_normalises(tmp_path: Path) -> None:
    write_tiny(tmp_path)
    train, _ = fm.load(tmp_path)
    x = fm.to_input(train.images[:3])
    assert x.shape == (3, 3, 32, 32) and x.dtype == torch.float32
    assert torch.equal(x[:, 0], x[:, 2])
    assert torch.allclose(x[0, 0, 0, 0], torch.tensor((0 - fm.MEAN) / fm.STD))  # padding is black
    pixel = float(train.images[1, 5, 7]) / 255
    assert torch.allclose(x[1, 1, 5 + fm.PAD, 7 + fm.PAD], torch.tensor((pixel - fm.MEAN) / fm.STD))


def test_subsets_and_orders_are_deterministic(tmp_path: Path) -> None:
    write_tiny(tmp_path)
    a, _ = fm.load(tmp_path, train_subset=7, seed=3)
    b, _ = fm.load(tmp_path, train_subset=7, seed=3)
    c, _ = fm.load(tmp_path, train_subset=7, seed=4)
    assert torch.equal(a.labels, b.labels) and torch.equal(a.images, b.images)
    assert not torch.equal(a.images, c.images)
    batches = fm.minibatch_indices(20, 6, seed=0, epoch=1)
    assert len(batches) == 3 and all(len(b) == 6 for b in batches)
    assert [b.tolist() for b in batches] == [b.tolist() for b in fm.minibatch_indices(20, 6, seed=0, epoch=1)]
    assert batches[0].tolist() != fm.minibatch_indices(20, 6, seed=0, epoch=2)[0].tolist()


def test_missing_files_name_the_package(tmp_path: Path) -> None:
    with pytest.raises(PipeDreamError, match="apt-get install dataset-fashion-mnist"):
        fm.load(tmp_path)


def test_corrupt_file_is_reported(tmp_path: Path) -> None:
    write_tiny(tmp_path)
    (tmp_path / fm.FILES["train"][1]).write_bytes(b"not gzip")
    with pytest.raises(PipeDreamError, match="gzip"):
        fm.load(tmp_path)


@pytest.mark.skipif(not (fm.DEFAULT_ROOT / fm.FILES["val"][0]).is_file(), reason="dataset-fashion-mnist not installed")
def test_installed_dataset_has_the_real_sizes() -> None:
    val = fm.load_split("val", fm.DEFAULT_ROOT)
    assert val.images.shape == (10000, 28, 28)
    assert sorted(set(val.labels.tolist())) == list(range(10))
    assert torch.bincount(val.labels).tolist() == [1000] * 10


def test_a_last_stage_takes_targets_without_collating_inputs_and_one_stage_collates_once() -> None:
    from pipedream.data.base import SampleSet
    from pipedream.runtime.worker import Batches

    calls = []

    def collate(samples):  # noqa: ANN001, ANN202 - counts the (expensive) full collations
        calls.append(len(samples))
        return torch.stack([x for x, _ in samples]), torch.stack([y for _, y in samples])

    xs, ys = torch.arange(8.0).reshape(8, 1), torch.arange(8) % 3
    data = SampleSet(list(zip(xs, ys, strict=True)), collate, {}, lambda s: torch.stack([y for _, y in s]))
    b = Batches(data, [torch.tensor([7, 1, 4, 2])], micro=2)
    assert b.labels(0, 1).tolist() == [4 % 3, 2 % 3] and calls == []  # the last stage: no input collated
    assert b.inputs(0, 0).flatten().tolist() == [7.0, 1.0] and b.labels(0, 0).tolist() == [1, 1]
    assert calls == [2]  # a one-stage rank: input and targets from one collation
