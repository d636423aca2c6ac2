"""Tied parameters (pipedream/tied.py) from the profile to the plan: counted once per stage that holds them, their
gradient sum across holding stages simulated, and no plan that the runtime refuses (pipedream.runtime.shared.check)."""

from __future__ import annotations

import copy
import itertools
import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from pipedream import costmodel, memory
from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph, Node
from pipedream.placement import replica_ranks
from pipedream.plan import Plan, Stage
from pipedream.planner import PlanOptions, plan_pipeline
from pipedream.planner.recurrence import ComputeTable, LevelInput, segment_params, segment_tensors
from pipedream.planner.rerank import NEAR_TIE, simulation_options
from pipedream.planner.states import build_states
from pipedream.profiler import ProfileSettings, profile_module, write_profile
from pipedream.runtime import shared
from pipedream.sim import SimOptions, simulate_plan
from pipedream.sim.costs import stage_costs
from pipedream.tied import Tied
from pipedream.topology import Cluster

MB = 1e6
FAST = ProfileSettings(warmup=0, iters=1)


class Head(nn.Module):
    """An output projection whose weight is the embedding's (as AWD-LM's decoder, GPT-2's lm_head)."""

    def __init__(self, embedding: nn.Embedding) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 10)
        self.proj.weight = embedding.weight

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.proj(h)


def tied_model() -> nn.Sequential:
    """Embedding(10, 4): 40 floats, 160 B; Linear(4, 4): 20 floats, 80 B; the head: the embedding's 160 B and a
    bias of 10 floats, 40 B: 440 B over the nodes, 280 B of distinct parameters."""
    torch.manual_seed(0)
    emb = nn.Embedding(10, 4)
    return nn.Sequential(emb, nn.Linear(4, 4), Head(emb))


def test_the_profile_records_the_tied_weight_and_a_stage_counts_it_once(tmp_path: Path) -> None:
    g = profile_module(tied_model(), torch.randint(0, 10, (2, 3)), FAST)
    assert {n: node.param_bytes for n, node in g.nodes.items()} == {"node0": 0.0, "node1": 160.0, "node2": 80.0,
                                                                     "node3": 200.0}
    assert g.tied == [Tied("0.weight", ("node1", "node3"), 160.0)]
    assert g.totals()["param_bytes"] == 280.0
    assert g.param_bytes_of(["node1", "node3"]) == 200.0

    # one stage holds both users: weights, gradients and momentum of 280 B, not 440 B
    (whole,) = memory.plan_memory(g, [list(g.nodes)], [1])
    assert (whole.weights, whole.gradients, whole.optimizer) == (280.0, 280.0, 280.0)
    # two stages each keep a copy: 80 + 160 and 40 + 160
    halves = [["node0", "node1", "node2"], ["node3"]]
    assert [m.gradients for m in memory.plan_memory(g, halves, [1, 1])] == [240.0, 200.0]

    # what the allreduces move: the whole model's 280 B in its buckets, no sum across stages
    (one,) = stage_costs(g, [list(g.nodes)], 2)
    assert one.param_bytes == 280.0 and sum(b for _, b in one.buckets) == 280.0 and one.tied_sums == []
    two = stage_costs(g, halves, 2)
    assert [c.param_bytes for c in two] == [240.0, 200.0]
    assert [sum(b for _, b in c.buckets) for c in two] == [240.0, 200.0]
    assert [c.tied_sums for c in two] == [[((0, 1), 160.0)], [((0, 1), 160.0)]]

    # graph.json keeps the record; a profile written before it (no "tied") still loads, with none
    write_profile(g, tmp_path, {"device": "cpu"})
    back = LayerGraph.read(tmp_path / "graph.txt", minibatch_size=2)
    assert back.tied == g.tied and back.totals()["param_bytes"] == 280.0
    doc = json.loads((tmp_path / "graph.json").read_text())
    del doc["tied"]
    (tmp_path / "graph.json").write_text(json.dumps(doc))
    assert LayerGraph.read(tmp_path / "graph.txt", minibatch_size=2).tied == []


