"""The benchmarks' command lines and the drift benchmark's statistics (benchmarks/*/main.py), against hand
computations; the benchmarks' measurements themselves are never asserted (speed is not a test)."""

from __future__ import annotations

import importlib.util
import math
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
    assert {"allreduce", "cores", "ddp", "drift", "host", "launch", "layout", "memory", "planner", "repeat",
            "runtime", "simulator", "step"} <= set(BENCHMARKS)


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


def test_cores_gives_the_longest_model_to_the_least_loaded_group() -> None:
    """SECONDS: gnmt16 270, awd_lm 245, gnmt8 215, resnet50 154, s2vt 147, vgg16 132, alexnet 109. Four groups:
    the first four one each; s2vt to resnet50's (154, the least), vgg16 to gnmt8's (215 < 245, 270, 301), alexnet
    to awd_lm's (245 < 270, 301, 347). An unknown model counts the median, 154."""
    cores = load("cores")
    models = ["vgg16", "resnet50", "alexnet", "gnmt8", "gnmt16", "awd_lm", "s2vt"]
    assert cores.assign(models, 4) == [["gnmt16"], ["awd_lm", "alexnet"], ["gnmt8", "vgg16"], ["resnet50", "s2vt"]]
    # two groups: gnmt16 270 -> 0; awd_lm -> 1 (245); gnmt8 -> 1 (245 < 270: 460); resnet50 -> 0 (424);
    # s2vt -> 0 (424 < 460: 571); vgg16 -> 1 (460 < 571: 592); alexnet -> 0 (571 < 592: 680)
    assert cores.assign(models, 2) == [["gnmt16", "resnet50", "s2vt", "alexnet"], ["awd_lm", "gnmt8", "vgg16"]]
    assert cores.assign(["mystery"], 2) == [["mystery"], []]


def test_cores_runs_the_workflows_commands() -> None:
    """The profile times only the optimizer the runs use (TrainConfig's default where unset), the trainings get
    the config's train flags and emulated link; a config without host_seconds gets no --host-seconds, and
    --host-seconds replaces the config's."""
    cores = load("cores")
    cfg = {"workers": 4, "cluster": "c4", "emulate_bandwidth_Bps": 1.25e8,
           "profile": {"batch_size": 32, "warmup": 2, "iters": 10},
           "models": {"vgg16": {"preset": "reduced", "train": {"epochs": 3, "optimizer": "adam"}},
                      "alexnet": {"preset": "reduced", "train": {"epochs": 1}}}}
    cmds = dict(cores.commands(cfg, "vgg16", Path("/w"), "clusters.yaml"))
    assert list(cmds) == ["profile", "plan", "dp", "pipedream"]
    assert cmds["profile"] == ("profile --model vgg16 --preset reduced --profiled-batch 32 --warmup 2 --iters 10 "
                               "--device cpu --no-host-oversubscribed --optimizers adam --out-dir /w/profiles/vgg16")
    assert cmds["plan"] == ("plan --profile /w/profiles/vgg16/graph.txt --clusters clusters.yaml --cluster c4 "
                            "--model vgg16 --out /w/plans/vgg16.json")
    assert cmds["dp"].startswith("train --mode dp --model vgg16 --preset reduced --plan /w/plans/vgg16.json "
                                 "--profile /w/profiles/vgg16/graph.txt --clusters clusters.yaml --workers 4 ")
    assert "--epochs 3" in cmds["dp"] and "--optimizer adam" in cmds["dp"]
    assert "--emulate-bandwidth-Bps 125000000.0 " in cmds["pipedream"]
    assert cmds["pipedream"].endswith("--out-dir /w/runs/vgg16/pipedream")  # make run's layout: the report reads it
    cfg["profile"]["host_seconds"] = 6
    alexnet = dict(cores.commands(cfg, "alexnet", Path("/w"), "c.yaml"))["profile"]
    assert "--host-seconds 6 --no-host-oversubscribed --optimizers sgd " in alexnet
    assert cores.profile_command(cfg, "alexnet", Path("/p")) == (  # benchmarks/probe/repeat.py's: two copies a core too
        "profile --model alexnet --preset reduced --profiled-batch 32 --warmup 2 --iters 10 --device cpu "
        "--host-seconds 6 --optimizers sgd --out-dir /p")
    short = cores.with_host_seconds(cfg, 3)  # --host-seconds: a shorter probe, the config left as it was
    alexnet = dict(cores.commands(short, "alexnet", Path("/w"), "c.yaml"))["profile"]
    assert "--host-seconds 3 --no-host-oversubscribed --optimizers sgd " in alexnet
    assert cfg["profile"]["host_seconds"] == 6
    again = dict(cores.commands(cfg, "vgg16", Path("/w"), "clusters.yaml", cores.repeat_dir(Path("/w"), 2)))
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


