"""One placement: the plan's Stage.ranks are what the planner writes, the runtime runs and the simulator times.

The orders below are worked out by hand from the rules of pipedream/placement.py; the agreement
test builds the runtime's schedule with the worker's own function and captures the one simulate_plan builds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipedream import schedules
from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph, Node
from pipedream.placement import hierarchical_ranks, host_of, interleave, ranks_per_host, replica_ranks
from pipedream.plan import Plan, Stage
from pipedream.planner import PlanOptions, plan_pipeline
from pipedream.runtime.config import TrainConfig
from pipedream.runtime.worker import train_schedules
from pipedream.sim import SimOptions, simulate_plan
from pipedream.sim import simulate as sim_simulate
from pipedream.sim.cores import Host
from pipedream.table1.predicted import find_profile
from pipedream.topology import get_cluster, parse_whatif

REPO = Path(__file__).resolve().parent.parent
CLUSTERS = REPO / "experiments" / "clusters.yaml"
WHATIF = "4x4:15.75e9,1.25e9"


def test_interleave_takes_one_rank_of_each_server_in_turn() -> None:
    assert interleave([0, 1, 2, 4, 5, 6, 8, 9, 10], 4) == [0, 4, 8, 1, 5, 9, 2, 6, 10]
    assert interleave([3, 1, 0], 4) == [0, 1, 3]  # one server: ascending


def test_hierarchical_ranks_put_a_replicated_stage_on_the_same_slots_of_every_server() -> None:
    cluster = parse_whatif(WHATIF)
    # 2-1-1 inside each server, the servers data-parallel (the release's ResNet-50 8-4-4 on 16 GPUs)
    ranks = hierarchical_ranks([[2, 4], [1, 4], [1, 4]], [[0, 0], [2, 0], [3, 0]], cluster)
    assert ranks == [[0, 4, 8, 12, 1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]
    # the top level split: servers 0-2 run stage 0 on all 4 slots, server 3 runs stage 1
    assert hierarchical_ranks([[4, 3], [4, 1]], [[0, 0], [0, 3]], cluster) == [
        [0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11], [12, 13, 14, 15]]


def test_replica_ranks_copies_the_pipeline_over_servers_when_the_counts_allow() -> None:
    cluster = parse_whatif(WHATIF)
    assert replica_ranks([8, 4, 4], cluster) == [[0, 4, 8, 12, 1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]
    assert replica_ranks([15, 1], cluster) == [list(range(15)), [15]]  # no two copies: consecutive
    # gcd(4 servers, 6, 10) = 2 copies of 3-5, each on two servers (ranks 0-7 and 8-15)
    assert replica_ranks([6, 10], cluster) == [[0, 8, 1, 9, 2, 10], [3, 11, 4, 12, 5, 13, 6, 14, 7, 15]]
    assert replica_ranks([3, 1]) == [[0, 1, 2], [3]]
    assert replica_ranks([16], cluster) == [list(range(16))]  # one stage: nothing to keep inside a server
    assert hierarchical_ranks([[4, 4]], [[0, 0]], cluster) == [list(range(16))]
    assert replica_ranks([2, 1], cluster) == [[0, 1], [2]]  # fewer workers than the cluster: consecutive


def _stages(ranks: list[list[int]]) -> list[Stage]:
    return [Stage([f"n{i}"], len(rs), rs) for i, rs in enumerate(ranks)]


@pytest.mark.parametrize(("ranks", "workers", "message"), [
    ([[0, 1], [3]], 3, r"stage 1: rank 3 is not one of 0..2"),
    ([[0, 1], [1]], 3, r"stage 1: rank 1 is used also by stage 0"),
    ([[0, 0], [1]], 3, r"stage 0: rank 0 is used twice"),
    ([[0, 1], [2]], 4, r"ranks \[3\] have no stage"),
])
def test_validate_refuses_ranks_the_runtime_cannot_run(ranks: list[list[int]], workers: int, message: str) -> None:
    with pytest.raises(PipeDreamError, match=message):
        Plan("m", "c", workers, _stages(ranks), 8, 1.0, 1.0).validate()


def test_validate_refuses_replica_mismatch_and_empty_stages() -> None:
    stages = _stages([[0, 1], [2]])
    stages[0].replicas = 1
    with pytest.raises(PipeDreamError, match=r"stage 0: replicas=1 but ranks=\[0, 1\]"):
        Plan("m", "c", 3, stages, 8, 1.0, 1.0).validate()
    stages = _stages([[0], [1]])
    stages[1].nodes = []
    with pytest.raises(PipeDreamError, match="stage 1 has no layers"):
        Plan("m", "c", 2, stages, 8, 1.0, 1.0).validate()
    Plan("m", "c", 3, _stages([[2, 0], [1]]), 8, 1.0, 1.0).validate()  # any order of 0..workers-1 is fine


def test_an_old_plan_with_a_placement_map_is_refused(tmp_path: Path) -> None:
    """Its stages' consecutive ranks are not the placement its estimate assumed: regenerate, do not guess."""
    plan = Plan("m", "A_4x4", 4, _stages([[0, 1, 2], [3]]), 8, 1.0, 1.0)
    d = plan.to_dict()
    d["extra"] = {"placement_rank_map": {"0": [0, 1, 2], "1": [3]}}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(d))
    with pytest.raises(PipeDreamError, match="placement_rank_map.*regenerate it with `pipedream plan`"):
        Plan.load(path)