def test_a_tied_record_naming_an_unknown_node_is_refused(tmp_path: Path) -> None:
    g = profile_module(tied_model(), torch.randint(0, 10, (2, 3)), FAST)
    g.tied = [Tied("0.weight", ("node1", "node9"), 160.0)]
    write_profile(g, tmp_path, {})
    with pytest.raises(PipeDreamError, match="node9"):
        LayerGraph.read(tmp_path / "graph.txt")


def lm_graph(emb_own: float = 0.0, head_own: float = 50 * MB, body: bool = True) -> LayerGraph:
    """A language model by hand, minibatch 8: an embedding (1 ms, a tied matrix of 0.1 MB plus ``emb_own``), a
    body (30 ms, 1 MB) and a head (10 ms, the tied matrix plus ``head_own``); every output 1 MB."""
    g = LayerGraph(minibatch_size=8)
    g.add_node(Node("in", "Input", 0.0, 0.0, (MB,), 0.0))
    layers = [("emb", 1e-3, 0.1 * MB + emb_own), ("body", 30e-3, MB), ("head", 10e-3, 0.1 * MB + head_own)]
    prev = "in"
    for name, t, params in layers if body else [layers[0], layers[2]]:
        g.add_node(Node(name, name, t / 3, 2 * t / 3, (MB,), params))
        g.add_edge(prev, name)
        prev = name
    g.tied = [Tied("emb.weight", ("emb", "head"), 0.1 * MB)]
    return g


def accepted(g: LayerGraph, plan: Plan) -> bool:
    """Whether the runtime's own check (shared.check under 1F1B) accepts the plan's holding stages."""
    held = []
    for t in g.tied:
        stages = tuple(s for s, st in enumerate(plan.stages) if set(t.nodes) & set(st.nodes))
        if len(stages) > 1:
            held.append(shared.Shared(stages, (t.name,) * len(stages)))
    try:
        shared.check(held, [s.replicas for s in plan.stages], "1f1b", 0.0)
    except PipeDreamError:
        return False
    return True


