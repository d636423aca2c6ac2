"""The release's GNMT runs (experiments/release_runs.yaml): checked against the release's stage files, refused
when they are not a split of the profile, and simulated as a straight pipeline is timed by hand."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from pipedream import costmodel
from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph
from pipedream.sim import SimOptions, simulate_plan
from pipedream.table1.predicted import PAPER_MODELS, find_profile, predict
from pipedream.table1.release_runs import check_stages, expand, load_release_runs, release_run_plan
from pipedream.topology import get_cluster
from tests.conftest import PROFILES, REPO

CLUSTERS = REPO / "experiments" / "clusters.yaml"
RUNS = REPO / "experiments" / "release_runs.yaml"


def _layers(graph: LayerGraph, nodes: tuple[str, ...]) -> list[str]:
    """The nodes of a stage that compute (the modules a release stage file builds), in id order."""
    return sorted((n for n in nodes if graph.nodes[n].fwd_s + graph.nodes[n].bwd_s > 0), key=lambda n: int(n[4:]))


def _crossing(graph: LayerGraph, stages: tuple[tuple[str, ...], ...], k: int) -> set[str]:
    """Nodes of stages ``<= k`` with bytes and a consumer in a later stage: what boundary ``k`` carries."""
    where = {n: s for s, nodes in enumerate(stages) for n in nodes}
    return {src for src, dst in graph.edges
            if where[src] <= k < where[dst] and graph.nodes[src].output_bytes > 0}


def test_gnmt8_on_one_server_is_the_release_4_stage_module() -> None:
    """gnmt_4pipedream.yml runs models/gnmt/gpus=4: the modules and the returned tensors of stage0-3.py, listed by
    hand from those files and matched to graph.txt by structure (module types in order, residual adds, items)."""
    run = load_release_runs()[("gnmt8", "A_1x4")]
    graph = LayerGraph.read(PROFILES / "gnmt" / "graph.txt")
    assert [_layers(graph, s) for s in run.stages] == [
        ["node4", "node5", "node6", "node7", "node10"],  # Embedding, EmuBidirLSTM, Dropout, LSTM(2048), Dropout
        ["node11", "node15", "node16", "node21", "node23"],  # LSTM, Dropout, LSTM, Embedding, RecurrentAttention
        ["node28", "node31", "node34", "node37", "node41"],  # Dropout, LSTM(2048), Dropout, LSTM(2048), Dropout
        ["node44", "node48"],  # LSTM(2048), Classifier
    ]
    # stage0 returns (dropout, lstm[0]); stage1 (attention[2], attention[0]); stage2 (attention[2], add, dropout)
    assert [_crossing(graph, run.stages, k) for k in range(3)] == [
        {"node10", "node8"}, {"node26", "node24"}, {"node26", "node40", "node41"}]
    assert [min(s, key=lambda n: int(n[4:])) for s in run.stages] == ["node1", "node11", "node28", "node42"]
    assert [max(s, key=lambda n: int(n[4:])) for s in run.stages] == ["node10", "node27", "node41", "node48"]
    assert run.ranks == ((0,), (1,), (2,), (3,)) and run.config == "straight" and run.planned is None
    assert run.source == ("runtime/translation/driver_configs/gnmt_4pipedream.yml -> models/gnmt/gpus=4/mp_conf.json")


def test_gnmt16_on_16_gpus_is_the_release_14_stage_module() -> None:
    """gnmt_large_16pipedream.yml: the 14 stage files' first and last profile nodes, mp_conf.json's ranks 0-13, and
    hybrid_conf.json's plan; the slow LSTM node92 alone in stage12 (stage12.py holds one LSTM(2048, 1024))."""
    run = load_release_runs()[("gnmt16", "A_4x4")]
    firsts = [1, 6, 11, 21, 31, 40, 48, 55, 62, 69, 77, 83, 91, 93]
    lasts = [f - 1 for f in firsts[1:]] + [96]
    assert [(min(int(n[4:]) for n in s), max(int(n[4:]) for n in s)) for s in run.stages] == list(zip(firsts, lasts, strict=True))
    assert run.ranks == tuple((i,) for i in range(14)) and run.planned == "1-1-1-1-1-1-1-1-1-1-1-1-3-1"
    graph = LayerGraph.read(PROFILES / "gnmt_large" / "graph.txt")
    assert _layers(graph, run.stages[12]) == ["node92"] and graph.nodes["node92"].desc == "LSTM(2048, 1024)"


def test_every_gnmt_pipeline_row_of_table1_has_its_release_run() -> None:
    paper = pd.read_csv(REPO / "experiments" / "paper_table1.csv")
    gnmt = paper[paper["model"].str.startswith("gnmt") & paper["pipedream_config"].str.contains("straight|-")]
    rows = {(m, f"{c}_{s}x{g}") for m, c, s, g in
            gnmt[["model", "cluster", "servers", "gpus_per_server"]].itertuples(index=False)}
    runs = load_release_runs()
    assert set(runs) == rows and len(rows) == 5
    for (model, cluster), run in runs.items():
        assert run.batch_size == PAPER_MODELS[model][1]
        assert sum(len(r) for r in run.ranks) <= get_cluster(cluster, CLUSTERS).workers
        assert run.profile == PAPER_MODELS[model][0]


