"""Tests for the planner: the DP against brute force on small graphs, shipped configs, determinism,
bad input. Brute force here enumerates every split and replica assignment and prices it with the cost
model written out once more, stage by stage (see pipedream/planner/recurrence.py for the formulas)."""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path

import pytest

from pipedream.costmodel import StepRates
from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph, Node
from pipedream.planner import PlanOptions, plan_pipeline
from pipedream.planner.states import build_states
from pipedream.topology import Cluster, get_cluster

REPO = Path(__file__).resolve().parent.parent
PROFILES = REPO / "experiments" / "data" / "profiles"
CLUSTERS = REPO / "experiments" / "clusters.yaml"
INF = math.inf
LATENCY = 20e-6  # the cost model's per-step latency for a cluster that gives none (costmodel.DEFAULT_STEP_LATENCY_S)
# An optimizer step as (seconds per call, per tensor, per parameter byte, bytes moved per byte with copy on write over
# without): default mode's default is SGD with momentum memory-bound at a V100's 900 GB/s, 6 bytes moved per
# parameter byte and 2 more for the copy of a stashing stage; compat mode charges none.
V100_SGD = (0.0, 0.0, 6 / 900e9, 8 / 6)
NO_STEP = (0.0, 0.0, 0.0, 1.0)
# Measured rates like the CPU profiles' Adam (0.5 ms a call, 45 us a tensor, 1.6 ns a byte), whose copy on write
# moves 2 bytes beside Adam's 8.
ADAM = StepRates("adam", 1.6e-9, 5e-4, 4.5e-5)
ADAM_STEP = (5e-4, 4.5e-5, 1.6e-9, 10 / 8)


# ----------------------------------------------------------------------------------------- helpers


def chain_graph(layers: list[tuple[float, float, float]], input_bytes: float = 1e6,
                tensors: list[int] | None = None) -> LayerGraph:
    """Input node + a chain of layers, each ``(fwd+bwd ms, param bytes, output bytes)``, with ``tensors[i]``
    parameter tensors in layer ``i`` (default: no record)."""
    g = LayerGraph()
    g.add_node(Node("in", "Input", 5e-3, 0.0, (input_bytes,), 0.0))
    prev = "in"
    for i, (ms, p, a) in enumerate(layers):
        g.add_node(Node(f"l{i}", f"Linear({i})", ms / 2e3, ms / 2e3, (a,), p))
        g.add_edge(prev, f"l{i}")
        prev = f"l{i}"
        if tensors is not None:
            g.tensors[f"l{i}"] = tensors[i]
    return g


def random_chain(rng: random.Random, length: int) -> list[tuple[float, float, float]]:
    return [(rng.uniform(1, 50), rng.choice([0.0, rng.uniform(1e5, 5e7)]), rng.uniform(1e5, 2e7)) for _ in range(length)]


def compositions(total: int, parts: int) -> list[tuple[int, ...]]:
    return [
        tuple(b - a for a, b in zip((0, *cuts), (*cuts, total), strict=True))
        for cuts in itertools.combinations(range(1, total), parts - 1)
    ]


def piece_time(dc: float, dp: float, da: float, r: int, used: int, n_workers: int, bw: float, *, first: bool,
               group: float, mem: float | None, extra_version: int, mem_div: float,
               comm: tuple[float, float | None] | None, compat: bool, inbound: float = 0.0,
               step: tuple[float, float, float, float] = NO_STEP, tensors: float = 0.0) -> float:
    """One stage: compute plus one optimizer step plus weight sync over r replicas; memory; activation transfers
    (not first).

    ``step``: ``(s per call, s per tensor, s per byte, copy factor)``: a replica with parameters steps for
    ``call + tensor * tensors + byte * P``, the bytes' part times the copy factor where it holds more than one
    minibatch (``versions > 0``: it stashes weights).
    ``comm``: bytes into and out of the stage (already divided by the compression ratio). Compat: the
    release's sync ``4 (r - 1) P / (B r) / g`` and ``2 a / (B r)``. Default: a ring allreduce of ``P / g`` bytes,
    ``2 (r - 1) L + 2 (r - 1) / r * P / (g B)``, and a transfer each way, ``2 (L + a / B) / r``."""
    if compat:
        sync = 4.0 * (r - 1) * dp / (bw * r) / group
    else:
        sync = 2 * (r - 1) * LATENCY + 2 * (r - 1) / r * (dp / group) / bw if r > 1 and dp > 0 else 0.0
    versions = math.ceil((n_workers - used) / r)
    call, per_tensor, per_byte, copy = step
    stepped = call + per_tensor * tensors + per_byte * dp * (copy if versions > 0 else 1.0) if dp > 0 else 0.0
    t = (dc + stepped + sync) / r
    if mem is not None:
        if compat:  # the release: a version per downstream worker of parameters and activations
            need = versions * (da + dp)
        else:  # w = versions + 1 minibatches in flight, each with weights, activations and its input; grads, momentum
            need = (versions + 1) * (dp + da + inbound) + 2 * dp
        if need / mem_div > mem:
            return INF
    if comm is not None and not first:
        for a in comm:
            if a is not None:
                t = max(t, 2.0 * a / (bw * r) if compat else (2 * (LATENCY + a / bw) if a > 0 else 0.0) / r)
    return t


