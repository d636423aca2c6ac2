"""The one memory model (pipedream/memory.py) against hand computations and the schedules' action lists."""

from __future__ import annotations

import pytest

from pipedream import costmodel, memory, schedules
from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph, Node
from pipedream.planner.rerank import runtime_memory_bytes


def test_stage_memory_by_hand() -> None:
    # P = 100, A = 10, I = 5 bytes; 1F1B with 4 in flight: 4 weight copies, 4 x (A + I), grads and momentum
    m = memory.stage_memory(100, 10, 5, schedule="1f1b", in_flight_count=4)
    assert m.as_dict() == {"weights": 400, "gradients": 100, "optimizer": 100, "activations": 40, "buffers": 20,
                           "total": 660}
    assert memory.stage_memory(100, 10, 5, schedule="gpipe", in_flight_count=4).weights == 100
    assert memory.stage_memory(100, 10, 5, schedule="2bw", in_flight_count=4).weights == 200
    assert memory.stage_memory(100, 10, 5, schedule="dp", in_flight_count=1, optimizer="adam").total == 100 + 100 + 200 + 10 + 5
    assert memory.stage_memory(100, 0, 0, schedule="1f1b", in_flight_count=1, momentum=0.0).total == 200
    assert memory.stashing_total(100, 10, 5, 4) == 660
    # PipeDream-Flush: one weight copy; recomputation keeps the inputs of all 4 but the activations of one
    flush = memory.stage_memory(100, 10, 5, schedule="pipedream_flush", in_flight_count=4)
    assert (flush.weights, flush.activations, flush.buffers) == (100, 40, 20)
    again = memory.stage_memory(100, 12, 5, schedule="pipedream_flush", in_flight_count=4, recompute=True)
    assert (again.weights, again.activations, again.buffers) == (100, 12, 20)


def test_pipedream_flush_holds_at_most_depth_minus_stage_microbatches() -> None:
    """Counted by hand: stage s of a d-stage pipeline holds min(m, d - s) microbatches; a replica of a
    replicated stage min(its share of the m, its 1F1B warm-up)."""
    assert [memory.in_flight("pipedream_flush", [1, 1, 1], s, 4) for s in range(3)] == [3, 2, 1]
    assert [memory.in_flight("pipedream_flush", [1, 1, 1], s, 2) for s in range(3)] == [2, 2, 1]
    assert [memory.in_flight("pipedream_flush", [1, 1, 1, 1], s, 8) for s in range(4)] == [4, 3, 2, 1]
    assert [memory.in_flight("pipedream_flush", [2, 1], s, 4) for s in range(2)] == [2, 1]  # 0.0, 0.2 on replica 0
    assert [memory.in_flight("gpipe", [1, 1, 1], s, 4) for s in range(3)] == [4, 4, 4]  # GPipe holds all m
    assert memory.weight_copies("pipedream_flush", 3) == 1


@pytest.mark.parametrize("name,replicas,micro", [("1f1b", [1, 1, 1, 1], 1), ("1f1b", [2, 1, 1], 1),
                                                 ("gpipe", [1, 1, 1], 4), ("gpipe", [2, 1], 4), ("2bw", [1, 1, 1], 4),
                                                 ("2bw", [2, 1], 4), ("pipedream_flush", [1, 1, 1], 4),
                                                 ("pipedream_flush", [1, 1, 1, 1], 2), ("pipedream_flush", [2, 1], 4),
                                                 ("pipedream_flush", [1, 2, 1], 6)])
def test_in_flight_equals_the_most_forwards_awaiting_a_backward_in_the_action_lists(name: str, replicas: list[int],
                                                                                     micro: int) -> None:
    sched = schedules.build(name, schedules.consecutive_ranks(replicas), 8, micro)
    for s, ranks in enumerate(schedules.consecutive_ranks(replicas)):
        peak, held = 0, 0
        for a in sched.order[ranks[0]]:
            held += (a.kind == schedules.Kind.F) - (a.kind == schedules.Kind.B)
            peak = max(peak, held)
        assert memory.in_flight(name, replicas, s, micro) == peak, (name, replicas, s)


