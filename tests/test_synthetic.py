"""Synthetic data (``--data synthetic``): shapes, label ranges, determinism, O(1) memory, the check, a run."""

from __future__ import annotations

import argparse
import json
import tracemalloc
from pathlib import Path

import pytest
import torch
from torch import nn

from pipedream.commands import check as check_cmd
from pipedream.commands import train as train_cmd
from pipedream.data.synthetic import synthetic_datasets
from pipedream.errors import PipeDreamError
from pipedream.experiment import load_yaml
from pipedream.models import build_model, get_spec, model_names
from pipedream.runtime.config import TrainConfig
from pipedream.runtime.task import load_task
from tests.conftest import REPO

IMAGE_MODELS = ("vgg16", "resnet50", "alexnet")


def _label_bound(name: str, preset: str) -> int:
    """Classes or vocabulary size of model ``name`` from its own definition (full image models built on
    the meta device: no weights allocated)."""
    if name in IMAGE_MODELS:
        with torch.device("meta"):
            model = get_spec(name).build(preset)
        return [m for m in model.modules() if isinstance(m, nn.Linear)][-1].out_features
    from pipedream.models import awd_lm, gnmt, s2vt, transformer

    if name in transformer.NAMES:
        return transformer.config_of(name, preset).vocab
    if name in ("gnmt8", "gnmt16"):
        return gnmt.CONFIGS[(name, preset)].vocab
    return {"awd_lm": awd_lm.CONFIGS, "s2vt": s2vt.CONFIGS}[name][preset].vocab


@pytest.mark.parametrize("preset", ["reduced", "full"])
@pytest.mark.parametrize("name", model_names())
def test_synthetic_batch_has_the_models_shapes_and_label_range(name: str, preset: str) -> None:
    spec = get_spec(name)
    train, val = synthetic_datasets(spec.synthetic(preset), 50, 20, seed=0)
    x, y = train.batch(range(8))
    assert tuple(x.shape) == (8, *spec.input_shape(preset))
    bound = _label_bound(name, preset)
    assert not y.is_floating_point() and 0 <= int(y.min()) and int(y.max()) < bound
    if name in IMAGE_MODELS:
        assert x.dtype == torch.float32 and y.shape == (8,)
        assert bound == (1000 if preset == "full" else 10)
    elif name == "s2vt":
        from pipedream.models.s2vt import CONFIGS

        assert x.dtype == torch.float32 and y.shape == (8, CONFIGS[preset].max_words)
    else:
        assert x.dtype == torch.int64 and y.shape == (8, x.shape[-1])
    assert len(train) == 50 and len(val) == 20


@pytest.mark.parametrize("name", model_names())
def test_synthetic_batch_trains_the_reduced_model(name: str) -> None:
    """A reduced model takes a synthetic batch and its loss backpropagates (the real data's format)."""
    spec = get_spec(name)
    x, y = synthetic_datasets(spec.synthetic("reduced"), 4, 4, seed=1)[0].batch(range(4))
    loss = spec.criterion(build_model(name, "reduced", 0)(x), y)
    assert torch.isfinite(loss)
    loss.backward()


def test_synthetic_data_is_deterministic_per_seed_split_and_index() -> None:
    made = get_spec("vgg16").synthetic("reduced")
    a_train, a_val = synthetic_datasets(made, 100, 100, seed=3)
    b_train, _ = synthetic_datasets(made, 100, 100, seed=3)
    c_train, _ = synthetic_datasets(made, 100, 100, seed=4)
    for i in (0, 17, 99):
        assert all(torch.equal(u, v) for u, v in zip(a_train[i], b_train[i], strict=True))
    assert not torch.equal(a_train[5][0], c_train[5][0])  # another seed
    assert not torch.equal(a_train[5][0], a_val[5][0])  # another split
    assert not torch.equal(a_train[5][0], a_train[6][0])  # another index
    labels = torch.stack([a_train[i][1] for i in range(100)])
    assert len(labels.unique()) == 10  # the labels cover the classes


def test_a_billion_samples_cost_no_memory() -> None:
    tracemalloc.start()
    train, val = synthetic_datasets(get_spec("resnet50").synthetic("full"), 10**9, 10**9, seed=0)
    x, y = train[10**9 - 1]
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(train) == len(val) == 10**9 and x.shape == (3, 224, 224)
    assert peak < 10_000_000  # bytes held by Python objects: no per-sample state
    with pytest.raises(IndexError):
        train[10**9]


