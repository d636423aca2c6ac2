"""The Snakemake workflow: dry runs of both configs, and one real tiny run end to end with MLflow."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")


def _snakemake(*args: str, cwd: Path = REPO, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SNAKEMAKE, "-s", str(REPO / "Snakefile"), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def _dry_run(cfg: dict, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Snakemake's dry run of ``cfg`` (a config as read from experiments/) with its results under ``tmp_path``,
    where nothing exists, so every job is planned."""
    cfg["results_dir"] = str(tmp_path / "results")
    for key in ("clusters_file", "paper_table"):
        cfg[key] = str(REPO / cfg[key])
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    return _snakemake("--dry-run", "--printshellcmds", "--cores", "2", "--configfile", str(tmp_path / "c.yaml"),
                      "--directory", str(REPO))


def _job_counts(out: str) -> dict[str, int]:
    """Rule -> job count from the 'Job stats' table of a dry run."""
    lines = out.split("Job stats:")[1].splitlines()[3:]
    counts = {}
    for line in lines:
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            break
        counts[parts[0]] = int(parts[1])
    return counts


@pytest.mark.parametrize("config, models, trains", [("experiments/ci.yaml", None, None),
                                                     ("experiments/table1.yaml", 7, 14)])
def test_dry_run(config: str, models: int | None, trains: int | None, tmp_path: Path) -> None:
    cfg = yaml.safe_load((REPO / config).read_text())
    proc = _dry_run(cfg, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    counts = _job_counts(proc.stdout)
    n = len(cfg["models"])
    assert counts["profile"] == n and counts["plan"] == n and counts["train"] == 2 * n
    assert counts["speedup"] == n and counts["predicted"] == 1 and counts["report"] == 1 and counts["all"] == 1
    if models is not None:
        assert (n, counts["train"]) == (models, trains)


@pytest.mark.parametrize("models, expected", [(None, None), (["resnet50", "vgg16"], ["resnet50", "vgg16"]),
                                             (["vgg16", "mine"], ["vgg16"]), (["mine"], None)])
def test_the_predicted_table_covers_the_configs_models(models: list[str] | None, expected: list[str] | None,
                                                      tmp_path: Path) -> None:
    """``report --predicted`` gets ``--models`` with the config's models that the paper's table has, and none (every
    row, and the H100 what-if) when the config has all seven (experiments/ci.yaml) or none of them."""
    cfg = yaml.safe_load((REPO / "experiments" / "ci.yaml").read_text())
    if models is not None:
        mine = {"preset": "reduced", "train": {"epochs": 1, "batch_size": 8, "lr": 0.1}}  # a user's model
        cfg["models"] = {m: cfg["models"].get(m, mine) for m in models}
    proc = _dry_run(cfg, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    [command] = [line.split() for line in proc.stdout.splitlines() if "--predicted" in line.split()]
    given = command[command.index("--models") + 1:command.index(">")] if "--models" in command else None
    assert given == expected


def test_a_model_on_torchs_runtime_is_planned_and_trained_for_it(tmp_path: Path) -> None:
    """``train: {runtime: torch}``: the plan rule plans torch's schedules at the run's minibatch and the PipeDream run
    trains on torch's runtime; the other model and the DP runs are as before."""
    cfg = yaml.safe_load((REPO / "experiments" / "ci.yaml").read_text())
    cfg["models"] = {m: cfg["models"][m] for m in ("vgg16", "resnet50")}
    cfg["models"]["vgg16"]["train"]["runtime"] = "torch"
    proc = _dry_run(cfg, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line for line in proc.stdout.splitlines() if "pipedream.cli " in line]
    plans = {m: line for line in lines for m in ("vgg16", "resnet50") if " plan " in line and f"--model {m} " in line}
    assert "--runtime torch --batch-size 32" in plans["vgg16"] and "--runtime" not in plans["resnet50"]
    trains = [line for line in lines if " train " in line and "--mode pipedream" in line]
    assert [("--runtime torch" in line) for line in sorted(trains)] == [False, True]  # resnet50's, then vgg16's


@pytest.mark.parametrize("config", ["experiments/ci.yaml", "experiments/2bw.yaml"])
def test_profiles_time_only_the_optimizers_their_runs_train_with(config: str, tmp_path: Path) -> None:
    """Each profile times the optimizer step of its model's runs (train.optimizer, sgd where unset) and of the
    2BW loss check (muon) for the 2BW model, no other: Muon's step takes seconds on a CPU."""
    cfg = yaml.safe_load((REPO / config).read_text())
    proc = _dry_run(cfg, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    timed = {}
    for line in proc.stdout.splitlines():
        words = line.split()
        if "profile" in words and "--optimizers" in words:
            rest = words[words.index("--optimizers") + 1:]
            timed[words[words.index("--model") + 1]] = rest[:next(i for i, w in enumerate(rest) if w.startswith("--"))]
    expected = {m: [c.get("train", {}).get("optimizer", "sgd")] for m, c in cfg["models"].items()}
    if "twobw" in cfg:
        expected[cfg["twobw"]["model"]].append(cfg["twobw"]["loss_check"]["optimizer"])
    assert timed == expected
    if config.endswith("ci.yaml"):  # hand-checked against experiments/ci.yaml
        assert timed["resnet50"] == ["sgd"] and timed["vgg16"] == ["adam"]
    else:  # experiments/2bw.yaml: the GPT trains with Adam, and its loss check with Muon
        assert timed == {"gpt": ["adam", "muon"]}


CLUSTER = "cpu2_1gbps"


@pytest.mark.slow
@pytest.mark.first
def test_tiny_run_end_to_end_and_no_duplicate_runs(tmp_path: Path) -> None:
    (tmp_path / "experiments").symlink_to(REPO / "experiments")  # a user runs from a checkout
    cfg = yaml.safe_load((REPO / "experiments" / "ci.yaml").read_text())
    cfg["results_dir"] = "results"
    clusters = yaml.safe_load((REPO / "experiments" / "clusters.yaml").read_text())
    two = clusters["clusters"]["cpu4_1gbps"]  # ci.yaml's cluster with 2 workers: half the processes to start
    clusters["clusters"][CLUSTER] = {**two, "levels": [{**two["levels"][0], "workers": 2}]}
    (tmp_path / "clusters.yaml").write_text(yaml.safe_dump(clusters))
    cfg.update(cluster=CLUSTER, clusters_file="clusters.yaml", workers=2)
    cfg["profile"].update(warmup=0, iters=1)
    cfg["models"] = {"vgg16": {"preset": "reduced", "train": {
        "epochs": 1, "batch_size": 16, "lr": 0.01, "train_subset": 256, "val_subset": 64, "max_minibatches": 8}}}
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(cfg))
    proc = _snakemake("--cores", "2", "--configfile", str(config), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = tmp_path / "results"
    for rel in ("profiles/vgg16/graph.txt", f"plans/vgg16/{CLUSTER}.json", "runs/vgg16/pipedream/run.json",
                "runs/vgg16/dp/run.json", "speedup/vgg16.json", "table1.md", "table1.csv", "report.html",
                "table1_predicted.md", "plots/vgg16_accuracy_vs_time.png", "plots/table1_speedups.png"):
        assert (res / rel).is_file(), rel
    assert sum(1 for _ in (res / "logs").rglob("*.log")) == 7  # one log per job (all has none)
    with (res / "table1_predicted.csv").open(newline="") as f:
        predicted_models = {row["model"] for row in csv.DictReader(f)}
    assert predicted_models == {"vgg16"}  # the config's one model: its rows, planned and simulated at paper scale
    for mode in ("pipedream", "dp"):  # each run says how long before its launch its profile ended
        run = json.loads((res / f"runs/vgg16/{mode}/run.json").read_text())
        assert 0 < run["profile_age_s"] < 900
        # ... and has each stage's measured compute and wait beside the predicted ones
        stages = len(json.loads((res / f"plans/vgg16/{CLUSTER}.json").read_text())["stages"])
        for k in range(1 if mode == "dp" else stages):
            assert run[f"predicted_compute_s_stage{k}"] > 0 and run[f"measured_compute_s_stage{k}"] > 0
            assert run[f"predicted_wait_s_stage{k}"] >= 0 and run[f"wait_s_stage{k}"] >= 0

    again = _snakemake("--cores", "2", "--configfile", str(config), "--dry-run", cwd=tmp_path)
    assert "Nothing to be done" in again.stdout + again.stderr

    forced = _snakemake("--cores", "2", "--configfile", str(config), "--forcerun", "results/runs/vgg16/dp/run.json",
                        "--until", "speedup", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr[-3000:]
    check = subprocess.run(
        [sys.executable, "-c", "from pipedream.tracking import load_runs, _mlflow; "
         f"runs = load_runs('vgg16/{CLUSTER}'); print(sorted(r['run_name'] for r in runs)); "
         "c = _mlflow().MlflowClient(); pd = [r for r in runs if r['run_name'] == 'pipedream'][0]; "
         "print(sorted(a.path for a in c.list_artifacts(pd['run_id']))); "
         "dp = [r for r in runs if r['run_name'] == 'dp'][0]; "
         "print(sorted(a.path for a in c.list_artifacts(dp['run_id'])), sorted(dp['params']), "
         "dp['tags']['cluster'] == pd['tags']['cluster'])"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    names, artifacts, dp_run = check.stdout.strip().splitlines()[-3:]
    assert names == "['dp', 'pipedream']", check.stderr[-2000:]
    for artifact in (f"{CLUSTER}.json", "graph.txt", "metrics.json", "vgg16_accuracy_vs_time.png"):
        assert artifact in artifacts
    # DP carries no PipeDream-only artifacts or params, and the same cluster tag as PipeDream
    assert "metrics.json" in dp_run and f"{CLUSTER}.json" not in dp_run and "graph.txt" not in dp_run
    assert "'schedule'" not in dp_run and "'weight_sync'" not in dp_run and dp_run.endswith("True")


def test_a_models_plan_and_runs_go_before_the_next_profile() -> None:
    """Depth first (workflows/rules/common.smk, PRIORITY): among ready jobs snakemake prefers the higher
    priority, so a model trains right after its own profile, not after every model's profile."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings, StorageSettings

    with SnakemakeApi(OutputSettings(quiet=True)) as api:
        wf = api.workflow(resource_settings=ResourceSettings(cores=2),
                          config_settings=ConfigSettings(configfiles=[REPO / "experiments" / "ci.yaml"]),
                          storage_settings=StorageSettings(), snakefile=REPO / "Snakefile", workdir=REPO)
        priority = {r.name: r.priority for r in wf._workflow.rules}
    assert priority["train"] > priority["plan"] > priority["profile"]
    assert priority["train_2bw"] > priority["plan_2bw"] > priority["profile"]
