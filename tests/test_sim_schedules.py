"""The simulator on torch's schedules: closed-form bubbles, zero-bubble schedules against 1F1B, I/W costs, and each
rank's peak memory counted by hand."""

from __future__ import annotations

import pytest

from pipedream import memory, schedules
from pipedream.graph import Node
from pipedream.memory import ChunkBytes, StageMemory, chunk_bytes, rank_memory
from pipedream.schedules import Action, Kind
from pipedream.sim import SimOptions, simulate_stages, torch_stage_ranks
from pipedream.sim.costs import stage_costs, uniform_costs
from pipedream.sim.engine import run
from pipedream.sim.network import Network
from pipedream.tied import Tied
from pipedream.topology import Cluster
from pipedream.torch_schedules import from_torch
from tests.test_simulator import chain


def flat(workers: int) -> Cluster:
    return Cluster(name=f"flat{workers}", levels=[(workers, 1e9)], latency_s=0.0)


def bubble(name: str, p: int, m: int, chunks: int, layers_per_rank: int = 2, params: float = 0.0) -> float:
    """Steady bubble of ``name`` on ``p`` ranks with equal stages (one layer of F = 1 ms, B = 2 ms each, I = W = 1 ms
    when the layers have weights), no transfer cost."""
    stages = p * chunks
    g = chain(p * layers_per_rank, param_bytes=params)
    per = len(g.nodes) // stages
    nodes = [[f"n{i}" for i in range(s * per, (s + 1) * per)] for s in range(stages)]
    ranks = torch_stage_ranks(name, list(range(p)), chunks) if chunks > 1 else [[s] for s in range(p)]
    res = simulate_stages(g, nodes, ranks, flat(p), SimOptions(schedule=name, microbatches=m, dataset_size=8 * m * 6,
                                                                step=None))
    return res.steady_bubble_fraction


@pytest.mark.parametrize("name", ["gpipe", "pipedream_flush"])
@pytest.mark.parametrize("p,m", [(2, 2), (2, 5), (4, 4), (4, 8), (4, 13)])
def test_gpipe_and_1f1b_have_the_closed_form_bubble(name: str, p: int, m: int) -> None:
    """torch's GPipe list and our 1F1B (torch's, but for its list's defect: tests/test_torch_schedules.py)."""
    sched = from_torch(name, p, m) if name == "gpipe" else schedules.build(name, schedules.consecutive_ranks([1] * p), 1, m)
    tr = run(sched, uniform_costs(p, 0.001, 0.002), Network(flat(p)))
    assert tr.makespan_s == pytest.approx((m + p - 1) * 0.003, rel=1e-12)
    assert 1 - sum(tr.busy_s.values()) / (p * tr.makespan_s) == pytest.approx((p - 1) / (m + p - 1), rel=1e-12)
    assert bubble(name, p, m, 1) == pytest.approx((p - 1) / (m + p - 1), rel=1e-9)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16)])
def test_split_backward_and_chunks_shrink_the_bubble_below_1f1b(p: int, m: int) -> None:
    one_f_one_b = bubble("pipedream_flush", p, m, 1, params=1.0)
    for name in ("interleaved_1f1b", "interleaved_zb", "zbv", "dualpipev"):
        assert bubble(name, p, m, 2, params=1.0) < one_f_one_b, name
    # ZB-H1's claim, a third of 1F1B's bubble, where F = I = W: the V schedule does better still
    assert bubble("zbv", p, m, 2, params=1.0) <= one_f_one_b / 3 + 1e-9


def test_without_weights_a_split_backward_is_all_input_gradient() -> None:
    g = chain(2, bwd_s=0.004)
    g.nodes["n1"] = Node("n1", "Linear", 0.001, 0.004, (0.0,), 100.0)
    g.split["n1"] = (0.003, 0.0015)
    c0, c1 = stage_costs(g, [["n0"], ["n1"]], 8)
    assert c0.split_s == (0.004, 0.0)  # no weights: W = 0, all of B is I
    assert c1.split_s == (0.003, 0.0015)  # measured halves, their sum above B as timed apart
    g.nodes["n0"] = Node("n0", "Linear", 0.001, 0.004, (0.0,), 100.0)
    assert stage_costs(g, [["n0"], ["n1"]], 4)[0].split_s == (0.001, 0.001)  # the fallback, halves at half the batch


def test_engine_times_i_and_w_with_their_own_costs() -> None:
    """One rank, two chunks, one microbatch of ZBV: F0 F1 I1 W1 I0 W0, every action's time from its own stage."""
    sched = from_torch("zbv", 1, 1)
    costs = uniform_costs(2, 0.001, 0.004, param_bytes=1.0)
    costs[1].input_grad_s, costs[1].weight_grad_s = 0.003, 0.002
    tr = run(sched, costs, Network(flat(1)))
    assert [s.what for s in tr.compute[0]] == ["0F0.0", "1F0.0", "1I0.0", "1W0.0", "0I0.0", "0W0.0"]
    assert tr.makespan_s == pytest.approx(0.001 + 0.001 + 0.003 + 0.002 + 0.002 + 0.002)


def fixed(p: float) -> StageMemory:
    return StageMemory(weights=p, gradients=p, optimizer=p, activations=0.0, buffers=0.0)