def cumulative(layers: list[tuple[float, float, float]], tensors: list[int] | None = None,
               ) -> tuple[list[float], list[float], list[float], list[float], list[float]]:
    c, p, a, n = [0.0], [0.0], [0.0], [0.0]
    for i, (ms, pb, ab) in enumerate(layers):
        c.append(c[-1] + ms / 1e3)
        p.append(p[-1] + pb)
        a.append(a[-1] + ab)
        n.append(n[-1] + (tensors[i] if tensors else 0))
    return c[1:], p[1:], a[1:], [ab for _, _, ab in layers], n[1:]


def brute_level(c, p, a, bnd, lo: int, hi: int, workers: int, bw: float, *, n_states: int, mem, ratio, straight,
                extra_version: int, group_init: float, group_split: float, mem_div: float, compat: bool, inner=None,
                step=NO_STEP, n=None):
    """Best time for the segment after state ``lo`` (-1: start) up to state ``hi`` on ``workers`` workers of one level.

    ``inner(s, e)`` gives a lower level's best time for a piece (default: compute of the piece); ``step`` and the
    cumulative tensor counts ``n`` price each piece's optimizer step (:func:`piece_time`)."""
    best = INF
    span = list(range(lo + 1, hi))
    for stages in range(1, workers + 1):
        if stages - 1 > len(span):
            break
        for cuts in itertools.combinations(span, stages - 1):
            ends = [*cuts, hi]
            for reps in compositions(workers, stages):
                if straight and any(r != 1 for r in reps):
                    continue
                worst, used, s = 0.0, 0, lo
                for idx, (e, r) in enumerate(zip(ends, reps, strict=True)):
                    used += r
                    base = lambda v, s=s: v[s] if s >= 0 else 0.0  # noqa: E731
                    dc = inner(s, e) if inner else c[e] - base(c)
                    comm = None
                    if ratio is not None:
                        comm = (bnd[s] / ratio if s >= 0 else 0.0, bnd[e] / ratio if e < n_states - 1 else None)
                    t = piece_time(dc, p[e] - base(p), a[e] - base(a), r, used, workers, bw, first=idx == 0,
                                   group=group_init if idx == 0 else group_split, mem=mem, extra_version=extra_version,
                                   mem_div=mem_div, comm=comm, compat=compat, inbound=bnd[s] if s >= 0 else 0.0,
                                   step=step, tensors=n[e] - base(n) if n else 0.0)
                    worst = max(worst, t)
                    s = e
                best = min(best, worst)
    return best


