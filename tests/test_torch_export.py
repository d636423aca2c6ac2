"""A plan as torch.distributed.pipelining's inputs (pipedream/torch_export.py, ``pipedream plan --runtime torch``):
the CSV against torch's own ``_load_csv``, the split_spec against torch's own ``pipeline()`` and our stages, the
profile's module names against the model's, and the CLI's errors. In process: no process group."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torchvision
from torch import nn
from torch.distributed.pipelining import SplitPoint, pipeline

from pipedream.cli import main
from pipedream.graph import LayerGraph
from pipedream.models import build_model, example_input
from pipedream.plan import Plan, Stage
from pipedream.profiler import ProfileSettings, profile_module, write_profile
from pipedream.runtime.stage import build_stages
from pipedream.torch_export import torch_section, write_schedule_csv
from pipedream.torch_schedules import TORCH_CLASSES, chunks_of, iteration_defect, positions, torch_ops, torch_schedule

QUICK = ProfileSettings(warmup=0, iters=1, in_situ=False)


def _compute(order: dict[int, list[Any]], rank: int) -> list[Any]:
    return [a for a in order[rank] if a is None or a.is_compute_op]


@pytest.mark.parametrize("name", list(TORCH_CLASSES))
def test_the_csv_loads_into_torch_own_pipeline_order(name: str, tmp_path: Path) -> None:
    v, m = chunks_of(name), 4
    section = {"schedule_class": TORCH_CLASSES[name], "stage_to_rank": list(positions(name, 2, v)),
               "n_microbatches": m, "stages_per_rank": v}
    path = tmp_path / "plan.schedule.csv"
    write_schedule_csv(section, path)
    own = torch_schedule(name, 2, m, v).pipeline_order
    if v > 1:  # a multi-stage class reads its own list back exactly
        loader = torch_schedule(name, 2, m, v)
        loader._load_csv(str(path))
        assert loader.pipeline_order == own
        return
    # a single-stage class has no _load_csv and runs its own loop: a multi-stage class of one stage a rank loads the
    # list (torch checks it: every F before its B, each once), which is the class's own less its REDUCE_GRAD
    loader = torch_schedule("interleaved_1f1b", 2, m, 1)
    loader._load_csv(str(path))
    loaded = {r: loader.pipeline_order[r] for r in range(2)}
    if name == "gpipe":
        assert loaded == {r: _compute(own, r) for r in range(2)}
    else:  # torch's 1F1B list numbers the last rank's forwards 1 .. m; ours is the same list numbered 0 .. m - 1
        assert iteration_defect(torch_ops(name, 2, m, 1), 2, m) is not None
        assert loaded[0] == _compute(own, 0)
        shifted = [a._replace(microbatch_index=a.microbatch_index - 1) if a.computation_type.value == "F" else a
                   for a in _compute(own, 1)]
        assert loaded[1] == shifted


def _profile(model: nn.Module, x: Any, out: Path) -> tuple[LayerGraph, dict[str, str]]:
    graph = profile_module(model, x, QUICK)
    write_profile(graph, out, {"granularity": "layer"})
    return graph, json.loads((out / "meta.json").read_text())["modules"]


@pytest.fixture(scope="module")
def resnet(tmp_path_factory: pytest.TempPathFactory) -> tuple[nn.Module, torch.Tensor, LayerGraph, dict[str, str]]:
    """torchvision's ResNet-18 (captured: not an nn.Sequential), an input of 2 samples, its profile and module names."""
    torch.manual_seed(0)
    model, x = torchvision.models.resnet18(num_classes=10), torch.randn(2, 3, 32, 32)
    return model, x, *_profile(model, x, tmp_path_factory.mktemp("resnet"))


def test_meta_json_names_the_modules_of_the_model(tmp_path: Path, resnet: tuple[Any, ...]) -> None:
    seq = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    _, names = _profile(seq, torch.randn(2, 4), tmp_path / "seq")
    assert names == {"node1": "0", "node2": "1", "node3": "2"}
    gpt = build_model("gpt")
    _, names = _profile(gpt, example_input("gpt", 2), tmp_path / "gpt")
    assert names == {f"node{k + 1}": str(k) for k in range(len(gpt))}
    model, _, graph, names = resnet
    assert set(names.values()) <= dict(model.named_modules()).keys()
    assert {"conv1", "layer1.0", "layer2.1", "layer3.0.conv2", "layer4.1.bn2", "fc"} <= set(names.values())
    functions = {n for n, node in graph.nodes.items() if node.desc.startswith("ops ")}  # glue: the adds, the flatten
    assert len(functions) == 5
    assert set(graph.nodes) - set(names) == {"node0", *functions}


def _plan(cuts: list[int], nodes: int, schedule: str = "interleaved_1f1b") -> Plan:
    """Stages of node ids ``node0 ..`` cut before each of ``cuts``, on 2 ranks (looped: stage s on rank s mod 2)."""
    bounds = [0, *cuts, nodes]
    stages = [Stage(nodes=[f"node{k}" for k in range(a, b)], ranks=[s % 2]) for s, (a, b) in
              enumerate(zip(bounds, bounds[1:], strict=False))]
    return Plan(model="m", cluster="2:1e9", workers=2, stages=stages, minibatch_size=4, time_per_sample_s=1.0,
                dp_time_per_sample_s=1.0, extra={"schedule": schedule, "depth": 2, "chunks": len(stages) // 2, "width": 1,
                                                 "microbatches": 2, "microbatch_size": 2})


