"""The benchmarks' command lines and summaries (benchmarks/*/main.py), against hand computations; the benchmarks'
measurements themselves are never asserted (speed is not a test)."""

from __future__ import annotations

import importlib.util
import math
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = sorted(p.parent.name for p in (ROOT / "benchmarks").glob("*/main.py"))


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", ROOT / "benchmarks" / name / "main.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_benchmark_explains_itself(name: str) -> None:
    """``--help`` exits 0 and prints the usage (argparse formats every help string: a bare ``%`` breaks it)."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / name / "main.py"), "--help"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("usage:")


def test_the_benchmarks_are_found() -> None:
    """Nine benchmarks, each a main.py beside a README.md that says what it compares and how to rerun it."""
    assert BENCHMARKS == ["checkpoint", "cores", "launch", "memory", "partitioners", "planner", "runtime", "simulator",
                          "torch_runtime"]
    folders = sorted(p.name for p in (ROOT / "benchmarks").iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders == BENCHMARKS
    for name in BENCHMARKS:
        assert (ROOT / "benchmarks" / name / "README.md").is_file(), name


def test_the_cores_and_launch_readmes_are_short_and_state_no_history() -> None:
    """The cores README at most 60 lines, the launch README at most 30; neither names a date or a session."""
    for name, limit in (("cores", 60), ("launch", 30)):
        text = (ROOT / "benchmarks" / name / "README.md").read_text()
        assert len(text.splitlines()) <= limit, name
        assert not re.search(r"20\d\d-\d\d-\d\d|[Ss]ession \d", text), name


def test_the_device_kit_carries_jemalloc_for_the_workers(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``device_kit.py`` packs this machine's jemalloc into ``lib/`` (``device_run.sh`` hands it to the workers
    through ``PIPEDREAM_JEMALLOC``); without one, one warning line and no ``lib/``."""
    spec = importlib.util.spec_from_file_location("device_kit", ROOT / "benchmarks" / "cores" / "device_kit.py")
    assert spec is not None and spec.loader is not None
    kit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kit)
    library = tmp_path / "libjemalloc.so.2"
    library.write_bytes(b"\x7fELF jemalloc")
    packed = kit.pack_jemalloc(tmp_path / "kit", str(library))
    assert packed == tmp_path / "kit" / "lib" / "libjemalloc.so.2" and packed.read_bytes() == b"\x7fELF jemalloc"
    assert kit.pack_jemalloc(tmp_path / "bare", None) is None and not (tmp_path / "bare").exists()
    assert capsys.readouterr().err.startswith("warning: no libjemalloc.so.2 here")
    script = (ROOT / "benchmarks" / "cores" / "device_run.sh").read_text()
    assert 'jemalloc="$KIT/lib/libjemalloc.so.2"' in script and 'export PIPEDREAM_JEMALLOC="$jemalloc"' in script


def test_cores_takes_one_cpu_per_physical_core_among_the_allowed() -> None:
    """Two sockets of two cores with two hyperthreads each (CPUs 0-3 first threads, 4-7 their siblings), CPU 1
    not allowed: core (1, 0) is then reached through its sibling 5, after 0, 2, 3 in CPU order."""
    cores = load("cores")
    lscpu = "# CPU,Core,Socket\n0,0,0\n1,1,0\n2,2,1\n3,3,1\n4,0,0\n5,1,0\n6,2,1\n7,3,1\n"
    assert cores.physical_cpus(lscpu, set(range(8))) == [0, 1, 2, 3]
    assert cores.physical_cpus(lscpu, {0, 2, 3, 4, 5, 6, 7}) == [0, 2, 3, 5]
    assert cores.physical_cpus("0,,\n1,,\n", {0, 1}) == [0]  # empty fields: one core
    assert cores.physical_cpus("", {0}) == []