def test_stages_finds_both_layouts_plans_and_the_pipeline_runs_compute_ratios(tmp_path: Path) -> None:
    """``plans/<model>.json`` (benchmarks/cores) or the one file of ``plans/<model>/`` (make run), none when there
    are several; ``compute_check.csv``'s pipeline rows of the model, per stage: the compute ratio times the stage
    factor the prediction took (1 where the row has none)."""
    stages = load("stages")
    (tmp_path / "plans" / "vgg16").mkdir(parents=True)
    (tmp_path / "plans" / "vgg16" / "cpu4_1gbps.json").write_text("{}")
    (tmp_path / "plans" / "alexnet.json").write_text("{}")
    assert stages.plan_file(tmp_path, "vgg16") == tmp_path / "plans" / "vgg16" / "cpu4_1gbps.json"
    assert stages.plan_file(tmp_path, "alexnet") == tmp_path / "plans" / "alexnet.json"
    (tmp_path / "plans" / "vgg16" / "other.json").write_text("{}")
    assert stages.plan_file(tmp_path, "vgg16") is None and stages.plan_file(tmp_path, "gnmt8") is None
    assert stages.run_ratios(tmp_path, "vgg16") == {}
    (tmp_path / "compute_check.csv").write_text(
        "model,mode,stage,compute_cpu_ratio,stage_factor\nvgg16,dp,0,1.5,\nvgg16,pipedream,0,1.25,0.8\n"
        "vgg16,pipedream,1,0.75,\nalexnet,pipedream,0,2.0,1.0\n")
    assert stages.run_ratios(tmp_path, "vgg16") == {0: 1.0, 1: 0.75}


def test_cores_self_agreement_by_hand() -> None:
    """Epochs of one run 10, 12 and 9 s: pairs |10/12 - 1| = 1/6, |10/9 - 1| = 1/9, |12/9 - 1| = 1/3; another run
    4 and 4 s: 0; a failed run (no epoch) and a run without a pair add none. Median of (1/6, 1/9, 1/3, 0): (1/9 +
    1/6) / 2."""
    cores = load("cores")

    def r(model: str, mode: str, epoch: float | str) -> list[object]:
        return [model, mode, "0,1", "straight", epoch, 1.0, 1.0, 1.0, "1.0", 1]

    rows = [r("a", "dp", 10.0), r("a", "dp", 12.0), r("a", "dp", 9.0), r("b", "dp", 4.0), r("b", "dp", 4.0),
            r("b", "pipedream", ""), r("c", "dp", 3.0)]
    assert cores.self_agreement(rows) == pytest.approx((1 / 9 + 1 / 6) / 2)
    assert cores.self_agreement([r("c", "dp", 3.0)]) is None


def test_cores_resizes_the_configs_cluster_for_fewer_workers(tmp_path: Path) -> None:
    """``--workers 2`` on experiments/ci.yaml: the cluster cpu4_1gbps's one level at 2 workers, same bandwidth and
    memory, beside the other clusters in OUT/clusters.yaml, which the plan reads (topology's loader); a cluster of
    several levels and a single worker are refused."""
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
    with pytest.raises(ValueError, match="levels"):
        cores.with_workers({**cfg, "cluster": "A_4x4"}, 2, tmp_path)
    with pytest.raises(ValueError, match="at least 2"):
        cores.with_workers(cfg, 1, tmp_path)