def _chain() -> LayerGraph:
    g = LayerGraph()
    g.add_node(Node("in", "Input", 0.0, 0.0, (7.0,), 0.0))
    for i, (p, a) in enumerate([(100.0, 10.0), (50.0, 20.0), (30.0, 40.0)]):
        g.add_node(Node(f"l{i}", "Linear", 1e-3, 1e-3, (a,), p))
        g.add_edge("in" if i == 0 else f"l{i - 1}", f"l{i}")
    return g


def test_plan_memory_of_a_chain_by_hand() -> None:
    """Without a record of saved tensors (the release's profiles) every layer's output is an activation."""
    # 2 stages [in, l0, l1] and [l2], 1F1B: NOAM 2 on stage 0, holding the 7-byte data and the buffer posted for
    # the gradient of l1's 20 sent bytes per minibatch; stage 1 holds 1 and receives l1's 20 bytes, and posts the
    # next 20 ahead
    assert runtime_memory_bytes(_chain(), [["in", "l0", "l1"], ["l2"]], [1, 1]) == [
        2 * (150 + 30 + 7 + 20) + 2 * 150, 1 * (30 + 40 + 20) + 20 + 2 * 30]
    # a plan leaves the model's input node out of its stages: the data is still held by the first stage
    assert runtime_memory_bytes(_chain(), [["l0", "l1"], ["l2"]], [1, 1]) == [
        2 * (150 + 30 + 7 + 20) + 2 * 150, 1 * (30 + 40 + 20) + 20 + 2 * 30]


def test_plan_memory_with_saved_tensors_by_hand() -> None:
    """l0 saves 5 bytes of its own and its output (10), l1 saves 3 and its input, l2 its input."""
    g = _chain()
    g.saved = {"l0": (5.0, False, True), "l1": (3.0, True, False), "l2": (0.0, True, False)}
    got = memory.plan_memory(g, [["in", "l0", "l1"], ["l2"]], [1, 1])
    # stage 0: A = (5 + 10) + 3 (l1's output is sent: a buffer), I = 7 (data) + 20 (sent output) + 20 (its
    # gradient's posted buffer)
    assert (got[0].activations, got[0].buffers, got[0].total) == (2 * 18, 2 * 47, 2 * 150 + 150 + 150 + 2 * 65)
    # stage 1: the final output (40) is saved by the loss, I = 20 received, and the next 20 posted ahead
    assert (got[1].activations, got[1].buffers, got[1].total) == (40, 40, 30 + 30 + 30 + 40 + 40)
    g.minibatch_size = 1
    double = memory.plan_memory(g.scaled(2), [["in", "l0", "l1"], ["l2"]], [1, 1])  # saved bytes scale with the batch
    assert (double[1].activations, double[1].buffers) == (80, 80)


def test_plan_memory_with_recomputation_by_hand() -> None:
    """Recomputation keeps one microbatch's activations, A' = A plus the sent outputs the stage saves (made
    again by the recomputation), beside every in-flight microbatch's inputs."""
    g = _chain()
    g.saved = {"l0": (5.0, False, True), "l1": (3.0, True, True), "l2": (0.0, True, False)}
    stages = [["in", "l0", "l1"], ["l2"]]
    plain = memory.plan_memory(g, stages, [1, 1], schedule="pipedream_flush", microbatches=4)
    again = memory.plan_memory(g, stages, [1, 1], schedule="pipedream_flush", microbatches=4, recompute=True)
    # stage 0 holds min(4, 2) = 2 microbatches: A = (5 + 10) + 3 = 18 each; l1's sent output (20) it saves too
    assert (plain[0].activations, again[0].activations) == (2 * 18, 18 + 20)
    assert plain[0].buffers == again[0].buffers == 2 * (7 + 20 + 20) and plain[0].weights == 150
    # stage 1 holds one: A = the final output (40), saved by the loss, recomputed or not
    assert (plain[1].activations, again[1].activations) == (40, 40)