def test_cores_builds_the_workflows_commands_without_a_host_probe() -> None:
    """The profile on the CPU timing only the runs' optimizer (TrainConfig's default, sgd, where unset); the plan
    charging that optimizer; the trainings with the config's train flags, top-level data (unless the model sets
    its own), emulated link and the workflow's run limit (epochs x 1800 + 600 s), in make run's layout."""
    cores = load("cores")
    cfg = {"workers": 4, "cluster": "c4", "clusters_file": "clusters.yaml", "emulate_bandwidth_Bps": 1.25e8,
           "data": "synthetic", "profile": {"batch_size": 32, "warmup": 2, "iters": 10},
           "models": {"vgg16": {"preset": "reduced", "train": {"epochs": 3, "optimizer": "adam"}},
                      "alexnet": {"preset": "reduced", "train": {"epochs": 1, "data": "real"}}}}
    cmds = dict(cores.commands(cfg, "vgg16", Path("/w")))
    assert list(cmds) == ["profile", "plan", "dp", "pipedream"]
    assert cmds["profile"] == ("profile --model vgg16 --preset reduced --profiled-batch 32 --warmup 2 --iters 10 "
                               "--device cpu --optimizers adam --out-dir /w/profiles/vgg16")
    assert cmds["plan"] == ("plan --profile /w/profiles/vgg16/graph.txt --clusters clusters.yaml --cluster c4 "
                            "--model vgg16 --optimizer adam --out /w/plans/vgg16.json")
    assert cmds["dp"] == ("train --mode dp --model vgg16 --preset reduced --plan /w/plans/vgg16.json "
                          "--profile /w/profiles/vgg16/graph.txt --clusters clusters.yaml --workers 4 "
                          "--epochs 3 --optimizer adam --data synthetic --emulate-bandwidth-Bps 125000000.0 "
                          "--timeout-s 6000 --experiment cores/vgg16 --no-progress --out-dir /w/runs/vgg16/dp")
    assert cmds["pipedream"] == cmds["dp"].replace("--mode dp", "--mode pipedream").replace("/dp", "/pipedream")
    alexnet = dict(cores.commands(cfg, "alexnet", Path("/w")))
    assert "--optimizers sgd " in alexnet["profile"] and "--optimizer sgd " in alexnet["plan"]
    assert " --epochs 1 --data real --emulate-bandwidth-Bps 125000000.0 --timeout-s 2400 " in alexnet["dp"]
    assert "--data synthetic" not in alexnet["dp"]
    for line in (*cmds.values(), *alexnet.values()):
        assert "host" not in line and "probe" not in line and "--threshold" not in line
    again = dict(cores.commands(cfg, "vgg16", Path("/w"), cores.repeat_dir(Path("/w"), 2)))
    assert again["dp"].endswith("--out-dir /w/repeat2/runs/vgg16/dp")  # a repeat trains on the same profile and plan
    assert "--plan /w/plans/vgg16.json --profile /w/profiles/vgg16/graph.txt " in again["dp"]
    assert cores.repeat_dir(Path("/w"), 1) == Path("/w")


def test_cores_reuses_an_earlier_runs_profiles_and_plans(tmp_path: Path) -> None:
    """``--reuse``: each model's profile folder and plan copied into OUT; a model without them is refused by name."""
    cores = load("cores")
    src, out = tmp_path / "first", tmp_path / "second"
    (src / "profiles" / "vgg16").mkdir(parents=True)
    (src / "profiles" / "vgg16" / "graph.txt").write_text("g")
    (src / "profiles" / "vgg16" / "meta.json").write_text("{}")
    (src / "plans").mkdir()
    (src / "plans" / "vgg16.json").write_text("{}")
    cores.reuse(src, out, ["vgg16"])
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "plans/vgg16.json", "profiles/vgg16/graph.txt", "profiles/vgg16/meta.json"]
    cores.reuse(src, src, ["vgg16"])  # the same folder: nothing to copy
    with pytest.raises(ValueError, match="alexnet/graph.txt.*alexnet.json"):
        cores.reuse(src, out, ["vgg16", "alexnet"])


def test_cores_repeat_noise_by_hand() -> None:
    """Epochs of one run 10, 12 and 9 s: pairs |10/12 - 1| = 1/6, |10/9 - 1| = 1/9, |12/9 - 1| = 1/3; another run
    4 and 4 s: 0; a failed repeat (NaN) and a run without a pair add none. Median of (1/6, 1/9, 1/3, 0): (1/9 +
    1/6) / 2 = 0.1389."""
    cores = load("cores")
    epochs = {("a", "dp"): [10.0, 12.0, 9.0], ("b", "dp"): [4.0, math.nan, 4.0], ("c", "dp"): [3.0]}
    assert cores.repeat_noise(epochs) == pytest.approx((1 / 9 + 1 / 6) / 2)
    assert cores.repeat_noise({("c", "dp"): [3.0, math.nan]}) is None
    assert cores.repeat_noise({}) is None


def test_cores_table_by_hand() -> None:
    """Ratios 1.05, 0.8 and 0.92 (and a run without a prediction, left out): |ratio - 1| 0.05, 0.2, 0.08, so 2 of
    3 within 10%, median 8.0%."""
    import pandas as pd

    cores = load("cores")
    df = pd.DataFrame([("vgg16", "dp", "4", 10.5, 10.0, 1.05), ("vgg16", "pipedream", "straight", 8.0, 10.0, 0.8),
                       ("alexnet", "dp", "4", 1.84, 2.0, 0.92), ("alexnet", "pipedream", "2-2", 3.0, math.nan, math.nan)],
                      columns=["model", "mode", "config", "measured_epoch_s", "predicted_epoch_s", "ratio"])
    lines = cores.table(df).splitlines()
    assert lines[0].split() == ["model", "mode", "config", "measured", "s", "predicted", "s", "ratio"]
    assert lines[1].split() == ["vgg16", "dp", "4", "10.50", "10.00", "1.050"]
    assert lines[2].split() == ["vgg16", "pipedream", "straight", "8.00", "10.00", "0.800"]
    assert lines[3].split() == ["alexnet", "dp", "4", "1.84", "2.00", "0.920"]
    assert lines[4].split() == ["alexnet", "pipedream", "2-2", "3.00", "nan", "nan"]
    assert lines[5] == "2 of 3 within 10%, median |ratio - 1| 8.0%"