def test_default_size_is_the_real_data_sets() -> None:
    train, val = synthetic_datasets(get_spec("alexnet").synthetic("full"), None, None, seed=0)
    assert (len(train), len(val)) == (1_281_167, 50_000)


def test_load_task_honours_data_synthetic_and_full_s2vt_runs_on_it() -> None:
    task = load_task(TrainConfig(model="s2vt", preset="reduced", data="synthetic", train_subset=16, val_subset=8))
    assert task.train.info["source"] == "synthetic" and len(task.train) == 16
    with pytest.raises(PipeDreamError, match="--data synthetic"):
        load_task(TrainConfig(model="s2vt", preset="full", train_subset=16, val_subset=8))


def test_data_option_is_validated() -> None:
    with pytest.raises(PipeDreamError, match="unknown --data"):
        TrainConfig(data="fake").validate()
    with pytest.raises(PipeDreamError, match="--data-dir"):
        TrainConfig(data="synthetic", data_dir="/x").validate()


def _check(config: Path, **kw: object) -> int:
    return check_cmd.run(argparse.Namespace(config=str(config), data=kw.get("data"),
                                            missing_data=kw.get("missing_data", "error")))


def _paper_config(tmp_path: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    import yaml

    cfg = load_yaml(REPO / "experiments" / "table1.yaml")
    cfg["paper_table"] = str(REPO / cfg["paper_table"])
    cfg["clusters_file"] = str(REPO / cfg["clusters_file"])
    edit(cfg)
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def test_check_refuses_full_s2vt_on_real_data_naming_the_fix(tmp_path: Path) -> None:
    def real_s2vt(cfg: dict) -> None:  # type: ignore[type-arg]
        cfg["models"] = {"s2vt": cfg["models"]["s2vt"]}
        cfg["models"]["s2vt"]["train"]["data"] = "real"

    path = _paper_config(tmp_path, real_s2vt)
    with pytest.raises(PipeDreamError, match="full-size S2VT has no real data.*data: synthetic.*or drop the model"):
        _check(path, missing_data="warn")  # never only a warning: no machine has the data


def test_check_names_the_missing_imagenet_variable_or_warns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("PIPEDREAM_IMAGENET", raising=False)
    monkeypatch.delenv("PIPEDREAM_WMT16", raising=False)
    path = _paper_config(tmp_path, lambda cfg: None)
    with pytest.raises(PipeDreamError, match=r"models.vgg16: .*set \$PIPEDREAM_IMAGENET, or use data: synthetic"):
        _check(path)
    assert _check(path, missing_data="warn") == 0  # make dry-run-paper
    assert "warning:" in capsys.readouterr().err
    assert _check(path, data="synthetic") == 0  # snakemake --config data=synthetic
    monkeypatch.setenv("PIPEDREAM_IMAGENET", str(tmp_path))
    monkeypatch.setenv("PIPEDREAM_WMT16", str(tmp_path))
    assert _check(path) == 0


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["pipedream", "dp"])
def test_train_on_synthetic_data_end_to_end(tmp_path: Path, mode: str, mlflow_store: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the workers import tests.tiny
    parser = argparse.ArgumentParser()
    train_cmd.add_arguments(parser)
    args = parser.parse_args(["--mode", mode, "--model", "tests.tiny:tiny_model", "--workers", "2", "--epochs", "1",
                              "--batch-size", "8", "--data", "synthetic", "--train-subset", "10000000",
                              "--val-subset", "16", "--max-minibatches", "4", "--out-dir", str(tmp_path / "run"),
                              "--experiment", "tiny/synthetic", "--no-progress", "--timeout-s", "180",
                              "--threshold", "0.5"])
    assert train_cmd.run(args) == 0
    (row,) = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert row["epoch_time_s"] > 0 and row["train_samples"] == 32  # 4 minibatches of 8
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["time_to_accuracy"] == "synthetic data"
    from pipedream.tracking import load_runs

    (logged,) = load_runs("tiny/synthetic")
    assert logged["params"]["data"] == "synthetic"