def _torch_stage_params(model: nn.Module, x: torch.Tensor, split_spec: dict[str, str]) -> list[list[str]]:
    pipe = pipeline(model, mb_args=(x,), split_spec={k: SplitPoint[v] for k, v in split_spec.items()})
    return [sorted(n for n, _ in pipe.get_stage_module(s).named_parameters()) for s in range(pipe.num_stages)]


def _our_stage_params(model: nn.Module, plan: Plan, x: torch.Tensor) -> list[list[str]]:
    return [sorted(n for n, _ in m.named_parameters()) for m in build_stages(model, plan, x).modules]


def test_split_spec_gives_our_stages_of_a_sequential(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(6)])
    x = torch.randn(2, 8)
    graph, names = _profile(model, x, tmp_path / "seq")
    plan = _plan([2, 3, 5], 7)
    section = torch_section(plan, graph, names)
    assert section["schedule_class"] == "ScheduleInterleaved1F1B"
    assert section["split_spec"] == {"1": "BEGINNING", "2": "BEGINNING", "4": "BEGINNING"}
    assert section["first_modules"] == ["0", "1", "2", "4"]
    assert section["stage_to_rank"] == [0, 1, 0, 1] and section["pipelines"] == [[0, 1]]
    ours = _our_stage_params(model, plan, x)
    assert _torch_stage_params(model, x, section["split_spec"]) == ours
    assert ours[1] == ["1.bias", "1.weight"]


def test_split_spec_gives_our_stages_of_a_captured_resnet(resnet: tuple[Any, ...]) -> None:
    model, x, graph, names = resnet
    # stage 1 at a block, stage 2 inside one (its skip connection crosses), stage 3 at the flatten before fc
    plan = _plan([7, 12, 42], 44)
    section = torch_section(plan, graph, names)
    assert section["split_spec"] == {"layer2.0": "BEGINNING", "layer3.0.conv2": "BEGINNING", "fc": "BEGINNING"}
    assert "node42 (before fc) at the end of stage 2" in section["split_spec_note"]  # the flatten moves
    ours = _our_stage_params(model, plan, x)
    assert _torch_stage_params(model, x, section["split_spec"]) == ours
    assert ours[3] == ["fc.bias", "fc.weight"]
    # a stage that begins at the second call of layer3.0.relu: torch would cut before both calls
    refused = torch_section(_plan([7, 17, 42], 44), graph, names)
    assert refused["split_spec"] is None and "layer3.0.relu, a module called 2 times" in refused["split_spec_note"]
    assert refused["first_modules"][2] == "layer3.0.relu"
    assert torch_section(plan, graph, {})["split_spec"] is None


@pytest.fixture
def profile(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    _profile(nn.Sequential(*[nn.Linear(16, 16) for _ in range(4)]), torch.randn(8, 16), tmp_path / "seq")
    return tmp_path / "seq" / "graph.txt"


def test_plan_runtime_torch_writes_the_torch_section_and_the_csv(profile: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    assert main(["plan", "--profile", str(profile), "--cluster", "2:1e9", "--export", "torch", "--out", str(out)]) == 0
    csv_path = tmp_path / "plan.schedule.csv"
    assert str(csv_path) in capsys.readouterr().out
    extra = json.loads(out.read_text())["extra"]
    assert extra["runtime"] == "torch" and extra["granularity"] == "layer"
    assert "1f1b" not in {r["schedule"] for r in extra["schedules"]}  # PipeDream's replicated 1F1B is not torch's
    t = extra["torch"]
    assert t["schedule_class"] == TORCH_CLASSES[extra["schedule"]]
    assert (t["n_microbatches"], t["stages_per_rank"]) == (extra["microbatches"], extra["chunks"])
    depth, width = extra["depth"], extra["width"]
    assert len(t["first_modules"]) == len(t["stage_to_rank"]) == depth * extra["chunks"]
    assert sorted(r for p in t["pipelines"] for r in p) == [0, 1] and len(t["pipelines"]) == width
    assert len(csv_path.read_text().splitlines()) == depth
    assert main(["plan", "--profile", str(profile), "--cluster", "2:1e9", "--runtime", "torch", "--schedule", "zbv",
                 "--out", str(out)]) == 0
    t = json.loads(out.read_text())["extra"]["torch"]
    assert t["schedule_class"] == "ScheduleZBVZeroBubble" and t["stage_to_rank"] == [0, 1, 1, 0]  # the V
    assert t["split_spec"] == {"1": "BEGINNING", "2": "BEGINNING", "3": "BEGINNING"}


@pytest.mark.parametrize(("args", "says"), [
    (["--runtime", "torch", "--schedule", "1f1b"], "--schedule 1f1b runs on PipeDream's runtime only"),
    (["--runtime", "torch", "--schedule", "2bw"], "--schedule 2bw runs on PipeDream's runtime only"),
    (["--runtime", "torch", "--planner", "2bw", "--batch-size", "8"], "drop --planner 2bw"),
    (["--runtime", "pipedream", "--export", "torch"], "pass --runtime torch or drop --export"),
])
def test_plan_runtime_torch_refuses_what_torch_does_not_run(profile: Path, tmp_path: Path, args: list[str], says: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    assert main(["plan", "--profile", str(profile), "--cluster", "2:1e9", "--out", str(out), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and says in err and err.count("\n") == 1
    assert not out.exists()