def brute_plan(layers, cluster: Cluster, *, compat: bool, memory_limit=False, straight=False, ratio=None,
               step=None, tensors=None) -> float:
    """Brute-force bottleneck time per minibatch for a chain on a one- or two-level cluster; ``step`` (default
    mode's default: :data:`V100_SGD`) is charged at the innermost level only."""
    step = NO_STEP if compat else step or V100_SGD
    c, p, a, bnd, counts = cumulative(layers, tensors)
    n = len(c)
    mem = cluster.device_memory_bytes if memory_limit else None
    if not compat and ratio is None:
        ratio = 1.0
    ev = 0 if compat else 1
    if len(cluster.levels) == 1:
        (w, bw), = cluster.levels
        return brute_level(c, p, a, bnd, -1, n - 1, w, bw, n_states=n, mem=mem, ratio=ratio, straight=straight,
                           extra_version=ev, group_init=1, group_split=1, mem_div=1, compat=compat, step=step, n=counts)
    (w1, b1), (w2, b2) = cluster.levels

    def inner(s: int, e: int) -> float:
        return brute_level(c, p, a, bnd, s, e, w1, b1, n_states=n, mem=mem, ratio=ratio, straight=straight,
                           extra_version=ev, group_init=1, group_split=1, mem_div=1, compat=compat, step=step, n=counts)

    return brute_level(c, p, a, bnd, -1, n - 1, w2, b2, n_states=n, mem=mem, ratio=ratio, straight=straight, extra_version=ev,
                       group_init=w1, group_split=1 if compat else w1, mem_div=1 if compat else w1, compat=compat,
                       inner=inner)


def rel(x: float, y: float) -> float:
    return abs(x - y) / max(abs(y), 1e-300)


# ------------------------------------------------------------------------------- chain brute force


CHAIN_CLUSTERS = [
    Cluster("one3", [(3, 2e9)], 4e8),
    Cluster("one4", [(4, 1e9)], 2e8),
    Cluster("two2x2", [(2, 10e9), (2, 1e9)], 3e8),
    Cluster("two3x2", [(3, 8e9), (2, 5e8)], 6e8),
    Cluster("two2x3", [(2, 10e9), (3, 1e9)], 5e8),
]


@pytest.mark.parametrize("cluster", CHAIN_CLUSTERS, ids=lambda c: c.name)
@pytest.mark.parametrize("compat", [True, False], ids=["compat", "default"])
def test_chain_dp_matches_brute_force(cluster: Cluster, compat: bool) -> None:
    rng = random.Random(f"{cluster.name}-{compat}")  # str seeds are stable across processes; hash() of a str is not
    for trial in range(24):
        layers = random_chain(rng, rng.randint(2, 6))
        memory_limit = trial % 3 == 1
        if memory_limit:  # a limit that binds: between a third and all of the model's bytes
            total = sum(p + a for _, p, a in layers)
            cluster = Cluster(cluster.name, cluster.levels, rng.uniform(0.3, 1.0) * total)
        straight = trial % 5 == 2 and cluster.workers <= len(layers)
        ratio = [None, 2.0, 0.5][trial % 3] if trial % 2 else None
        # every other trial steps with measured rates, per call, per tensor and per byte (a CPU profile's Adam)
        measured = trial % 2 == 0
        tensors = [rng.randint(0, 6) for _ in layers] if measured else None
        want = brute_plan(layers, cluster, compat=compat, memory_limit=memory_limit, straight=straight, ratio=ratio,
                          step=ADAM_STEP if measured else None, tensors=tensors)
        graph = chain_graph(layers, tensors=tensors)
        kwargs = {"step": ADAM} if measured else {}
        options = PlanOptions(memory_limit=memory_limit, straight=straight, compat=compat, activation_compression_ratio=ratio,
                              rerank=False)
        if not math.isfinite(want):
            with pytest.raises(PipeDreamError, match="memory limit"):
                plan_pipeline(graph, cluster, model="m", minibatch_size=8, options=options, **kwargs)
            continue
        plan = plan_pipeline(graph, cluster, model="m", minibatch_size=8, options=options, **kwargs)
        got = plan.extra["bottleneck_time_per_minibatch_s"]
        assert rel(got, want) < 1e-12, (trial, layers, got, want)
        assert plan.time_per_sample_s == pytest.approx(want / 8, rel=1e-12)
        assert sum(s.replicas for s in plan.stages) == cluster.workers
        if straight:
            assert all(s.replicas == 1 for s in plan.stages)


# ------------------------------------------------------------------------------- shipped configs


def read_profile(name: str) -> LayerGraph:
    return LayerGraph.read(PROFILES / name / "graph.txt")


def test_states_match_the_release_counts() -> None:
    counts = {name: build_states(read_profile(name)).n for name in ("vgg16", "resnet50", "gnmt", "gnmt_large")}
    assert counts == {"vgg16": 40, "resnet50": 240, "gnmt": 99, "gnmt_large": 1495}