def test_allreduce_prints_the_simulators_estimate_from_the_profiles_message_cost(tmp_path: Path) -> None:
    """4 members, 4 MB, a message end of 100 us + 1 ns/byte: 12 ends of 1 MB, 12 x 1.1 ms = 13.2 ms; a profile
    without the host's message cost, or of a host with other cores (what a prediction reads), has no estimate."""
    allreduce = load("allreduce")
    (tmp_path / "meta.json").write_text('{"host": {"cores": 2, "message_s": 1e-4, "message_s_per_byte": 1e-9}}')
    assert allreduce.profile_estimate_s(tmp_path, 4, 4e6, 2) == pytest.approx(0.0132)
    assert allreduce.profile_estimate_s(tmp_path, 4, 4e6, 16) is None
    (tmp_path / "meta.json").write_text('{"host": {"cores": 2}}')
    assert allreduce.profile_estimate_s(tmp_path, 4, 4e6, 2) is None
    # a profile that measured the allreduce (over 4: 2 ms + 0.5 ns/byte) is charged that: 2 + 2 ms
    (tmp_path / "meta.json").write_text('{"host": {"cores": 2, "message_s": 1e-4, "message_s_per_byte": 1e-9, '
                                        '"allreduce_s": {"4": [2e-3, 5e-10]}}}')
    assert allreduce.profile_estimate_s(tmp_path, 4, 4e6, 2) == pytest.approx(0.004)


def test_drift_window_means_slide_by_a_quarter_window() -> None:
    """Steps ending at 0.5, 1.5, ..., 7.5 s costing 1, 2, ..., 8 s; windows of 4 s from 0 to 8 s slide by 1 s:
    [0, 4) holds 1..4 (mean 2.5), [1, 5) 2..5 (3.5), ..., [4, 8) 5..8 (6.5)."""
    drift = load("drift")
    series = [(i + 0.5, float(i + 1)) for i in range(8)]
    assert drift.window_means(series, 4.0, 0.0, 8.0) == pytest.approx([2.5, 3.5, 4.5, 5.5, 6.5])
    assert drift.window_means(series, 4.0, 0.0, 3.9) == []  # no whole window


