"""The schedule search of ``pipedream plan --schedule``: cut points by hand, the search against an exhaustive one on
a small model, the plan it writes and the command line."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from pipedream.cli import main
from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph, Node
from pipedream.plan import Plan
from pipedream.planner.schedule_choice import to_plan
from pipedream.planner.schedule_search import SEARCHED, SearchSettings, _microbatch_counts, chunk_counts, evaluate, search
from pipedream.planner.stage_cuts import MemoryLimit, cut_points, layers_of
from pipedream.topology import Cluster


def chain(times_ms: list[float], act_bytes: float = 1e5, param_bytes: float = 1e6, batch: int = 8) -> LayerGraph:
    """An input and a chain of layers of the given forward times (backward twice that), profiled at ``batch``."""
    g = LayerGraph(minibatch_size=batch)
    g.add_node(Node("node0", "Input", 0.0, 0.0, (1e4,), 0.0))
    for i, t in enumerate(times_ms, start=1):
        g.add_node(Node(f"node{i}", "Linear", t / 1e3, 2 * t / 1e3, (act_bytes,), param_bytes))
        g.add_edge(f"node{i - 1}", f"node{i}")
    return g


def flat(workers: int, bw: float = 1e9, memory: float = 16e9) -> Cluster:
    return Cluster(name=f"flat{workers}", levels=[(workers, bw)], device_memory_bytes=memory)


def test_cut_points_by_hand() -> None:
    layers = layers_of(chain([1, 1, 1, 1, 4]))
    assert cut_points(layers, 2, 1.0, partitioner="compute") == [4, 5]  # 4 ms against 4 ms
    assert cut_points(layers, 2, 1.0, partitioner="equal") == [2, 5]
    assert cut_points(layers, 5, 1.0) == [1, 2, 3, 4, 5]
    # a boundary whose transfer is slower than any stage's compute is avoided where another cut is as good
    g = chain([1, 1, 1, 1])
    g.nodes["node2"] = Node("node2", "Linear", 1e-3, 2e-3, (1e9,), 1e6)  # 1 s on 1 GB/s after layer 2
    assert cut_points(layers_of(g), 2, 1.0, partitioner="compute") == [2, 4]
    assert cut_points(layers_of(g), 2, 1.0, links_Bps=[1e9]) in ([1, 4], [3, 4])
    # memory: a stage holds (2 + 1) x its parameters (weights, gradients, momentum) and its activations and buffers;
    # 4 layers of 1 MB do not fit in 12 MB, so the first stage takes 3 (9 ms + 15 ms beats 6 ms + 18 ms)
    assert cut_points(layers, 2, 1.0, limit=MemoryLimit([1, 1], 12e6)) == [3, 5]
    with pytest.raises(PipeDreamError, match="fits"):
        cut_points(layers, 2, 1.0, limit=MemoryLimit([1, 1], 5e6))
    with pytest.raises(PipeDreamError, match="6 stages for 5 layers"):
        cut_points(layers, 6, 1.0)


def exhaustive(graph: LayerGraph, cluster: Cluster, settings: SearchSettings, schedule: str) -> float:
    """The fastest fitting iteration of ``schedule`` over every depth, chunk count and microbatch count the search
    tries and every split of the layers (all compositions)."""
    n = len(layers_of(graph).compute_s)
    best = float("inf")
    for d in (d for d in range(1, cluster.workers + 1) if cluster.workers % d == 0):
        for v in chunk_counts(schedule, d, n):
            for m in _microbatch_counts(settings, cluster.workers // d, d):
                for inner in itertools.combinations(range(1, n), d * v - 1):
                    try:
                        o = evaluate(graph, cluster, settings, schedule, d, v, m, ends=[*inner, n])
                    except PipeDreamError:
                        continue
                    assert o.bound_s <= o.iteration_s * (1 + 1e-9)  # the search's pruning bound is a lower bound
                    if o.fits:
                        best = min(best, o.iteration_s)
    return best


@pytest.mark.parametrize("schedule", ["gpipe", "interleaved_1f1b", "zbv"])
def test_search_is_within_5_percent_of_an_exhaustive_search(schedule: str) -> None:
    graph = chain([3, 1, 2, 5, 1, 2], act_bytes=4e6)
    cluster = flat(4, bw=2e9)
    settings = SearchSettings(batch_size=32, schedules=(schedule,))
    (found,) = search(graph, cluster, settings)
    best = exhaustive(graph, cluster, settings, schedule)
    assert best <= found.iteration_s * (1 + 1e-9)
    assert found.iteration_s <= best * 1.05


def test_search_returns_every_schedule_best_first_and_memory_decides() -> None:
    graph = chain([2, 1, 1, 3, 1, 1, 2, 1], act_bytes=2e6)
    options = search(graph, flat(4), SearchSettings(batch_size=64))
    assert sorted(o.schedule for o in options) == sorted(SEARCHED)
    times = [o.iteration_s for o in options]
    assert times == sorted(times)
    for o in options:
        assert 0.0 <= o.bubble < 1.0 and len(o.peak_bytes) == o.depth
    # GPipe holds every microbatch: with little memory it must take fewer, smaller ones or not fit
    tight = search(graph, flat(4, memory=2.5e7), SearchSettings(batch_size=64, schedules=("gpipe", "pipedream_flush")))
    for o in tight:
        assert not o.fits or max(o.peak_bytes) <= 2.5e7


def test_a_chunked_plan_validates_and_the_runtime_refuses_it() -> None:
    graph = chain([1] * 8)
    settings = SearchSettings(batch_size=32, schedules=("interleaved_1f1b",), depths=(2,))
    plan = to_plan(search(graph, flat(4), settings), graph, flat(4), settings, model="chain")
    assert plan.chunks >= 2 and plan.extra["schedule"] == "interleaved_1f1b"
    assert len(plan.stages) == 2 * plan.chunks and all(s.replicas == 2 for s in plan.stages)
    again = Plan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again.chunks == plan.chunks
    with pytest.raises(PipeDreamError, match="torch.distributed.pipelining runs"):
        again.stage_of_rank(0)


def test_plan_schedule_auto_explains_every_schedule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prof = tmp_path / "chain"
    prof.mkdir()
    chain([2, 1, 1, 3, 1, 1]).write(prof / "graph.txt")
    (prof / "meta.json").write_text(json.dumps({"minibatch_size": 8}))
    out = tmp_path / "plan.json"
    assert main(["plan", "--profile", str(prof / "graph.txt"), "--cluster", "4:1e9", "--schedule", "auto", "--explain",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    for name in (*SEARCHED, "1f1b"):
        assert f"\n{name} " in text
    plan = json.loads(out.read_text())
    rows = plan["extra"]["schedules"]
    assert [r["iteration_s"] for r in rows] == sorted(r["iteration_s"] for r in rows)
    assert plan["extra"]["schedule"] == rows[0]["schedule"]
    assert main(["plan", "--profile", str(prof / "graph.txt"), "--cluster", "4:1e9", "--schedule", "zbv",
                 "--out", str(out)]) == 0
    assert json.loads(out.read_text())["extra"]["schedule"] == "zbv"
