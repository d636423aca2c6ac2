"""A Hugging Face GPT-2 (tiny config, tied embeddings, random weights, no download) as a user brings it: a
function returning the bare model and its token data (tests/hf_gpt2.py), captured by torch.export, profiled,
planned and trained in both modes; the pipeline equals one process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pipedream.data.fashion_mnist import minibatch_indices
from pipedream.models import build_model, classification_loss
from pipedream.plan import Plan, Stage
from pipedream.runtime import split
from pipedream.runtime.config import TrainConfig
from pipedream.runtime.launch import spawn_local
from pipedream.runtime.task import load_datasets
from tests.test_user_model import _cli

pytestmark = pytest.mark.slow
EXACT = "tests.hf_gpt2:make_without_dropout"


def test_gpt2_profiles_plans_and_trains_in_both_modes(tmp_path: Path) -> None:
    model = "tests.hf_gpt2:make"
    proc = _cli("profile", "--model", model, "--profiled-batch", "8", "--iters", "2", "--warmup", "1",
                "--out-dir", "profile", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    graph = (tmp_path / "profile/graph.txt").read_text()
    assert "GPT2Attention" not in graph and "Embedding transformer.wte" in graph and "Linear lm_head" in graph
    proc = _cli("plan", "--profile", "profile/graph.txt", "--cluster", "2:1e9", "--straight", "--out", "plan.json",
                cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert len(plan["stages"]) == 2  # the planner's split point; the tied embeddings land in both stages
    common = ("--model", model, "--workers", "2", "--epochs", "2", "--batch-size", "8", "--optimizer", "adam",
              "--lr", "0.01", "--no-progress", "--timeout-s", "300")
    for mode, extra in (("pipedream", ("--plan", "plan.json")), ("dp", ())):
        proc = _cli("train", "--mode", mode, *extra, *common, "--out-dir", mode, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        rows = json.loads((tmp_path / mode / "metrics.json").read_text())
        assert [r["train_samples"] for r in rows] == [128, 128]
        assert rows[1]["train_loss"] < rows[0]["train_loss"]  # it learns to count
        assert 0.0 < rows[1]["val_accuracy"] <= 1.0  # token accuracy over (batch, positions)


def _cut_plan(path: Path, cut: int) -> Plan:
    """Two stages of GPT-2's layer graph, cut after node ``cut`` (node ids as the profiler numbers them)."""
    from pipedream.runtime.task import load_task

    task = load_task(TrainConfig(model=EXACT))
    ids = [i for n, i in split.node_ids(split.trace(task.model, "layer", task.input_batch(4))).items()
           if n.op in split.OPS]
    plan = Plan(model=EXACT, cluster="manual", workers=2, stages=[Stage(ids[:cut], 1, [0]), Stage(ids[cut:], 1, [1])],
                minibatch_size=8, time_per_sample_s=0.0, dp_time_per_sample_s=0.0)
    plan.save(path)
    return plan


@pytest.mark.parametrize("schedule,microbatches,steps", [("gpipe", 2, 3), ("1f1b", 1, 1)])
def test_gpt2_pipeline_with_tied_embeddings_equals_one_process(tmp_path: Path, schedule: str, microbatches: int,
                                                                steps: int) -> None:
    """GPT-2 cut in the middle of its blocks: stage 0 holds the input embedding, stage 1 the output layer that
    reads the same weight. GPipe (three minibatches of SGD with momentum and weight decay) ends where one
    process does; under 1F1B the first minibatch's gradients, the tied weight's summed over both uses, are
    the one process's."""
    _cut_plan(tmp_path / "plan.json", 20)
    cfg = TrainConfig(model=EXACT, plan=str(tmp_path / "plan.json"), schedule=schedule, microbatches=microbatches,
                      epochs=1, batch_size=8, lr=0.1, momentum=0.9, weight_decay=5e-4, max_minibatches=3,
                      out_dir=str(tmp_path / "out"), progress=False, debug_dump=True, comm_timeout_s=60)
    spawn_local(cfg, 2, timeout_s=300)
    dumps = [torch.load(tmp_path / "out/debug" / f"rank{r}.pt", weights_only=False) for r in range(2)]
    model = build_model(EXACT, "reduced", 0)
    train, _ = load_datasets(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    first = None
    for rows in minibatch_indices(len(train), 8, 0, 0)[:steps]:
        x, y = train.batch(rows)
        opt.zero_grad()
        classification_loss(model(x), y).backward()
        first = first or {n: p.grad.clone() for n, p in model.named_parameters(remove_duplicate=False)}
        opt.step()
    ref = dict(model.named_parameters(remove_duplicate=False))
    tied = model.transformer.wte.weight
    assert sum(1 for d in dumps for n in d["params"] if ref[n] is tied) == 2  # a copy in each stage
    for d in dumps:
        for n, g in d["first_grads"].items():
            torch.testing.assert_close(g, first[n], rtol=1e-4, atol=1e-6)
        if schedule == "gpipe":
            for n, p in d["params"].items():
                torch.testing.assert_close(p, ref[n].detach(), rtol=1e-4, atol=1e-6)


def test_a_plan_that_cannot_keep_the_tied_copies_equal_is_refused_before_any_worker(tmp_path: Path) -> None:
    plan = _cut_plan(tmp_path / "plan.json", 20)
    plan.stages[0].replicas, plan.stages[0].ranks, plan.stages[1].ranks, plan.workers = 2, [0, 1], [2], 3
    plan.save(tmp_path / "plan.json")
    proc = _cli("train", "--mode", "pipedream", "--model", EXACT, "--plan", "plan.json", "--workers", "3",
                "--batch-size", "8", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: parameter lm_head.weight is used by stages [0, 1], replicated [2, 1] times: under 1F1B their steps "
        "cover different minibatches; plan them with equal replicas or use --schedule gpipe or 2bw")
    assert not (tmp_path / "results").exists()  # nothing was started or written