def test_muon_keeps_one_state_per_hidden_matrix_byte_and_adams_two_for_the_rest() -> None:
    """P = 100 bytes of which H = 60 are hidden matrices: Muon's momentum 60, Adam's moments 2 x 40."""
    assert memory.optimizer_state_bytes("muon", 100, 60) == 60 + 2 * 40
    assert memory.optimizer_state_bytes("adam", 100, 60) == memory.optimizer_state_bytes("adam", 100) == 200
    assert memory.optimizer_state_bytes("sgd", 100) == 100 and memory.optimizer_state_bytes("sgd", 100, momentum=0) == 0
    assert memory.stage_memory(100, 0, 0, schedule="2bw", in_flight_count=1, optimizer="muon",
                               hidden_bytes=60).as_dict() == {"weights": 200, "gradients": 100, "optimizer": 140,
                                                              "activations": 0, "buffers": 0, "total": 440}


def test_plan_memory_takes_the_hidden_bytes_from_the_profile_or_asks_for_a_new_one() -> None:
    """Two stages of a chain input -> l1 (P 30, H 20) -> l2 (P 50, H 0, the output layer)."""
    g = LayerGraph(minibatch_size=1)
    for nid, p in (("node0", 0.0), ("node1", 30.0), ("node2", 50.0)):
        g.add_node(Node(nid, "Input" if nid == "node0" else "Linear", 1e-3, 1e-3, (4.0,), p))
    g.add_edge("node0", "node1")
    g.add_edge("node1", "node2")
    stages = [["node0", "node1"], ["node2"]]
    with pytest.raises(PipeDreamError, match="re-run `pipedream profile`"):
        memory.plan_memory(g, stages, [1, 1], schedule="2bw", microbatches=2, optimizer="muon")
    assert [m.optimizer for m in memory.plan_memory(g, stages, [1, 1], optimizer="adam")] == [60, 100]
    g.hidden = {"node0": 0.0, "node1": 20.0, "node2": 0.0}
    need = memory.plan_memory(g, stages, [1, 1], schedule="2bw", microbatches=2, optimizer="muon")
    assert [m.optimizer for m in need] == [20 + 2 * 10, 2 * 50]


def test_unknown_schedule_or_optimizer_is_named() -> None:
    with pytest.raises(PipeDreamError, match="unknown schedule 'pipe'"):
        memory.in_flight("pipe", [1], 0)
    with pytest.raises(PipeDreamError, match="unknown optimizer 'lamb'"):
        memory.optimizer_states("lamb")


def test_which_stages_copy_their_weights_before_a_step() -> None:
    """1F1B on 4 stages: the last stage's backward follows its forward at once, so only stages 0-2 hold an
    in-flight minibatch's version when they step; GPipe and DP keep one version; 2BW always two."""
    assert memory.copies_on_write("1f1b", [1, 1, 1, 1]) == [True, True, True, False]
    assert memory.copies_on_write("gpipe", [1, 1], microbatches=4) == [False, False]
    assert memory.copies_on_write("2bw", [1, 1], microbatches=4) == [True, True]
    assert memory.copies_on_write("dp", [4]) == [False]


def test_a_copy_on_write_step_moves_two_more_bytes_per_parameter_byte() -> None:
    """SGD with momentum and zeroing: 6 bytes per parameter byte; the copy reads and writes each once: 8."""
    assert costmodel.optimizer_step_s(1e9, "sgd", memory_Bps=1e11) == pytest.approx(0.06)
    assert costmodel.optimizer_step_s(1e9, "sgd", memory_Bps=1e11, copy_on_write=True) == pytest.approx(0.08)
    assert costmodel.optimizer_step_s(1e9, "adam", s_per_param_byte=1e-10, copy_on_write=True) == pytest.approx(0.1 * 10 / 8)
