"""Gradient buckets (:mod:`pipedream.runtime.buckets`): the layout by layer, the master gradients as views
into the buffers, the emulated link's rule, and on gloo processes the allreduce overlapped with the
backward, checked against single-process references."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from pipedream import schedules
from pipedream.costmodel import DDP_FIRST_BUCKET_BYTES
from pipedream.errors import PipeDreamError
from pipedream.runtime.buckets import GradBuckets, backward_layers, layer_of
from pipedream.runtime.config import TrainConfig
from pipedream.runtime.launch_board import link_finish_s
from pipedream.runtime.stage import straight_plan
from tests.test_runtime_pipeline import _replay, reference, run
from tests.tiny import bucket_model, build, reference_batches, stage_params

# bucket_model on [3, 5] layers: stage 1's buckets at a 4096-byte cap with DDP's 1 MiB first bucket, or at a
# cap of 1,071,144 bytes (an explicit cap: no smaller first bucket, costmodel.ddp_first_cap), by hand: layers in
# backward order 7 (20,520 B), 5 (1,050,624 B) close the first bucket; 3 (67,584 B) is alone
RUN_CAP = 20_520 + 1_050_624
STAGES = [range(0, 3), range(3, 8)]
STAGE1_BUCKETS = [["7.bias", "7.weight", "5.bias", "5.weight"], ["3.bias", "3.weight"]]


def _buckets(module: nn.Module, cap: float, first: float = DDP_FIRST_BUCKET_BYTES) -> GradBuckets:
    names, params = zip(*module.named_parameters(), strict=True)
    return GradBuckets(list(names), list(params), cap, first)


def test_parameters_are_grouped_by_owning_layer_in_backward_order() -> None:
    assert layer_of("layer1.0.conv1.weight") == "layer1.0.conv1" and layer_of("bias") == ""
    names = ["0.proj.weight", "0.proj.bias", "1.lin.weight", "1.lin.bias", "1.emb.weight"]
    assert backward_layers(names) == [("1.emb", [4]), ("1.lin", [3, 2]), ("0.proj", [1, 0])]


def test_bucket_assignment_of_a_stage_module() -> None:
    """Linear layers of 288, 144 and 40 bytes (weights and biases in float32); backward order 3, 2, 0.
    First cap 50: layers 3 + 2 (184 bytes) close the first bucket; cap 150: layer 0 (288) the second."""
    module = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4), nn.Linear(4, 2))
    b = _buckets(module, 150, 50)
    assert b.names == [["3.bias", "3.weight", "2.bias", "2.weight"], ["0.bias", "0.weight"]]
    assert [x.nbytes for x in b.buckets] == [184, 288]


def test_first_bucket_is_capped_at_ddps_one_mib_by_default() -> None:
    """bucket_model's stage 1 with a 4096-byte cap: the 1 MiB first bucket swallows layers 7 and 5."""
    model = build(bucket_model)
    b = _buckets(model[3:8], 4096)
    assert b.names == STAGE1_BUCKETS
    assert [x.nbytes for x in b.buckets] == [20_520 + 1_050_624, 67_584]
    assert _buckets(model[3:8], TrainConfig().bucket_bytes).names == STAGE1_BUCKETS  # 25 MiB: the rest
    names, params = zip(*model[3:8].named_parameters(), strict=True)
    cap = TrainConfig().bucket_bytes
    one = GradBuckets(list(names), list(params), cap, first_cap_bytes=cap)
    assert one.names == [sum(STAGE1_BUCKETS, [])]  # without the small first bucket: all in one


def test_master_gradients_are_views_into_the_bucket_buffers_across_steps() -> None:
    """Backward, clipping, momentum SGD and zeroing for three steps: every .grad stays a view of its
    bucket's buffer (same storage), and the buffer holds the gradients autograd computed."""
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 4), nn.Linear(4, 2))
    b = _buckets(module, 150, 50)
    opt = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    params = dict(module.named_parameters())
    for _ in range(3):
        module(torch.randn(5, 8)).square().sum().backward()
        for bucket in b.buckets:
            ptr = bucket.buffer.untyped_storage().data_ptr()
            assert all(params[n].grad.untyped_storage().data_ptr() == ptr for n in bucket.names)
        flat = torch.cat([params[n].grad.reshape(-1) for n in b.names[1]])
        assert torch.equal(b.buckets[1].buffer, flat) and flat.abs().sum() > 0
        torch.nn.utils.clip_grad_norm_(module.parameters(), 0.5)
        opt.step()
        b.zero_()
        assert all(p.grad.abs().sum() == 0 for p in module.parameters())


def test_emulated_link_reduces_buckets_one_after_the_other() -> None:
    """Ring over 4 replicas at 1 MB/s: 2 (4 - 1) / 4 = 1.5 s per MB. Bucket 0 (1 MB) launched at t = 10 ends
    at 11.5; bucket 1 (0.5 MB) launched at 10.2 waits for the link: 11.5 + 0.75; bucket 2 launched later
    than that starts at its launch."""
    assert link_finish_s([10.0], [1_000_000], 4, 1e6) == pytest.approx(11.5)
    assert link_finish_s([10.0, 10.2], [1_000_000, 500_000], 4, 1e6) == pytest.approx(12.25)
    assert link_finish_s([10.0, 10.2, 20.0], [1_000_000, 500_000, 1_000_000], 4, 1e6) == pytest.approx(21.5)
    assert link_finish_s([20.0], [1_000_000], 4, 1e6, free_s=12.25) == pytest.approx(21.5)  # the chain goes on
    assert link_finish_s([11.0], [1_000_000], 4, 1e6, free_s=12.25) == pytest.approx(13.75)  # the link was busy
    assert link_finish_s([30.0], [1_000_000], 1, 1e6) == pytest.approx(30.0)  # one replica: nothing to move
    assert link_finish_s([], [], 4, 1e6, free_s=5.0) == 5.0