def test_shipped_resnet50_16_gpus_is_8_4_4_with_the_memory_limit() -> None:
    """runtime/image_classification/models/resnet50/gpus=16/hybrid_conf.json of the release: 2-1-1 inside each
    of 4 servers, replicated over the servers (ranks interleaved by server)."""
    plan = plan_pipeline(read_profile("resnet50"), get_cluster("A_4x4", CLUSTERS), model="resnet50", minibatch_size=128,
                         options=PlanOptions(memory_limit=True, compat=True, activation_compression_ratio=1.0))
    assert plan.config == "8-4-4"
    assert "placement_rank_map" not in plan.extra
    # the release's map (stage 0 on slots 0-1 of every server), in round-robin order: minibatch m on server m % 4
    assert [s.ranks for s in plan.stages] == [[0, 4, 8, 12, 1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]


def test_shipped_gnmt_large_16_gpus_flat() -> None:
    """runtime/translation/models/gnmt_large/gpus=16: twelve single stages, then 3 replicas, then 1."""
    plan = plan_pipeline(read_profile("gnmt_large"), get_cluster("B_flat16", CLUSTERS), model="gnmt_large",
                         minibatch_size=64, options=PlanOptions(compat=True))
    assert [s.replicas for s in plan.stages] == [1] * 12 + [3, 1]


# ------------------------------------------------------------------------------ plan structure


def test_cpu4_plan_of_a_profiler_chain_covers_every_node() -> None:
    rng = random.Random(7)
    graph = chain_graph(random_chain(rng, 40))
    plan = plan_pipeline(graph, get_cluster("cpu4", CLUSTERS), model="vgg16", minibatch_size=8)
    covered = [n for s in plan.stages for n in s.nodes]
    assert sorted(covered) == sorted(graph.nodes) and len(covered) == len(graph.nodes)
    assert plan.stages[0].nodes[0] == "in"
    order = graph.topological_order()
    for s in plan.stages:
        assert s.nodes == sorted(s.nodes, key=order.index)
    assert [r for s in plan.stages for r in s.ranks] == [0, 1, 2, 3]


def test_gnmt_dropped_nodes_are_placed() -> None:
    graph = read_profile("gnmt")
    plan = plan_pipeline(graph, get_cluster("A_1x4", CLUSTERS), model="gnmt", minibatch_size=64,
                         options=PlanOptions(compat=True))
    covered = [n for s in plan.stages for n in s.nodes]
    assert sorted(covered) == sorted(graph.nodes)
    assert {"node1", "node2", "node3"} <= set(plan.stages[0].nodes)  # the three inputs


def test_same_config_string_across_20_runs_and_hash_seeds() -> None:
    graph = read_profile("gnmt")
    cluster = get_cluster("A_4x4", CLUSTERS)
    strings = {plan_pipeline(graph, cluster, model="gnmt", minibatch_size=64, options=PlanOptions(compat=True)).config
               for _ in range(20)}
    assert len(strings) == 1


# ------------------------------------------------------------------------------------ bad input


def test_cycle_is_named() -> None:
    g = chain_graph([(1.0, 0.0, 1.0), (2.0, 0.0, 1.0)])
    g.add_edge("l1", "l0")
    with pytest.raises(PipeDreamError, match="cycle through node 'l"):
        plan_pipeline(g, get_cluster("cpu4", CLUSTERS), model="m", minibatch_size=1)


def test_node_without_times_is_named() -> None:
    g = chain_graph([(1.0, 0.0, 1.0), (2.0, 0.0, 1.0)])
    g.nodes["l1"].bwd_s = float("nan")
    with pytest.raises(PipeDreamError, match="node 'l1' has no forward/backward time"):
        plan_pipeline(g, get_cluster("cpu4", CLUSTERS), model="m", minibatch_size=1)


def test_negative_bandwidth_is_named() -> None:
    with pytest.raises(PipeDreamError, match="bandwidth_Bps=-1000000000.0"):
        Cluster("neg", [(4, -1e9)])


def test_memory_limit_no_plan_fits() -> None:
    g = chain_graph([(1.0, 8e9, 1e9), (2.0, 8e9, 1e9)])
    with pytest.raises(PipeDreamError, match=r"no plan fits the memory limit of 1e\+09 bytes per device"):
        plan_pipeline(g, Cluster("small", [(2, 1e9)], 1e9), model="m", minibatch_size=1,
                      options=PlanOptions(memory_limit=True, rerank=False))


def test_more_workers_than_a_straight_pipeline_can_use() -> None:
    g = chain_graph([(1.0, 0.0, 1.0), (2.0, 0.0, 1.0)])
    with pytest.raises(PipeDreamError, match="straight pipeline on 4 workers needs 4 stages but the model has only 2"):
        plan_pipeline(g, get_cluster("cpu4", CLUSTERS), model="m", minibatch_size=1, options=PlanOptions(straight=True))


@pytest.mark.parametrize("kwargs, match", [({"minibatch_size": 0}, "minibatch size 0"),
                                           ({"minibatch_size": 4, "options": PlanOptions(activation_compression_ratio=-1.0)},
                                            "ratio -1.0")])
def test_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(PipeDreamError, match=match):
        plan_pipeline(chain_graph([(1.0, 0.0, 1.0)]), get_cluster("cpu4", CLUSTERS), model="m", **kwargs)


# ------------------------------------------------------------------------------------------- CLI


def test_cli_plan_reads_meta_json_and_writes_the_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pipedream.cli import main
    from pipedream.plan import Plan

    folder = tmp_path / "vgg16"
    folder.mkdir()
    chain_graph(random_chain(random.Random(3), 12)).write(folder / "graph.txt")
    (folder / "meta.json").write_text('{"minibatch_size": 16}')
    out = tmp_path / "plans" / "cpu4.json"
    assert main(["plan", "--profile", str(folder / "graph.txt"), "--cluster", "cpu4", "--clusters", str(CLUSTERS),
                 "--out", str(out), "--explain"]) == 0
    plan = Plan.load(out)
    printed = capsys.readouterr().out
    assert plan.model == "vgg16" and plan.minibatch_size == 16 and plan.workers == 4
    assert f"config {plan.config}" in printed and "predicted speedup over DP" in printed
    assert plan.extra["explanation"] and plan.extra["explanation"].splitlines()[0] in printed
    assert plan.extra["simulation"]["optimizer"] == "sgd" and plan.extra["simulation"]["step_s_per_param_byte"] is None
    assert plan.optimizer == "sgd"
    # --optimizer: the step the profile measured for it, per byte, per call and per tensor, is what the plan charges
    (folder / "meta.json").write_text('{"minibatch_size": 16, "optimizer_step_s_per_param_byte": {"adam": 2e-9}, '
                                      '"optimizer_step_overheads": {"adam": {"s_per_call": 5e-4, "s_per_tensor": 4e-5}}}')
    assert main(["plan", "--profile", str(folder / "graph.txt"), "--cluster", "cpu4", "--clusters", str(CLUSTERS),
                 "--optimizer", "adam", "--out", str(out), "--explain"]) == 0
    adam = Plan.load(out)
    assert adam.optimizer == "adam"
    sim = adam.extra["simulation"]
    assert (sim["optimizer"], sim["step_s_per_param_byte"], sim["step_overhead_s"]) == ("adam", 2e-9, [5e-4, 4e-5])
    assert "adam steps at the profile's measured rates" in capsys.readouterr().out
    # `simulate --plan` charges the step the plan was made for: its epoch is the plan's estimate
    assert main(["simulate", "--profile", str(folder / "graph.txt"), "--plan", str(out), "--clusters", str(CLUSTERS),
                 "--json", str(tmp_path / "sim.json")]) == 0
    simulated = json.loads((tmp_path / "sim.json").read_text())
    assert simulated["epoch_time_s"] == pytest.approx(adam.extra["simulated_epoch_s"], rel=1e-12)
    (folder / "meta.json").unlink()
    assert main(["plan", "--profile", str(folder / "graph.txt"), "--cluster", "cpu4", "--clusters", str(CLUSTERS),
                 "--out", str(out)]) == 2
    assert "pass --profiled-batch N" in capsys.readouterr().err


# --------------------------------------------------------------------------- DAG brute force


def random_dag(rng: random.Random, length: int) -> LayerGraph:
    """Input -> l0, then each layer consumes one or two random earlier layers (branches and joins); some
    layers cost nothing, like GNMT's ``__getitem__``."""
    g = LayerGraph()
    g.add_node(Node("in", "Input", 1e-3, 0.0, (1e6,), 0.0))
    for i in range(length):
        ms = 0.0 if rng.random() < 0.2 else rng.uniform(1, 40)
        params = rng.choice([0.0, rng.uniform(1e5, 5e7)])
        g.add_node(Node(f"l{i}", f"Conv({i})", ms / 2e3, ms / 2e3, (rng.uniform(1e5, 2e7),), params))
    g.add_edge("in", "l0")
    for i in range(1, length):
        for p in sorted(rng.sample(range(i), min(i, rng.choice([1, 1, 2])))):
            g.add_edge(f"l{p}", f"l{i}")
    return g


def brute_dag(graph: LayerGraph, cluster: Cluster, *, compat: bool, memory_limit: bool) -> float:
    """Every chain of nested states ending at the whole model, every replica split, one level."""
    s = build_states(graph)
    (workers, bw), = cluster.levels
    nodes = [graph.nodes[i] for i in s.node_ids]
    succ = {i: [d for x, d in graph.edges if x == i] for i in s.node_ids}

    def members(mask: int) -> list[int]:
        return [b for b in range(len(nodes)) if (mask >> b) & 1]

    def cut(mask: int) -> float:  # outputs of nodes inside that feed a node outside
        inside = {s.node_ids[b] for b in members(mask)}
        return sum(nodes[b].output_bytes for b in members(mask) if any(d not in inside for d in succ[s.node_ids[b]]))

    n, best = s.n, INF
    mem = cluster.device_memory_bytes if memory_limit else None
    for length in range(1, min(workers, n) + 1):
        for mids in itertools.combinations(range(n - 1), length - 1):
            ends = [*mids, n - 1]
            if any(not s.ancestors[a, b] for a, b in zip(ends, ends[1:], strict=False)):
                continue
            for reps in compositions(workers, length):
                worst, used, prev = 0.0, 0, 0
                for idx, (e, r) in enumerate(zip(ends, reps, strict=True)):
                    used += r
                    piece = members(s.ideals[e] & ~prev)
                    dc = sum(nodes[b].fwd_s + nodes[b].bwd_s for b in piece)
                    dp = sum(nodes[b].param_bytes for b in piece)
                    da = sum(nodes[b].output_bytes for b in piece)
                    comm = None if compat else (cut(prev) if idx else 0.0, cut(s.ideals[e]) if e < n - 1 else None)
                    worst = max(worst, piece_time(dc, dp, da, r, used, workers, bw, first=idx == 0, group=1, mem=mem,
                                                  extra_version=0 if compat else 1, mem_div=1, comm=comm, compat=compat,
                                                  inbound=cut(prev) if idx else 0.0,
                                                  step=NO_STEP if compat else V100_SGD))
                    prev = s.ideals[e]
                best = min(best, worst)
    return best


@pytest.mark.parametrize("compat", [True, False], ids=["compat", "default"])
def test_dag_dp_matches_brute_force(compat: bool) -> None:
    rng = random.Random(11 if compat else 12)
    for trial in range(30):
        graph = random_dag(rng, rng.randint(3, 6))
        cluster = Cluster("c", [(rng.choice([2, 3, 4]), rng.choice([5e8, 2e9, 1e10]))], 1.0)
        memory_limit = trial % 3 == 0
        if memory_limit:
            total = sum(n.param_bytes + n.output_bytes for n in graph.nodes.values())
            cluster = Cluster("c", cluster.levels, rng.uniform(0.3, 1.0) * total)
        want = brute_dag(graph, cluster, compat=compat, memory_limit=memory_limit)
        if not math.isfinite(want):
            with pytest.raises(PipeDreamError):
                plan_pipeline(graph, cluster, model="m", minibatch_size=1,
                              options=PlanOptions(memory_limit=memory_limit, compat=compat, rerank=False))
            continue
        plan = plan_pipeline(graph, cluster, model="m", minibatch_size=1,
                             options=PlanOptions(memory_limit=memory_limit, compat=compat, rerank=False))
        assert rel(plan.extra["bottleneck_time_per_minibatch_s"], want) < 1e-12, (trial, want)
