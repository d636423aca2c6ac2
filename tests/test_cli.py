"""Command line: bad input gives one clear line, exit status 2 and no traceback."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PROFILES, REPO


def _run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipedream.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def _assert_clean_error(proc: subprocess.CompletedProcess[str], needle: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], proc.stderr


def test_unknown_model(tmp_path: Path) -> None:
    _assert_clean_error(_run("profile", "--model", "nosuchnet", "--out-dir", str(tmp_path)), "unknown model 'nosuchnet'")
    assert not any(tmp_path.iterdir())


def test_broken_yaml(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("scale: reduced\nmodels: [unclosed\n")
    _assert_clean_error(_run("report", "--config", str(bad)), "broken YAML")


def test_schema_violation_names_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text((REPO / "experiments" / "ci.yaml").read_text().replace("batch_size: 32", "batch_size: -32", 2))
    _assert_clean_error(_run("report", "--config", str(bad)), "profile/batch_size")


@pytest.mark.parametrize("cmd", ["profile", "report"])
def test_help_explains(cmd: str) -> None:
    proc = _run(cmd, "--help")
    assert proc.returncode == 0 and "--" in proc.stdout


@pytest.mark.parametrize("old,new,key", [("seed: 0}", "seed: 0, warmup_steps: 9}", "warmup_steps"),
                                         ("workers: 4\n", "workers: 4\nsynthetic_data: true\n", "synthetic_data"),
                                         ("    preset: reduced\n", "    preset: reduced\n    epochs: 9\n", "epochs")])
def test_unknown_config_key_is_refused(tmp_path: Path, old: str, new: str, key: str) -> None:
    """Every key of a config is honoured by the workflow or refused before anything runs."""
    bad = tmp_path / "bad.yaml"
    text = (REPO / "experiments" / "ci.yaml").read_text()
    assert old in text
    bad.write_text(text.replace(old, new, 1))
    _assert_clean_error(_run("check", "--config", str(bad)), key)


def test_bleu_threshold_must_be_the_models_metric(tmp_path: Path) -> None:
    """BLEU is scored with the model's own metric hook: gnmt8 has bleu, not s2vt's bleu4."""
    bad = tmp_path / "bad.yaml"
    text = (REPO / "experiments" / "ci.yaml").read_text()
    old = "threshold: {metric: token_accuracy, value: 11.5}"
    assert old in text
    bad.write_text(text.replace(old, "threshold: {metric: bleu4, value: 5.0}"))
    _assert_clean_error(_run("check", "--config", str(bad)), "models.gnmt8.threshold.metric: gnmt8 is scored with 'bleu'")
    bad.write_text(text.replace(old, "threshold: {metric: bleu, value: 5.0}"))
    proc = _run("check", "--config", str(bad))
    assert proc.returncode == 0, proc.stderr


def test_a_model_whose_dp_state_exceeds_the_device_is_refused(tmp_path: Path) -> None:
    """The reduced VGG-16's weights, gradients and SGD momentum (3 x its parameters) do not fit a 1 MB device."""
    import yaml

    text = (REPO / "experiments" / "ci.yaml").read_text()
    cluster = yaml.safe_load(text)["cluster"]
    (tmp_path / "clusters.yaml").write_text(f"clusters:\n  {cluster}:\n    levels: [{{workers: 4, bandwidth_Bps: 1.25e+8}}]\n"
                                            "    device_memory_bytes: 1.0e+6\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text + f"\nclusters_file: {tmp_path / 'clusters.yaml'}\n")
    _assert_clean_error(_run("check", "--config", str(bad)), "vgg16 (reduced) holds")


def test_every_training_key_of_the_schema_is_a_train_flag() -> None:
    """The workflow turns each models.<m>.train key into a `pipedream train` flag: none may be ignored."""
    from dataclasses import fields

    import yaml

    from pipedream.runtime.config import TrainConfig

    schema = yaml.safe_load((REPO / "workflows" / "schemas" / "config.schema.yaml").read_text())
    train = schema["properties"]["models"]["additionalProperties"]["properties"]["train"]["properties"]
    assert set(train) <= {f.name for f in fields(TrainConfig)}


RELEASE_VGG16 = "experiments/data/profiles/vgg16/graph.txt"


def test_help_builds_without_heavy_imports() -> None:
    """`pipedream --help` and `pipedream plan` stay quick: torch, pandas and numpy load inside run() only."""
    script = ("import sys, contextlib, io\n"
              "from pipedream.cli import main\n"
              "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
              "    main(['--help'])\n"
              "print(sorted(m for m in ('torch', 'pandas', 'numpy', 'mlflow') if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_plan_from_any_directory_without_torch(tmp_path: Path) -> None:
    """A shipped profile and cluster are found from another directory; the batch comes from the shipped
    meta.json; planning does not import torch."""
    script = ("import sys\n"
              "from pipedream.cli import main\n"
              f"rc = main(['plan', '--profile', {RELEASE_VGG16!r}, '--cluster', 'A_4x4', '--out', 'x.json'])\n"
              "print('rc', rc, 'torch' in sys.modules)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "rc 0 False"
    plan = json.loads((tmp_path / "x.json").read_text())
    assert plan["minibatch_size"] == 128 and plan["workers"] == 16 and plan["model"] == "vgg16"


@pytest.mark.parametrize("model,batch", [("alexnet", 256), ("vgg16", 128), ("resnet50", 128), ("gnmt", 64),
                                         ("gnmt_large", 64)])
def test_release_profiles_know_their_batch(model: str, batch: int) -> None:
    from pipedream.graph import profiled_batch

    path = REPO / "experiments" / "data" / "profiles" / model / "graph.txt"
    assert profiled_batch(path) == batch
    assert profiled_batch(path, 7) == 7


def test_simulate_takes_1f1b_and_the_old_name(tmp_path: Path) -> None:
    outs = []
    for name in ("1f1b", "pipedream"):
        out = tmp_path / f"{name}.json"
        proc = _run("simulate", "--profile", RELEASE_VGG16, "--cluster", "A_4x4", "--schedule", name,
                    "--json", str(out), cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("1f1b on ")
        outs.append(json.loads(out.read_text())["epoch_time_s"])
    assert outs[0] == outs[1]


def test_simulate_pipedream_flush_with_recomputation(tmp_path: Path) -> None:
    """`pipedream simulate --schedule pipedream_flush`: the epoch grows with --recompute (one more forward in every
    backward), the DP baseline it is compared with does not."""
    outs = {}
    for extra in ([], ["--recompute"]):
        out = tmp_path / f"flush{len(extra)}.json"
        proc = _run("simulate", "--profile", RELEASE_VGG16, "--cluster", "A_1x4", "--schedule", "pipedream_flush",
                    "--microbatches", "8", *extra, "--json", str(out), cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("pipedream_flush on ")
        outs[bool(extra)] = json.loads(out.read_text())
    assert outs[True]["epoch_time_s"] > outs[False]["epoch_time_s"]
    assert outs[True]["dp_epoch_time_s"] == outs[False]["dp_epoch_time_s"]
    assert outs[True]["microbatches"] == 8 and outs[True]["schedule"] == "pipedream_flush"


def test_every_option_has_help() -> None:
    from pipedream.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = [f"{name} {'/'.join(a.option_strings)}" for name, p in sub.choices.items() for a in p._actions
               if a.option_strings and a.dest != "help" and not (a.help or "").strip()]
    assert missing == []


@pytest.fixture
def bad_files(tmp_path: Path) -> Path:
    """A binary file, an empty file, a folder and a 16-worker plan in ``tmp_path``."""
    (tmp_path / "binary.txt").write_bytes(bytes(range(128, 256)) * 4)
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "folder").mkdir()
    proc = _run("plan", "--profile", RELEASE_VGG16, "--cluster", "A_4x4", "--out", str(tmp_path / "p16.json"))
    assert proc.returncode == 0, proc.stderr
    plan = json.loads((tmp_path / "p16.json").read_text())
    holey = json.loads(json.dumps(plan))
    holey["stages"][-1]["nodes"].pop()  # the last layer in no stage
    (tmp_path / "holey.json").write_text(json.dumps(holey))
    plan["stages"].insert(1, {"nodes": [], "replicas": 1, "ranks": [plan["workers"]]})
    plan["workers"] += 1
    (tmp_path / "empty-stage.json").write_text(json.dumps(plan))
    return tmp_path


@pytest.mark.parametrize("args,message", [
    (["plan", "--profile", "binary.txt", "--cluster", "cpu4", "--out", "x.json"],
     "error: profile binary.txt is not a text file; expected a graph.txt profile"),
    (["plan", "--profile", "folder", "--cluster", "cpu4", "--out", "x.json"],
     "error: profile folder is a directory; give the graph.txt file inside it"),
    (["plan", "--profile", "empty.txt", "--cluster", "cpu4", "--out", "x.json"],
     "error: empty.txt: no nodes; is this a graph.txt profile?"),
    (["plan", "--profile", RELEASE_VGG16, "--cluster", "cpu4", "--out", "folder"],
     "error: folder is a directory; give a file name to write"),
    (["plan", "--profile", RELEASE_VGG16, "--cluster", "cpu4", "--profiled-batch", "-3", "--out", "x.json"],
     "error: --profiled-batch must be a positive number of samples, not -3"),
    (["plan", "--profile", RELEASE_VGG16, "--cluster", "4:-1e9", "--out", "x.json"],
     "error: cluster '4:-1e9' level 0: bandwidth_Bps=-1000000000.0 must be a positive number of bytes/s"),
    (["plan", "--profile", RELEASE_VGG16, "--cluster", "cpu4", "--clusters", "binary.txt", "--out", "x.json"],
     "error: clusters file binary.txt is not a text file; expected YAML"),
    (["simulate", "--profile", RELEASE_VGG16, "--plan", "binary.txt"],
     "error: plan binary.txt is not a text file; expected JSON"),
    (["simulate", "--profile", RELEASE_VGG16, "--plan", "folder"],
     "error: plan folder is a directory; give the plan's JSON file"),
    (["simulate", "--profile", "binary.txt", "--cluster", "cpu4"], "error: profile binary.txt is not a text file"),
    (["check", "--config", "empty.txt"], "error: empty.txt is empty; start from experiments/ci.yaml"),
    (["check", "--config", "binary.txt"], "error: config file binary.txt is not a text file; expected YAML"),
    (["report", "--predicted", "--paper-table", "binary.txt", "--out-dir", "r"],
     "error: paper table binary.txt is not a CSV file (UnicodeDecodeError)"),
    (["train", "--mode", "pipedream", "--model", "vgg16", "--plan", "nope.json"],
     "error: plan nope.json not found; run `pipedream plan` first"),
    (["train", "--mode", "pipedream", "--model", "vgg16", "--plan", "p16.json", "--workers", "4"],
     "error: plan p16.json is for 16 workers, not --workers 4; pass --workers 16 or plan for a cluster of 4 workers"),
    (["train", "--mode", "pipedream", "--model", "alexnet", "--plan", "p16.json", "--workers", "16"],
     "error: plan p16.json is for model 'vgg16', not --model 'alexnet'"),
    (["train", "--mode", "dp", "--workers", "-2"], "error: --workers, --nnodes and --timeout-s must be positive"),
    (["train", "--mode", "dp", "--max-restarts", "-1"], "error: --workers, --nnodes and --timeout-s must be positive, "
     "--max-restarts at least 0"),
    (["train", "--mode", "dp", "--train-subset", "-5"], "error: --train-subset must not be negative (got -5)"),
    (["train", "--mode", "dp", "--checkpoint-every", "often"], "error: --checkpoint-every 'often' is neither a positive "
     "number of minibatches nor auto"),
    (["train", "--mode", "dp", "--checkpoint-every", "auto", "--checkpoint-overhead", "3.5"],
     "error: --checkpoint-overhead 3.5 is not a fraction between 0 and 1 (0.035 is 3.5%)"),
    (["train", "--mode", "dp", "--recompute"], "error: --recompute is a PipeDream option (each stage's forward is "
     "recomputed in its backward); the data-parallel baseline does not recompute: leave it out of --mode dp"),
    (["train", "--mode", "pipedream", "--model", "vgg16", "--plan", "holey.json", "--workers", "16"],
     "in no stage; re-plan from a profile of this model at this granularity"),
    (["train", "--mode", "pipedream", "--model", "vgg16", "--plan", "empty-stage.json", "--workers", "16"],
     "error: plan stage 1 has no layers; give it layers or remove the stage"),
    (["train", "--mode", "dp", "--model", "nosuch.module:make"],
     "error: cannot import model function 'nosuch.module:make': No module named 'nosuch'"),
])
def test_bad_input_is_one_line(bad_files: Path, args: list[str], message: str) -> None:
    proc = _run(*args, cwd=bad_files)
    _assert_clean_error(proc, message)
    assert not (bad_files / "results").exists()  # refused before anything was written


def test_train_refuses_an_unknown_model_before_starting_workers(tmp_path: Path) -> None:
    proc = _run("train", "--mode", "dp", "--model", "nosuchnet", "--workers", "2", cwd=tmp_path)
    _assert_clean_error(proc, "error: unknown model 'nosuchnet'; known models: alexnet, awd_lm, bert, gnmt16, gnmt8, "
                              "gpt, gpt_2.2b, gpt_3.8b, resnet50, s2vt, vgg16 (or package.module:function for your own)")
    assert "torch.distributed" not in proc.stdout and not (tmp_path / "results").exists()


def test_a_device_smaller_than_the_weights_gets_no_plan(tmp_path: Path) -> None:
    """AlexNet's 244 MB of weights, its gradients and momentum cannot fit a 1-byte device: the plan is refused
    with the stage and its bytes, and nothing is written."""
    out = tmp_path / "plan.json"
    proc = _run("plan", "--profile", str(PROFILES / "alexnet" / "graph.txt"), "--cluster", "4:1.25e9@1",
                "--profiled-batch", "128", "--out", str(out))
    # the smallest candidates keep the classifier in one stage: fc6 + fc7 + fc8 = 58,631,144 parameters,
    # 4 bytes each, times weights + gradients + momentum = 703,573,728 bytes
    _assert_clean_error(proc, "holds 704 MB of weights, gradients and optimizer state")
    assert not out.exists()


def test_train_on_torchs_runtime_takes_the_plans_schedule_or_refuses_ours() -> None:
    """``--runtime torch`` without a schedule of torch's takes the plan's schedule and microbatches; with our 1F1B and
    no such plan it is one ``error:`` line; a DP run ignores it."""
    from pipedream.commands.train import _config, add_arguments
    from pipedream.errors import PipeDreamError
    from pipedream.plan import Plan, Stage

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    plan = Plan("vgg16", "2:1e9", 2, [Stage(["node1"], 1, [0]), Stage(["node2"], 1, [1]), Stage(["node3"], 1, [1]),
                                      Stage(["node4"], 1, [0])], 8, 1.0, 1.0,
                extra={"schedule": "zbv", "microbatches": 4, "chunks": 2})
    args = parser.parse_args(["--mode", "pipedream", "--runtime", "torch", "--model", "vgg16", "--plan", "p.json"])
    cfg = _config(args, plan)
    assert (cfg.runtime, cfg.schedule, cfg.microbatches, args.schedule) == ("torch", "zbv", 4, "zbv")
    args = parser.parse_args(["--mode", "pipedream", "--runtime", "torch", "--model", "vgg16"])
    with pytest.raises(PipeDreamError, match="--runtime torch runs torch's schedules, not --schedule 1f1b"):
        _config(args, None)
    args = parser.parse_args(["--mode", "dp", "--runtime", "torch", "--model", "vgg16"])
    assert _config(args, None).runtime == "pipedream"