def test_a_split_that_is_not_one_of_the_profile_is_refused(tmp_path: Path) -> None:
    graph = LayerGraph.read(PROFILES / "gnmt" / "graph.txt")
    good = ["node1..node10", "node11..node27", "node28..node41", "node42..node48"]
    check_stages([expand(s, graph) for s in good], graph)
    for stages, needle in [
        (["node1..node11", "node11..node27", "node28..node41", "node42..node48"], "'node11' is in stages 0 and 1"),
        (["node1..node10", "node11..node27", "node28..node40", "node42..node48"], "node41 of the profile are in no"),
        (["node1..node10", "node28..node41", "node11..node27", "node42..node48"], "must follow the graph's order"),
    ]:
        with pytest.raises(PipeDreamError, match=needle):
            check_stages([expand(s, graph) for s in stages], graph)
    for bad, needle in [("node9..node8", "is empty"), ("node4..node49", "node49, which the profile"), ("4..9", "not")]:
        with pytest.raises(PipeDreamError, match=needle):
            expand(bad, graph)
    # on load: the file and the run are named, one line
    text = RUNS.read_text().replace("[node1..node10, node11..node27", "[node1..node11, node11..node27")
    path = tmp_path / "runs.yaml"
    path.write_text(text)
    with pytest.raises(PipeDreamError, match=r"runs.yaml: run 0 \(gnmt8 A_1x4\), profile gnmt: node 'node11' is in"):
        load_release_runs(path, PROFILES)
    path.write_text(RUNS.read_text().replace("ranks: [[0], [1], [2], [3]]", "ranks: [[0], [1], [2]]", 1))
    with pytest.raises(PipeDreamError, match="'stages' and 'ranks' must be lists of the same length"):
        load_release_runs(path, PROFILES)


@pytest.mark.parametrize("model,profile", [("gnmt8", "gnmt"), ("gnmt16", "gnmt_large")])
def test_one_server_release_run_is_timed_as_a_straight_pipeline_by_hand(model: str, profile: str) -> None:
    """Four unreplicated stages on one PCIe server: in the steady state of 1F1B every stage does one forward, one
    backward and one optimizer step per minibatch, and its transfers (at most 27 MB at 15.75 GB/s) run on the
    links beside the compute, so the period is the slowest stage's compute plus its step (SGD, memory bound on a
    V100). Computed here from the profile's node times alone; agreement within 1e-6 (float summation order)."""
    cluster = get_cluster("A_1x4", CLUSTERS)
    prof = find_profile(model, Path("/nonexistent"))
    assert prof is not None and prof.batch == 64
    run = load_release_runs()[(model, "A_1x4")]
    res = simulate_plan(prof.graph, release_run_plan(run, cluster), cluster, SimOptions(dataset_size=4_500_000))
    scale = prof.batch / prof.graph.minibatch_size  # 1: the graph is already at the training batch
    by_hand = []
    for stage in run.stages:
        nodes = [prof.graph.nodes[n] for n in stage]
        compute = sum(n.fwd_s + n.bwd_s for n in nodes if not n.is_input) * scale
        step = costmodel.optimizer_step_s(sum(n.param_bytes for n in nodes), "sgd", memory_Bps=900e9)
        by_hand.append(compute + step)
    assert res.time_per_minibatch_s == pytest.approx(max(by_hand), rel=1e-6)
    assert max(by_hand) > 1.05 * min(by_hand)  # the release's modules are not balanced: the period is one stage's
    assert run.profile == profile


def test_predicted_row_simulates_the_release_run(tmp_path: Path) -> None:
    """predict() reports the release's run for a one-server row too: its period and DP / run epoch time."""
    from pipedream.plan import Plan, Stage
    from pipedream.sim import simulate_dp

    cluster = get_cluster("A_1x4", CLUSTERS)
    prof = find_profile("gnmt8", tmp_path)
    assert prof is not None
    run = load_release_runs()[("gnmt8", "A_1x4")]
    ours = Plan("gnmt8", "A_1x4", 4, [Stage(list(s), 1, [i]) for i, s in enumerate(run.stages)], 64, 1.0, 2.0)
    ours.save(tmp_path / "gnmt8" / "A_1x4.json")  # a saved plan: no planner run in this test
    row = predict("gnmt8", prof, cluster, 4_500_000, paper_config="straight", paper_speedup=1.5, plans_dir=tmp_path)
    res = simulate_plan(prof.graph, release_run_plan(run, cluster), cluster, SimOptions(dataset_size=4_500_000))
    dp = simulate_dp(prof.graph, cluster, SimOptions(dataset_size=4_500_000))
    assert row["release_run_config"] == "straight on 4 of 4 GPUs (ranks 0-3)"
    assert row["release_run_period_s"] == pytest.approx(res.time_per_minibatch_s, rel=1e-12)
    assert row["release_run_speedup"] == pytest.approx(dp.epoch_time_s / res.epoch_time_s, rel=1e-12)
    assert row["release_run_source"] == run.source and pd.isna(row["release_planned_config"])