def test_drift_floor_and_correlation_by_hand() -> None:
    drift = load("drift")
    median, one, every = drift.floor(0.1, 14)
    assert median == pytest.approx(0.06745)
    assert one == pytest.approx(math.erf(1.5 / math.sqrt(2)))  # |z| <= 1.5: 0.8664
    assert every == pytest.approx(one ** 14)
    assert drift.cv([1.0, 3.0]) == pytest.approx(0.5)  # population sd 1 over mean 2
    assert math.isnan(drift.cv([2.0]))
    assert drift.correlation([1.0, 2.0, 3.0], [2.0, 4.0, 7.0]) == pytest.approx(0.9933, abs=1e-4)
    assert drift.correlation([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]) == pytest.approx(-1.0)
    assert math.isnan(drift.correlation([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))


def test_drift_probe_corrects_each_window_by_the_probe_before_it() -> None:
    """Copy 0 steps 1..6 s of CPU, copy 1 2, 2, 4, 4, 2, 2 (mean 8/3), ending at 0.5, 1.5, ... s. Windows of 2 s
    after a 1 s probe and a 1 s gap, sliding by 1 s up to 6 s: t = 0, 1, 2. t = 0: window [2, 4) holds 3 and 4
    (3.5), copy 0's probe [0, 1) holds 1 (3.5 / 1), copy 1's holds 2, 0.75 of its mean (3.5 / 0.75); t = 1:
    4.5, probes 2 and 0.75; t = 2: 5.5, probes 3 and 4 / (8/3) = 1.5."""
    drift = load("drift")
    copy0 = [(k + 0.5, float(k + 1)) for k in range(6)]
    copy1 = [(k + 0.5, v) for k, v in enumerate([2.0, 2.0, 4.0, 4.0, 2.0, 2.0])]
    raw, own, others = drift.probe_corrected([copy0, copy1], 0, 2.0, 1.0, 1.0, 0.0, 6.0)
    assert raw == pytest.approx([3.5, 4.5, 5.5])
    assert own == pytest.approx([3.5, 2.25, 5.5 / 3])
    assert others == pytest.approx([3.5 / 0.75, 6.0, 5.5 / 1.5])
    assert drift.probe_corrected([copy0], 0, 2.0, 1.0, 1.0, 0.0, 6.0)[2] == []  # no other copy


def test_repeat_takes_the_workflows_train_command_without_threshold_or_log() -> None:
    repeat = load("repeat")
    line = ("/v/python3 -m pipedream.cli train --mode pipedream --model gnmt8 --workers 4 --epochs 2 --timeout-s 4200 "
            "--threshold 11.5 --threshold-metric token_accuracy --no-progress --out-dir "
            "$(dirname results/runs/gnmt8/pipedream/run.json) > results/logs/train/gnmt8_pipedream.log 2>&1")
    assert repeat.repeat_argv(line, Path("/o/1")) == [
        "/v/python3", "-m", "pipedream.cli", "train", "--mode", "pipedream", "--model", "gnmt8", "--workers", "4",
        "--epochs", "2", "--timeout-s", "4200", "--no-progress", "--out-dir", "/o/1"]


def test_repeat_summary_by_hand() -> None:
    """Two runs predicted at 10 s. vgg16 dp measured 10 and 12 s (ratios 1.0, 1.2), alexnet dp 8 and 10.5 s
    (0.8, 1.05). Repeat 0: |errors| 0 and 0.2, one within 15% and 10%, median 10%; repeat 1: 0.2 and 0.05, one,
    median 12.5%. Pairs: 12/10 - 1 = 0.2, 1 - 10/12 = 0.1667, 10.5/8 - 1 = 0.3125, 1 - 8/10.5 = 0.2381: median
    (0.2 + 0.2381) / 2 = 0.219, none within 15%."""
    repeat = load("repeat")
    rows = [["vgg16", "dp", "4", 0, 10.0, 10.0, 1.0, 11, ""], ["alexnet", "dp", "4", 0, 8.0, 10.0, 0.8, 9, ""],
            ["vgg16", "dp", "4", 1, 12.0, 10.0, 1.2, 13, "40"], ["alexnet", "dp", "4", 1, 10.5, 10.0, 1.05, 12, "30"]]
    assert [round(e, 4) for e in repeat.pair_errors([10.0, 12.0])] == [0.1667, 0.2]  # 10 / 12, 12 / 10
    text = repeat.report(rows).splitlines()
    assert text[0].startswith("vgg16     dp        4         predicted  10.00 s; measured 10.00 (1.00), 12.00 (1.20)")
    assert text[0].endswith("cv 0.091")  # sd 1 over mean 11
    assert text[2] == "repeat 0: 2 runs, 1 within 15%, 1 within 10%, median |ratio - 1| 10.0%"
    assert text[3] == "repeat 1: 2 runs, 1 within 15%, 1 within 10%, median |ratio - 1| 12.5%"
    assert text[4] == ("repeat against repeat of the same run (4 ordered pairs): median |a / b - 1| 21.9%, "
                       "0% within 15%")


def test_layout_summary_by_hand() -> None:
    """Long-lived windows 1, 3 (cv: sd 1 over mean 2, 0.5); fresh 2, 2 (cv 0); paired ratios 2 and 2/3 (mean 4/3,
    sd 2/3: cv 0.5). Lists of different lengths are refused; a single window has no cv."""
    layout = load("layout")
    own, fresh, paired = layout.summary([1.0, 3.0], [2.0, 2.0])
    assert (own, fresh, paired) == pytest.approx((0.5, 0.0, 0.5))
    with pytest.raises(ValueError, match="1 long-lived windows but 2"):
        layout.summary([1.0], [1.0, 2.0])
    assert math.isnan(layout.cv([1.0]))


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