def test_rank_memory_walks_the_list_by_hand() -> None:
    acts = [Action(0, k, 0, j) for k, j in ((Kind.F, 0), (Kind.F, 1), (Kind.I, 0), (Kind.W, 0), (Kind.I, 1), (Kind.W, 1))]
    m = rank_memory(acts, {0: ChunkBytes(fixed(5.0), 10.0, 1.0, 4.0)})
    # after two forwards 2 (10 + 1); I frees A + I and keeps S: 22 - 11 + 4 = 15; ...
    assert (m.weights, m.gradients, m.optimizer, m.activations, m.buffers, m.total) == (5, 5, 5, 20, 2, 37)
    # a stash larger than the activations makes the peak after a later forward: F0 I0 F1 -> 30 + 10
    order = [Action(0, k, 0, j) for k, j in ((Kind.F, 0), (Kind.I, 0), (Kind.F, 1), (Kind.W, 0), (Kind.I, 1), (Kind.W, 1))]
    assert rank_memory(order, {0: ChunkBytes(fixed(0.0), 10.0, 0.0, 30.0)}).activations == 40.0
    # two chunks on one rank: both chunks' weights, the in-flight bytes of both
    two = [Action(0, Kind.F, 0, 0), Action(1, Kind.F, 0, 0), Action(1, Kind.B, 0, 0), Action(0, Kind.B, 0, 0)]
    m2 = rank_memory(two, {0: ChunkBytes(fixed(1.0), 3.0, 0.0, 0.0), 1: ChunkBytes(fixed(2.0), 7.0, 0.0, 0.0)})
    assert (m2.weights, m2.activations) == (3.0, 10.0)


def test_chunk_stash_is_inputs_and_outputs_of_layers_with_weights() -> None:
    g = chain(3, act_bytes=100.0)
    g.nodes["n1"] = Node("n1", "Linear", 0.001, 0.002, (40.0,), 8.0)
    c = chunk_bytes(g, [["n0"], ["n1", "n2"]])
    assert c[1].stash_bytes == 100.0 + 40.0  # n1's input (n0's output) and its output; n2 has no weights
    assert c[0].stash_bytes == 0.0
    assert c[1].fixed.weights == 8.0 and c[1].fixed.optimizer == 8.0  # SGD with momentum: one state tensor


@pytest.mark.parametrize("name", ["gpipe", "pipedream_flush"])
def test_walked_peak_equals_the_formula_of_gpipe_and_1f1b(name: str) -> None:
    """The walk over torch's lists holds what pipedream.memory's in-flight formulas say: m microbatches on every
    GPipe stage, p - s on stage s of 1F1B."""
    p, m = 4, 6
    g = chain(p, act_bytes=1e6, param_bytes=1e5)
    nodes = [[f"n{s}"] for s in range(p)]
    res = simulate_stages(g, nodes, [[s] for s in range(p)], flat(p), SimOptions(schedule=name, microbatches=m,
                                                                                 dataset_size=8 * m * 4))
    formula = memory.plan_memory(g, nodes, [1] * p, schedule=name, microbatches=m)
    assert res.peak_memory_bytes == pytest.approx([f.total for f in formula])


def test_peak_memory_of_zbv_by_hand() -> None:
    """ZBV on 2 ranks, 4 microbatches: rank 0 holds stages 0 and 3 and runs 0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0F3
    0I0 ...: at most 4 forwards without their I. A profile without saved-tensor records holds every layer's output
    (1 MB) a microbatch, and each stage keeps 1 MB of buffers a microbatch (stage 0 its sent output, stage 3 its
    received input) and stage 3 posts one receive ahead (1 MB); no weights, so no stash: 4 x 2 MB + 1 MB."""
    g = chain(4, act_bytes=1e6)
    res = simulate_stages(g, [["n0"], ["n1"], ["n2"], ["n3"]], torch_stage_ranks("zbv", [0, 1]), flat(2),
                          SimOptions(schedule="zbv", microbatches=4, dataset_size=64))
    assert [str(a) for a in from_torch("zbv", 2, 4).order[0] if a.kind in (Kind.F, Kind.I)][:8] == [
        "0F0.0", "0F0.1", "0F0.2", "3F0.0", "3I0.0", "3F0.1", "3I0.1", "0F0.3"]
    assert res.peak_memory_bytes[0] == pytest.approx(9e6)


def test_a_tied_tensor_on_two_chunks_of_one_rank_is_summed_there() -> None:
    """ZBV puts the first and the last stage on rank 0; a tensor both use (tied embeddings) is summed by rank 0 alone,
    at no cost, instead of waiting for a second member that never comes."""
    g = chain(4, param_bytes=1e6)
    g.tied = [Tied("embed.weight", ("n0", "n3"), 1e6)]
    nodes = [["n0"], ["n1"], ["n2"], ["n3"]]
    tied_off = simulate_stages(chain(4, param_bytes=1e6), nodes, torch_stage_ranks("zbv", [0, 1]), flat(2),
                               SimOptions(schedule="zbv", microbatches=4, dataset_size=64))
    res = simulate_stages(g, nodes, torch_stage_ranks("zbv", [0, 1]), flat(2),
                          SimOptions(schedule="zbv", microbatches=4, dataset_size=64))
    assert res.time_per_minibatch_s == pytest.approx(tied_off.time_per_minibatch_s, rel=1e-6)