def test_bucket_bytes_is_validated() -> None:
    with pytest.raises(PipeDreamError, match="--bucket-bytes"):
        TrainConfig(bucket_bytes=0).validate()
    assert "--bucket-bytes" in TrainConfig(bucket_bytes=4096).to_args()


def _events(d: dict) -> dict[tuple[int, int], dict[tuple[str, int], float]]:
    """(minibatch, microbatch) -> {(event, bucket): time} from a rank's dumped comm trace."""
    out: dict[tuple[int, int], dict[tuple[str, int], float]] = {}
    for event, _, m, j, k, t in d["comm_trace"]:
        out.setdefault((m, j), {})[(event, k)] = t
    return out


def _assert_overlapped(ev: dict[tuple[str, int], float]) -> None:
    """Both buckets launched inside the backward, in order; each completes after its launch."""
    assert ev[("B_start", -1)] < ev[("launch", 0)] < ev[("B_end", -1)]  # the overlap
    assert ev[("launch", 0)] <= ev[("launch", 1)] < ev[("B_end", -1)]
    assert ev[("launch", 0)] < ev[("done", 0)] <= ev[("done", 1)] and ev[("done", 1)] > ev[("launch", 1)]


def _assert_grad_views(d: dict) -> None:
    """After the run's steps every master gradient still lies in its bucket's buffer."""
    for names, ptr in zip(d["buckets"], d["bucket_ptrs"], strict=True):
        assert all(d["grad_ptrs"][n] == ptr for n in names)


@pytest.mark.slow
def test_1f1b_overlaps_bucket_allreduces_with_the_backward_and_equals_the_replay(tmp_path: Path) -> None:
    """Plan [1, 2] on bucket_model with RUN_CAP buckets: stage 1 has two buckets; each of its backwards (each
    is followed by an ALLREDUCE under 1F1B-RR) launches the first before it ends; the weights equal the
    one-process replay of the same action lists."""
    replicas, lr = [1, 2], 0.1
    dumps = run(tmp_path, 3, factory=bucket_model, plan=straight_plan("t", 8, [3, 5], replicas=replicas),
                max_minibatches=6, lr=lr, bucket_bytes=RUN_CAP)
    expected = _replay(schedules.build("1f1b", schedules.consecutive_ranks(replicas), 6), build(bucket_model), STAGES,
                       reference_batches(tmp_path / "data", 8, 0, 0), lr, True)
    for rank, d in enumerate(dumps):
        for n, w in expected[rank].items():
            torch.testing.assert_close(d["params"][n], w, rtol=1e-5, atol=1e-6)
        _assert_grad_views(d)
    assert dumps[0]["buckets"] == [["1.bias", "1.weight"]]
    assert not any(e[0] in ("launch", "done") for e in dumps[0]["comm_trace"])  # unreplicated: no allreduce
    for d in dumps[1:]:
        assert d["buckets"] == STAGE1_BUCKETS
        events = _events(d)
        assert len(events) == 3  # minibatches 0, 2, 4 or 1, 3, 5
        for ev in events.values():
            _assert_overlapped(ev)


@pytest.mark.slow
def test_gpipe_overlaps_only_the_last_backward_and_equals_sgd(tmp_path: Path) -> None:
    """GPipe, plan [1, 2], 4 microbatches, links emulated at 20 MB/s: replica q of stage 1 runs microbatches
    q and q + 2; only the backward of q + 2 (followed by the ALLREDUCE) launches buckets; each bucket ends
    no earlier than the emulated link allows, one after the other (2 (2 - 1) / 2 x 1,071,144 B / 20 MB/s =
    53.6 ms, then 3.4 ms for 67,584 B); the weights are synchronous SGD's."""
    lr, bw = 0.1, 2e7
    plan = straight_plan("t", 8, [3, 5], replicas=[1, 2])
    dumps = run(tmp_path, 3, factory=bucket_model, plan=plan, schedule="gpipe", microbatches=4, max_minibatches=3,
                lr=lr, momentum=0.9, bucket_bytes=RUN_CAP, emulate_bandwidth_Bps=bw)
    model, first = reference(reference_batches(tmp_path / "data", 8, 0, 0), 3, "sgd", lr, 0.9, 0.0,
                             factory=bucket_model)
    for d in dumps:
        for n, p in stage_params(model, STAGES[d["stage"]]).items():
            torch.testing.assert_close(d["params"][n], p.detach(), rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(d["first_grads"][n], first[n], rtol=1e-5, atol=1e-7)
        _assert_grad_views(d)
    for q, d in enumerate(dumps[1:]):
        events = _events(d)
        assert sorted(events) == [(m, j) for m in range(3) for j in (q, q + 2)]
        for (_, j), ev in events.items():
            if j == q:  # the earlier microbatch only accumulates
                assert {e for e, _ in ev} == {"B_start", "B_end"}
            else:
                _assert_overlapped(ev)
                # emulated completions E_k = max(L_k, E_{k-1}) + ring (the link was free: the last step waited)
                e0 = ev[("launch", 0)] + 1_071_144 / bw
                e1 = max(ev[("launch", 1)], e0) + 67_584 / bw
                assert ev[("done", 0)] >= e0 and ev[("done", 1)] >= e1