def test_cores_resizes_the_configs_cluster_for_fewer_workers(tmp_path: Path) -> None:
    """``--workers 2`` on experiments/ci.yaml: the cluster cpu4_1gbps's one level at 2 workers, same bandwidth and
    memory, beside the other clusters in OUT/clusters.yaml, which the plan reads (topology's loader); the config's
    own 4 workers leave it as it is; a cluster of several levels and a single worker are refused."""
    import yaml

    from pipedream.topology import get_cluster

    cores = load("cores")
    cfg = yaml.safe_load((ROOT / "experiments" / "ci.yaml").read_text())
    resized = cores.with_workers(cfg, 2, tmp_path)
    assert (resized["workers"], resized["cluster"]) == (2, "cpu4_1gbps_w2")
    assert resized["clusters_file"] == str(tmp_path / "clusters.yaml") and cfg["workers"] == 4
    cluster = get_cluster("cpu4_1gbps_w2", resized["clusters_file"])
    assert cluster.levels == [(2, 1.25e8)] and cluster.device_memory_bytes == 8589934592
    assert get_cluster("A_4x4", resized["clusters_file"]).workers == 16
    assert cores.with_workers(cfg, 4, tmp_path / "same") is cfg and not (tmp_path / "same").exists()
    with pytest.raises(ValueError, match="levels"):
        cores.with_workers({**cfg, "cluster": "A_4x4"}, 2, tmp_path)
    with pytest.raises(ValueError, match="at least 2"):
        cores.with_workers(cfg, 1, tmp_path)


def test_the_device_script_runs_the_gpu_tests_then_cores_at_4_workers() -> None:
    """device_run.sh: tests/test_gpu.py only where nvidia-smi finds a GPU, then benchmarks/cores with 4 workers a
    run; no other benchmark."""
    script = (ROOT / "benchmarks" / "cores" / "device_run.sh").read_text()
    gpu = script.index("pytest -q -p no:cacheprovider tests/test_gpu.py")
    cores = script.index("benchmarks/cores/main.py --workers 4")
    assert script.index("if nvidia-smi -L") < gpu < cores
    assert set(re.findall(r"benchmarks/\w+/main\.py", script)) == {"benchmarks/cores/main.py"}
    subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "cores" / "device_run.sh")], check=True)


def test_device_kit_slims_fairseq_to_what_gnmt_loads(tmp_path: Path) -> None:
    """The kit's fairseq wheel loses its C++ extensions (built against another torch) and its examples, and keeps
    every other entry byte for byte."""
    import zipfile

    spec = importlib.util.spec_from_file_location("device_kit", ROOT / "benchmarks" / "cores" / "device_kit.py")
    assert spec is not None and spec.loader is not None
    kit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kit)
    wheel = tmp_path / "fairseq_fixed-0.12.3.1-cp312-cp312-manylinux_2_28_x86_64.whl"
    entries = {"fairseq/models/lstm.py": b"lstm", "fairseq/libnat.cpython-312-x86_64-linux-gnu.so": b"so",
               "fairseq/libbase.cpython-312-x86_64-linux-gnu.so": b"so", "fairseq/examples/hubert/x.npy": b"x",
               "alignment_train_cpu_binding.cpython-312-x86_64-linux-gnu.so": b"so",
               "fairseq/data/data_utils_fast.cpython-312-x86_64-linux-gnu.so": b"kept",
               "fairseq_fixed-0.12.3.1.dist-info/METADATA": b"meta"}
    with zipfile.ZipFile(wheel, "w") as z:
        for name, data in entries.items():
            z.writestr(name, data)
    slim = kit.slim_fairseq(wheel, tmp_path / "slim.zip")
    with zipfile.ZipFile(slim) as z:
        kept = {n: z.read(n) for n in z.namelist()}
    assert kept == {"fairseq/models/lstm.py": b"lstm",
                    "fairseq/data/data_utils_fast.cpython-312-x86_64-linux-gnu.so": b"kept",
                    "fairseq_fixed-0.12.3.1.dist-info/METADATA": b"meta"}