def every_plan(g: LayerGraph, cluster: Cluster) -> list[Plan]:
    """Every contiguous split of the layers with every replica vector on all workers, placed as the planner does."""
    layers = [n for n in g.topological_order() if not g.nodes[n].is_input]
    w, out = cluster.workers, []
    for k in range(1, min(w, len(layers)) + 1):
        for cuts in itertools.combinations(range(1, len(layers)), k - 1):
            bounds = [0, *cuts, len(layers)]
            nodes = [layers[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
            nodes[0] = ["in", *nodes[0]]
            for bars in itertools.combinations(range(1, w), k - 1):
                reps = [b - a for a, b in zip((0, *bars), (*bars, w), strict=True)]
                stages = [Stage(ns, r, rk) for ns, r, rk in zip(nodes, reps, replica_ranks(reps, cluster), strict=True)]
                out.append(Plan("lm", cluster.name, w, stages, g.minibatch_size, math.nan, math.nan))
    return out


def test_the_plan_is_the_fastest_one_the_runtime_accepts_not_the_fastest_one() -> None:
    """By exhaustive simulation the fastest plan of the graph, 3-1 (body and embedding on 3 workers, the head's
    50 MB unreplicated), puts the tied matrix on stages replicated 3 and 1 times, which the runtime refuses (it
    is the fastest with the tie ignored, as the planner did before); the plan returned is the fastest of those
    the runtime accepts (data parallelism here: a 2-2 or 1-2-1 replicates the 30 ms body on 2 workers at most)."""
    g, cluster = lm_graph(), Cluster("flat4", [(4, 1e9)], 1e15)
    untied = copy.copy(g)
    untied.tied = []
    opts = simulation_options()
    plans = every_plan(g, cluster)
    assert len(plans) == 10
    fastest = min(plans, key=lambda p: simulate_plan(untied, p, cluster, opts).epoch_time_s)
    assert fastest.config == "3-1" and not accepted(g, fastest)
    runnable = {p.config + str([len(s.nodes) for s in p.stages]): simulate_plan(g, p, cluster, opts).epoch_time_s
                for p in plans if accepted(g, p)}
    assert len(runnable) == 4  # data parallelism, 2-2 after either layer, 1-2-1
    best = min(runnable.values())
    assert min(runnable, key=runnable.__getitem__) == "4[4]"

    plan = plan_pipeline(g, cluster, model="lm", minibatch_size=8)
    assert accepted(g, plan)
    assert simulate_plan(g, plan, cluster, opts).epoch_time_s <= best * (1 + NEAR_TIE)
    assert plan.config == "4"
    refused = [c for c in plan.extra["candidates"] if "refused" in c]
    assert {c["config"] for c in refused} >= {"3-1"}
    assert all("replicated [" in c["refused"] for c in refused)

    # without the re-ranking the dynamic program's own choice, 3-1, gives way to data parallelism
    solver = plan_pipeline(g, cluster, model="lm", minibatch_size=8, options=PlanOptions(rerank=False))
    assert solver.config == "4" and accepted(g, solver)
    assert "3-1 was refused" in solver.extra["warnings"][-1]
    # its estimate: 41 ms of compute, an SGD step over 51.1 MB (6 bytes moved per byte at a V100's 900 GB/s, the
    # default step) and a ring allreduce of 0.1 + 1 + 50 MB (the tied 0.1 MB once), on 4 workers
    sync = costmodel.ring_allreduce_s(51.1 * MB, 4, 1e9, cluster.latency_s)
    step = 6 * 51.1 * MB / 900e9
    assert solver.extra["dp_time_per_minibatch_s"] == pytest.approx((41e-3 + step + sync) / 4, rel=1e-12)
    assert plan_pipeline(untied, cluster, model="lm", minibatch_size=8, options=PlanOptions(rerank=False)).config == "3-1"


def test_the_dynamic_programs_segment_bytes_count_each_tied_tensor_once() -> None:
    """For every segment between two nested states, :func:`segment_params` and :func:`segment_tensors` from the
    states' cumulative arrays are the stage's bytes and tensors by the one definition,
    :meth:`LayerGraph.param_bytes_of` and :meth:`LayerGraph.param_tensors_of`: a chain whose first and last layers
    share a 10 B tensor and whose three middle layers share a 7 B one, each layer with one or two tensors of its own
    beside the shared one."""
    g = LayerGraph(minibatch_size=1)
    g.add_node(Node("in", "Input", 0.0, 0.0, (1.0,), 0.0))
    for i, own in enumerate([1.0, 2.0, 0.0, 3.0, 4.0]):
        g.add_node(Node(f"l{i}", "Linear", 1.0, 1.0, (1.0,), own + (10.0 if i in (0, 4) else 7.0)))
        g.add_edge("in" if i == 0 else f"l{i - 1}", f"l{i}")
        g.tensors[f"l{i}"] = 1 + (i % 2) + 1  # its own one or two and the shared one
    g.tied = [Tied("a", ("l0", "l4"), 10.0), Tied("b", ("l1", "l2", "l3"), 7.0)]
    states = build_states(g)
    inp = LevelInput(ComputeTable(states.compute_s, states.nested), states.param_bytes, states.activation_bytes,
                     states.cut_bytes, states.ancestors, states.tied_users, states.tied_bytes, states.param_tensors)
    pairs = [(r, j) for j in range(states.n) for r in range(j + 1) if r == 0 or states.nested[r - 1, j]]
    assert len(pairs) == 15
    for r, j in pairs:
        assert segment_params(inp, r, j) == g.param_bytes_of(states.nodes_between(r - 1, j))
        assert segment_tensors(inp, r, j) == g.param_tensors_of(states.nodes_between(r - 1, j))
    assert segment_params(inp, 0, states.n - 1) == 1 + 2 + 3 + 4 + 10 + 7
    assert segment_tensors(inp, 0, states.n - 1) == (1 + 2 + 1 + 2 + 1) + 2  # own tensors, then a and b once each


def test_no_plan_the_runtime_accepts_fits_is_one_error() -> None:
    """Two layers of 100 MB each besides the tied matrix on 3 workers of 450 MB: data parallelism needs 3 x 200 MB
    of weights, gradients and momentum, a straight pipeline needs 3 stages; 2-1 fits (stage 0: two weight
    versions, 4 x 100 MB) but holds the tied matrix on stages replicated 2 and 1 times."""
    g = lm_graph(emb_own=100 * MB, head_own=100 * MB, body=False)
    cluster = Cluster("flat3", [(3, 1e9)], 450 * MB)
    with pytest.raises(PipeDreamError, match=r"^no plan that fits flat3 can run under 1F1B.*replicated \[2, 1\]"):
        plan_pipeline(g, cluster, model="lm", minibatch_size=8)
    with pytest.raises(PipeDreamError, match=r"^the dynamic program's plan 2-1 cannot run: .*neither a straight"):
        plan_pipeline(g, cluster, model="lm", minibatch_size=8, options=PlanOptions(rerank=False))


def test_the_simulator_times_the_sum_of_the_tied_gradients_across_stages() -> None:
    """A straight pipeline on 2 workers has no allreduce of its own: it moves only the tied gradients' sum, a
    ring of 2 over 0.1 MB (2 (2 - 1) x 0.1 MB) per minibatch of 8 samples, and it waits for it."""
    g, cluster = lm_graph(body=False), Cluster("flat2", [(2, 1e9)], 1e15)
    plan = Plan("lm", "flat2", 2, [Stage(["in", "emb"], 1, [0]), Stage(["head"], 1, [1])], 8, math.nan, math.nan)
    untied = copy.copy(g)
    untied.tied = []
    with_sum, without = simulate_plan(g, plan, cluster), simulate_plan(untied, plan, cluster)
    assert without.allreduce_bytes_per_sample == 0.0
    assert with_sum.allreduce_bytes_per_sample == pytest.approx(costmodel.ring_allreduce_bytes(0.1 * MB, 2) / 8)
    assert with_sum.allreduce_bytes_per_sample == pytest.approx(2 * 0.1 * MB / 8)
    assert with_sum.time_per_minibatch_s > without.time_per_minibatch_s
    # under a flush schedule the stages' steps match whatever their replicas; under 1F1B the rule refuses 1-2
    wide = Plan("lm", "flat3", 3, [Stage(["in", "emb"], 1, [0]), Stage(["head"], 2, [1, 2])], 8, math.nan, math.nan)
    flat3 = Cluster("flat3", [(3, 1e9)], 1e15)
    assert simulate_plan(g, wide, flat3, SimOptions(schedule="gpipe", microbatches=2)).epoch_time_s > 0
    with pytest.raises(PipeDreamError, match="replicated \\[1, 2\\] times"):
        simulate_plan(g, wide, flat3)


def test_hf_gpt2_profiles_and_plans_for_4_workers_into_a_plan_the_runtime_accepts() -> None:
    from pipedream.runtime.stage import build_stages
    from tests.hf_gpt2 import LENGTH, VOCAB, gpt2

    torch.manual_seed(0)
    model, x = gpt2(0.0), torch.randint(0, VOCAB, (4, LENGTH))
    g = profile_module(model, x, FAST)
    (t,) = g.tied
    assert t.nbytes == VOCAB * 16 * 4 and len(t.nodes) == 2  # wte and lm_head: 64 x 16 floats
    assert g.totals()["param_bytes"] == sum(p.numel() * 4 for p in model.parameters())  # each tensor once
    plan = plan_pipeline(g, Cluster("cpu4", [(4, 1e9)], 1e12), model="gpt2", minibatch_size=4)
    stages = build_stages(model, plan, x)
    shared.check(stages.shared, [s.replicas for s in plan.stages], "1f1b", 0.0)
    assert any("refused" in c for c in plan.extra["candidates"])  # e.g. the paper's 3-1: wte x3, lm_head x1