def _simulated_schedules(monkeypatch: pytest.MonkeyPatch, graph: LayerGraph, plan: Plan,
                         cluster_name: str) -> list[schedules.Schedule]:
    """Every schedule simulate_plan builds for ``plan`` (captured, not rebuilt)."""
    built: list[schedules.Schedule] = []
    original = sim_simulate.build_schedule

    def spy(*args: object, **kwargs: object) -> schedules.Schedule:
        sched = original(*args, **kwargs)  # type: ignore[arg-type]
        built.append(sched)
        return sched

    monkeypatch.setattr(sim_simulate, "build_schedule", spy)
    cluster = parse_whatif(cluster_name) if ":" in cluster_name else get_cluster(cluster_name, CLUSTERS)
    simulate_plan(graph, plan, cluster, SimOptions(dataset_size=64 * graph.minibatch_size))
    assert built
    return built


def _assert_runtime_runs_what_is_simulated(monkeypatch: pytest.MonkeyPatch, graph: LayerGraph, plan: Plan,
                                           cluster_name: str) -> None:
    cfg = TrainConfig(model=plan.model, batch_size=graph.minibatch_size)
    for sim_sched in _simulated_schedules(monkeypatch, graph, plan, cluster_name):
        [(m0, run_sched)] = train_schedules(cfg, plan, sim_sched.num_minibatches)
        assert m0 == 0 and run_sched.stage_ranks == sim_sched.stage_ranks
        assert sorted(run_sched.order) == list(range(plan.workers))
        for rank in range(plan.workers):
            assert run_sched.order[rank] == sim_sched.order[rank], f"rank {rank}"


def _chain(layers: int, batch: int = 32) -> LayerGraph:
    g = LayerGraph()
    g.add_node(Node("in", "Input", 0.0, 0.0, (1e6,), 0.0))
    prev = "in"
    for i in range(layers):
        g.add_node(Node(f"n{i}", "Linear", 1e-3, 2e-3, (1e6,), 1e6))
        g.add_edge(prev, f"n{i}")
        prev = f"n{i}"
    g.minibatch_size = batch
    return g


def test_hand_made_interleaved_plan_runs_as_simulated(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = parse_whatif(WHATIF)
    graph = _chain(6)
    ranks = hierarchical_ranks([[2, 4], [1, 4], [1, 4]], [[0, 0], [2, 0], [3, 0]], cluster)
    nodes = [["in", "n0", "n1", "n2"], ["n3", "n4"], ["n5"]]
    plan = Plan("chain", cluster.name, 16, [Stage(n, len(r), r) for n, r in zip(nodes, ranks, strict=True)], 32, 1.0, 1.0)
    _assert_runtime_runs_what_is_simulated(monkeypatch, graph, plan, WHATIF)
    # minibatch m of every stage runs on server m % 4: no stage boundary crosses a NIC
    sched = schedules.build("1f1b", ranks, 8)
    assert all(len({sched.rank_of(s, m) // 4 for s in range(3)} | {m % 4}) == 1 for m in range(8))


@pytest.mark.slow
def test_planners_resnet50_plan_on_a_4x4_runs_as_simulated(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planner's hierarchical plan (the release's 8-4-4 with compat and the memory limit) and its ranks."""
    prof = find_profile("resnet50", REPO / "results" / "profiles")
    assert prof is not None
    cluster = get_cluster("A_4x4", CLUSTERS)
    plan = plan_pipeline(prof.graph, cluster, model="resnet50", minibatch_size=prof.batch,
                         options=PlanOptions(memory_limit=True, compat=True, activation_compression_ratio=1.0))
    assert plan.config == "8-4-4"
    assert [s.ranks for s in plan.stages] == [[0, 4, 8, 12, 1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]
    _assert_runtime_runs_what_is_simulated(monkeypatch, prof.graph, plan, "A_4x4")


def test_torchrun_numbers_ranks_host_by_host() -> None:
    assert ranks_per_host(8, 2) == 4 and ranks_per_host(3, 1) == 3
    assert [host_of(r, 4) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [Host(cores=2, ranks_per_host=3).host_of(r) for r in range(6)] == [0, 0, 0, 1, 1, 1]  # the simulator's
    with pytest.raises(PipeDreamError, match="do not split evenly over 4 nodes"):
        ranks_per_host(6, 4)
