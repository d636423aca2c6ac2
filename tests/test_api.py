"""pipedream as a library (pipedream.api): profile, plan and train a bare module with dict inputs and a tied
weight, no ModelSpec; the pipeline equals one process."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import pipedream
import pipedream.errors
from pipedream.data.fashion_mnist import minibatch_indices


class TwoInputs(nn.Module):
    """``{"image": (B, 12), "bias": (B, 4)}`` -> 3 logits; ``inp``'s weight is read again, transposed, before the
    head (a tie between a layer and the glue after the body)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 12, bias=False)
        self.body = nn.Sequential(nn.Linear(12, 12), nn.Tanh(), nn.Linear(12, 12), nn.Tanh())
        self.head = nn.Linear(4, 3)

    def forward(self, image: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        h = self.body(image + self.inp(bias))
        return self.head(F.linear(h, self.inp.weight.t()))  # the input projection, transposed, read again


def samples(n: int, seed: int) -> list[tuple[dict[str, torch.Tensor], torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    x, b = torch.randn(n, 12, generator=g), torch.randn(n, 4, generator=g)
    y = (x[:, 0] > b[:, 0]).long() + (x[:, 1] > 0).long()
    return [({"image": x[i], "bias": b[i]}, y[i]) for i in range(n)]


def _model() -> TwoInputs:
    torch.manual_seed(0)
    return TwoInputs()


@pytest.mark.slow
def test_profile_plan_train_from_python_equals_one_process(tmp_path: Path) -> None:
    train, val = samples(96, 1), samples(32, 2)
    model = _model()
    x = {"image": torch.stack([s[0]["image"] for s in train[:8]]), "bias": torch.stack([s[0]["bias"] for s in train[:8]])}
    y = torch.stack([s[1] for s in train[:8]])
    graph = pipedream.profile(model, x, target=y, warmup=0, iters=1)
    assert graph.minibatch_size == 8 and len(graph.nodes) > 4
    plan = pipedream.partition(graph, "2:1e9", straight=True)
    assert len(plan.stages) == 2
    config = pipedream.TrainConfig(epochs=1, batch_size=8, lr=0.1, momentum=0.9, schedule="gpipe", microbatches=2,
                                   train_subset=64, out_dir=str(tmp_path / "out"), progress=False, debug_dump=True,
                                   comm_timeout_s=60)
    rows = pipedream.train(model, plan, (train, val), config)
    assert len(rows) == 1 and rows[0]["train_samples"] == 64  # the harness drew 64 of the 96 samples
    dumps = [torch.load(tmp_path / "out/debug" / f"rank{r}.pt", weights_only=False) for r in range(2)]
    # one process on the same 64 samples in the same order
    from pipedream.data.base import as_sample_set, limit

    data = limit(as_sample_set(train), 64, 0)
    ref = _model()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    for rows_ in minibatch_indices(len(data), 8, 0, 0):
        xb, yb = data.batch(rows_)
        opt.zero_grad()
        F.cross_entropy(ref(**xb), yb).backward()
        opt.step()
    expected = dict(ref.named_parameters())
    assert {n for d in dumps for n in d["params"]} == set(expected)
    for d in dumps:
        for n, p in d["params"].items():
            torch.testing.assert_close(p, expected[n].detach(), rtol=1e-5, atol=1e-6)


def _fake_train(calls: list, fail: str | None = None):  # type: ignore[no-untyped-def,type-arg]
    """A stand-in for :func:`pipedream.api.train` that records its call and writes one epoch as workers would."""
    from pipedream.io import atomic_write_json

    def fake(model, plan, datasets, config, **kw):  # type: ignore[no-untyped-def]
        calls.append((model, plan, datasets, config, kw))
        if fail:
            raise pipedream.errors.PipeDreamError(fail)
        rows = [{"epoch": 1, "epoch_time_s": 0.5, "wall_time_s": 0.6, "train_loss": 1.5, "val_accuracy": 0.25}]
        atomic_write_json(Path(config.out_dir) / "metrics.json", rows)
        kw["on_epochs"](rows)  # as the watcher of metrics.json does
        return rows

    return fake


CLI = ["train", "--mode", "pipedream", "--model", "tests.tiny:tiny_model", "--workers", "2", "--epochs", "2",
       "--batch-size", "8", "--lr", "0.05", "--data", "synthetic", "--out-dir", "run", "--experiment", "tiny/api",
       "--no-progress", "--timeout-s", "77"]


def test_the_cli_trains_through_the_api(mlflow_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`pipedream train` parses and checks its options, then calls pipedream.train with them (torchrun launcher,
    the staging folder as out_dir, each epoch handed to MLflow); run.json and the MLflow run are its own."""
    import json

    from pipedream import api, cli
    from pipedream.tracking import load_runs

    calls: list = []  # type: ignore[type-arg]
    monkeypatch.setattr(api, "train", _fake_train(calls))
    assert cli.main(CLI) == 0
    ((model, plan, datasets, config, kw),) = calls
    assert (model, plan, datasets) == ("tests.tiny:tiny_model", None, None)
    assert isinstance(config, pipedream.TrainConfig) and config.model == "tests.tiny:tiny_model"
    assert (config.epochs, config.batch_size, config.lr, config.data, config.progress) == (2, 8, 0.05, "synthetic", False)
    assert config.out_dir == str(Path("run.partial"))  # the run's staging folder, committed after success
    assert {k: v for k, v in kw.items() if k != "on_epochs"} == {
        "mode": "pipedream", "launcher": "torchrun", "workers": 2, "nnodes": 1, "rdzv_endpoint": None,
        "timeout_s": 77.0, "max_restarts": 0}
    run = json.loads((mlflow_store / "run" / "run.json").read_text())
    assert run["epochs"] == 1 and run["final_train_loss"] == 1.5 and not (mlflow_store / "run.partial").exists()
    (logged,) = load_runs("tiny/api")
    assert logged["run_id"] == run["run_id"] and logged["params"]["mode"] == "pipedream"


def test_a_failed_api_run_is_one_error_line_of_the_cli(mlflow_store: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from pipedream import api, cli
    from pipedream.tracking import _mlflow

    (mlflow_store / "run").mkdir()
    (mlflow_store / "run" / "metrics.json").write_text("previous results\n")
    monkeypatch.setattr(api, "train", _fake_train([], fail="training failed: rank 1 was killed by SIGKILL; log: x"))
    assert cli.main(CLI) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert lines[-1] == "error: training failed: rank 1 was killed by SIGKILL; log: x"
    assert (mlflow_store / "run" / "metrics.json").read_text() == "previous results\n"
    mlflow = _mlflow()
    exp = mlflow.get_experiment_by_name("tiny/api")
    assert [r.info.status for r in mlflow.MlflowClient().search_runs([exp.experiment_id])] == ["FAILED"]


@pytest.mark.parametrize("model,kw,message", [
    (nn.Linear(2, 2), {"launcher": "torchrun"}, "torchrun's workers build the model and its data from their names"),
    ("tests.tiny:tiny_model", {"launcher": "torchrun", "datasets": ([], [])}, "no datasets or criterion"),
    ("tests.tiny:tiny_model", {"launcher": "mpirun"}, "unknown launcher 'mpirun'"),
    ("tests.tiny:tiny_model", {"nnodes": 2}, "several nodes need launcher='torchrun'"),
    ("tests.tiny:tiny_model", {"launcher": "torchrun", "nnodes": 2, "workers": 2}, "--rdzv-endpoint HOST:PORT"),
    (nn.Linear(2, 2), {}, "a model given as a module needs datasets=(train, val)"),
    ("tests.tiny:tiny_model", {"mode": "gpipe"}, "unknown mode 'gpipe'"),
])
def test_bad_api_settings_are_refused_before_anything_starts(tmp_path: Path, model, kw, message) -> None:  # type: ignore[no-untyped-def]
    datasets = kw.pop("datasets", None)
    config = pipedream.TrainConfig(out_dir=str(tmp_path / "out"))
    with pytest.raises(pipedream.errors.PipeDreamError, match=re.escape(message)):
        pipedream.train(model, None, datasets, config, **kw)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_named_model_trains_through_torchrun_as_through_the_fork_server(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """pipedream.train with a model name under the supervised torchrun launcher (what `pipedream train` runs): the
    same epochs and final weights as the local launcher, each epoch handed to on_epochs, train.log written."""
    from dataclasses import replace

    from tests.conftest import REPO
    from tests.tiny import write_data

    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the workers import tests.tiny
    config = pipedream.TrainConfig(epochs=2, batch_size=8, lr=0.05, max_minibatches=4, train_subset=64, val_subset=16,
                                   data_dir=str(write_data(tmp_path / "data")), progress=False, debug_dump=True,
                                   comm_timeout_s=60)
    seen: list = []  # type: ignore[type-arg]
    rows = {}
    for launcher in ("torchrun", "local"):
        rows[launcher] = pipedream.train("tests.tiny:tiny_model", None, None,
                                         replace(config, out_dir=str(tmp_path / launcher)), workers=2,
                                         launcher=launcher, timeout_s=300,
                                         on_epochs=seen.append if launcher == "torchrun" else None)
    assert [r["epoch"] for r in rows["torchrun"]] == [1, 2] and seen[-1] == rows["torchrun"]
    assert [r["train_loss"] for r in rows["torchrun"]] == [r["train_loss"] for r in rows["local"]]
    assert (tmp_path / "torchrun" / "train.log").is_file()
    for rank in range(2):
        a, b = (torch.load(tmp_path / where / "debug" / f"rank{rank}.pt", weights_only=False)["params"]
                for where in ("torchrun", "local"))
        assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
