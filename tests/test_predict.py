"""The run's predicted epoch time (pipedream/sim/predict.py): host sharing against hand computations, the epoch
the workers train, the emulated links and the profile's optimizer-step rates."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest
import torch

from pipedream.costmodel import StepRates
from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph, Node, read_meta
from pipedream.plan import Plan, Stage
from pipedream.profiler import write_profile
from pipedream.run_prediction import epoch_shape, predict_memory
from pipedream.run_prediction import predict as _predict
from pipedream.runtime.config import TrainConfig
from pipedream.sim.cores import Host
from pipedream.sim.predict import EpochShape, Prediction, RunCosts, emulated_cluster, predict_epoch
from pipedream.sim.profiled import missing_step_rate, profiled_composition, step_rate
from pipedream.step_rates import optimizer_step_rates
from pipedream.topology import Cluster


def chain(layers: int, fwd_s: float, bwd_s: float, act_bytes: float = 0.0, param_bytes: float = 0.0) -> LayerGraph:
    """An input and ``layers`` identical layers profiled at 8 samples."""
    g = LayerGraph(minibatch_size=8)
    g.add_node(Node("node0", "Input", 0.0, 0.0, (act_bytes,), 0.0))
    for i in range(1, layers + 1):
        g.add_node(Node(f"node{i}", "Linear", fwd_s, bwd_s, (act_bytes,), param_bytes))
        g.add_edge(f"node{i - 1}", f"node{i}")
    return g


def predict(g: LayerGraph, stage_nodes: list[list[str]], stage_ranks: list[list[int]], shape: EpochShape,
            cores: int | None, **costs: object) -> Prediction:
    """:func:`predict_epoch` on free 1 GB/s links, every rank on one host of ``cores`` cores (None: GPUs)."""
    ranks = sum(len(rs) for rs in stage_ranks)
    host = None if cores is None else Host(cores=cores, ranks_per_host=ranks)
    return predict_epoch(g, stage_nodes, stage_ranks, Cluster("c", [(ranks, 1e9)]), shape,
                         RunCosts(host=host, **costs))  # type: ignore[arg-type]


STRAIGHT = ([["node1"], ["node2"]], [[0], [1]])


def test_straight_two_stage_pipeline_on_one_core_by_hand() -> None:
    """2 stages, F = 1 s, B = 2 s each, 6 minibatches, free links. Alone (2 cores) the 1F1B run takes 21 s:
    each stage computes 6 x 3 = 18 s; stage 0 waits 3 s for gradients (its first backward's input comes after
    stage 1's first F and B, 3 s after its own F), stage 1 waits 1 s for its first input. On one core the two
    ranks share it: some rank always computes (the first waits only for the second's backward while the second
    computes it), so the core never idles and the epoch is all 2 x 6 x 3 = 36 s of work."""
    g = chain(2, 1.0, 2.0)
    shape = EpochShape("1f1b", 8, 1, 6, 48)
    two = predict(g, *STRAIGHT, shape, cores=2)
    assert two.epoch_s == pytest.approx(21.0)
    assert two.compute_s == pytest.approx([18.0, 18.0]) and two.wait_s == pytest.approx([3.0, 1.0])
    one = predict(g, *STRAIGHT, shape, cores=1)
    assert one.epoch_s == pytest.approx(36.0)
    assert all(18.0 < c <= 36.0 for c in one.compute_s)  # wall seconds: sharing the core stretches them
    assert predict(g, *STRAIGHT, shape, cores=None).epoch_s == pytest.approx(21.0)  # GPUs: no sharing


def test_loading_the_data_is_the_first_stages_forward_work() -> None:
    """The pipeline above on 2 cores (no sharing) with 0.5 s to load a profiled minibatch of ``chain``'s
    size: stage 0's F becomes 1 + 0.5 x 8 / minibatch_size s, so its 6 minibatches compute that much more."""
    g = chain(2, 1.0, 2.0)
    shape = EpochShape("1f1b", 8, 1, 6, 48)
    plain = predict(g, *STRAIGHT, shape, cores=2)
    loaded = predict(g, *STRAIGHT, shape, cores=2, data_s=0.5)
    extra = 0.5 * 8 / g.minibatch_size
    assert loaded.compute_s == pytest.approx([plain.compute_s[0] + 6 * extra, plain.compute_s[1]])


def test_composition_scales_the_layers_not_the_step_nor_the_data() -> None:
    """The pipeline above on 2 cores with a whole step 1.25x the layers' sum (``chain(2, 1, 2)``: 6 s at 8
    samples, so ``whole_step_s`` 7.5 s): every F and B is 1.25x, so the free-link epoch of 21 s becomes 26.25 s
    and each stage computes 6 x 3 x 1.25 s; the 0.5 s of data loading is not scaled."""
    g = chain(2, 1.0, 2.0)
    assert profiled_composition({"whole_step_s": 7.5}, g) == pytest.approx(1.25)
    assert profiled_composition({}, g) == 1.0
    shape = EpochShape("1f1b", 8, 1, 6, 48)
    run = predict(g, *STRAIGHT, shape, cores=2, composition=1.25, data_s=0.5)
    assert run.compute_s == pytest.approx([6 * (3 * 1.25 + 0.5), 6 * 3 * 1.25])
    assert predict(g, *STRAIGHT, shape, cores=2, composition=1.25).epoch_s == pytest.approx(21 * 1.25)


def test_lockstep_dp_on_one_core_takes_all_the_work() -> None:
    """2 DP workers, no weights, 4 minibatches of F + B = 2 x (1 + 2) = 6 s: both ranks compute at once all the
    time, so on 1 core each runs at half speed and the epoch is 2 minibatches x 6 s x 2 = 24 s = all 4 x 6 s of
    work; on GPUs, or spread over 2 hosts of 1 core each, 12 s."""
    g = chain(2, 1.0, 2.0)
    shape = EpochShape("dp", 8, 1, 4, 32)
    pred = predict(g, [["node1", "node2"]], [[0, 1]], shape, cores=1)
    assert pred.epoch_s == pytest.approx(24.0)
    assert pred.compute_s == pytest.approx([2 * 6 * 2])  # each rank: 2 minibatches of 6 s at half speed
    assert predict(g, [["node1", "node2"]], [[0, 1]], shape, cores=None).epoch_s == pytest.approx(12.0)
    spread = predict_epoch(g, [["node1", "node2"]], [[0, 1]], Cluster("c", [(2, 1e9)]), shape,
                           RunCosts(host=Host(cores=1, ranks_per_host=1)))
    assert spread.epoch_s == pytest.approx(12.0)


def test_shared_cores_never_compute_more_than_they_have() -> None:
    """4 stages on 2 cores with transfers as long as compute: the epoch is at least all the work over 2 cores
    and at most all of it on one, and no stage computes faster than alone or slower than on a core shared 2 ways."""
    g = chain(4, 1e-3, 2e-3, act_bytes=1e6, param_bytes=1e6)
    pred = predict(g, [["node1"], ["node2"], ["node3"], ["node4"]], [[0], [1], [2], [3]],
                   EpochShape("1f1b", 8, 1, 40, 320), cores=2)
    work = 4 * 40 * 3e-3
    assert work / 2 <= pred.epoch_s <= work
    assert all(40 * 3e-3 - 1e-9 <= c <= 2 * 40 * 3e-3 + 1e-9 for c in pred.compute_s)


def _cfg(**kw: object) -> TrainConfig:
    return TrainConfig(model="alexnet", batch_size=32, **kw)  # type: ignore[arg-type]


def test_epoch_shape_is_what_the_workers_train() -> None:
    # 1F1B-RR over a 3-1 plan: 2048 / 32 = 64 minibatches, rounded down to a multiple of 3 = 63 (2016 samples)
    assert epoch_shape(_cfg(), "pipedream", 2048, 4, [3, 1]) == EpochShape("1f1b", 32, 1, 63, 2016)
    assert epoch_shape(_cfg(schedule="gpipe", microbatches=4), "pipedream", 2048, 4, [3, 1]) == \
        EpochShape("gpipe", 8, 4, 64, 2048)
    assert epoch_shape(_cfg(schedule="pipedream_flush", microbatches=4, recompute=True), "pipedream", 2048, 4, [3, 1]) == \
        EpochShape("pipedream_flush", 8, 4, 64, 2048, recompute=True)
    # DP: per_worker, each worker a minibatch of 32 (64, a multiple of 4); global: 32 / 4 = 8 samples per worker
    assert epoch_shape(_cfg(), "dp", 2050, 4, [4]) == EpochShape("dp", 32, 1, 64, 2048)
    assert epoch_shape(_cfg(dp_batch="global"), "dp", 2048, 4, [4]) == EpochShape("dp", 8, 1, 64, 2048)


def test_emulated_links_replace_every_level() -> None:
    c = emulated_cluster(Cluster("A", [(4, 15e9), (2, 1e9)]), 1.25e8)
    assert c.levels == [(4, 1.25e8), (2, 1.25e8)] and c.name == "A"
    same = Cluster("B", [(4, 1e9)])
    assert emulated_cluster(same, None) is same


def test_step_rate_reads_the_profiles_meta(tmp_path: Path) -> None:
    (tmp_path / "meta.json").write_text(json.dumps({"minibatch_size": 8,
                                                    "optimizer_step_s_per_param_byte": {"sgd": 2e-10, "adam": 1e-9}}))
    assert step_rate(read_meta(tmp_path / "graph.txt"), "adam") == 1e-9
    (tmp_path / "meta.json").write_text(json.dumps({"minibatch_size": 8}))
    assert step_rate(read_meta(tmp_path / "graph.txt"), "sgd") is None


def test_optimizer_step_rates_leave_the_model_alone() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 10))
    before = [p.detach().clone() for p in model.parameters()]
    rates = optimizer_step_rates(model, torch.randn(4, 256))
    assert set(rates) == {"sgd", "adam", "muon"}
    assert all(math.isfinite(r) and r > 0 for r in rates.values())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert optimizer_step_rates(torch.nn.ReLU(), torch.randn(4, 3)) == {}


def test_optimizer_step_rates_time_only_the_optimizers_asked_for(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 10))
    rates = optimizer_step_rates(model, torch.randn(4, 64), optimizers=["adam"])
    assert list(rates) == ["adam"] and rates["adam"] > 0
    with pytest.raises(PipeDreamError, match="no optimizer-step rate for lamb"):
        optimizer_step_rates(model, torch.randn(4, 64), optimizers=["sgd", "lamb"])
    # a run whose optimizer the profile did not time is predicted without its step, and `train` says so
    (tmp_path / "meta.json").write_text(json.dumps({"minibatch_size": 8, "optimizer_step_s_per_param_byte": rates}))
    assert missing_step_rate(tmp_path / "graph.txt", "sgd") and not missing_step_rate(tmp_path / "graph.txt", "adam")
    (tmp_path / "meta.json").write_text(json.dumps({"minibatch_size": 8}))  # the release's profiles time none
    assert not missing_step_rate(tmp_path / "graph.txt", "sgd")


def test_a_run_whose_optimizer_the_profile_did_not_time_says_so(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    write_profile(chain(2, 1e-3, 2e-3, param_bytes=4e3), tmp_path, {"optimizer_step_s_per_param_byte": {"adam": 1e-9}})
    plan = Plan(model="alexnet", cluster="cpu4", workers=1, minibatch_size=8, time_per_sample_s=1.0,
                dp_time_per_sample_s=1.0, stages=[Stage(nodes=["node0", "node1", "node2"], replicas=1, ranks=[0])])
    args = argparse.Namespace(mode="dp", profile=tmp_path / "graph.txt", clusters="experiments/clusters.yaml",
                              nnodes=1)
    for optimizer, warned in (("sgd", True), ("adam", False)):
        prediction, why = _predict(args, _cfg(data="synthetic", train_subset=64, val_subset=32, optimizer=optimizer),
                                   plan)
        assert why is None and prediction["predicted_epoch_time_s"] > 0
        err = capsys.readouterr().err
        assert ("warning: the profile timed no sgd step" in err) is warned, err
        assert ("warning: the profile timed no" in err) is warned, err
        assert ("profile again with --optimizers sgd" in err) is warned


def test_a_failed_prediction_is_one_line_not_an_error(tmp_path: Path) -> None:
    args = argparse.Namespace(mode="pipedream", profile=None, clusters="experiments/clusters.yaml")
    cfg = _cfg(data="synthetic", train_subset=64, val_subset=32)
    assert _predict(args, cfg, None) == ({}, "no --plan and --profile to predict the epoch time from")
    plan = Plan(model="alexnet", cluster="no_such_cluster", workers=1, minibatch_size=8, time_per_sample_s=1.0,
                dp_time_per_sample_s=1.0, stages=[Stage(nodes=["node1"], replicas=1, ranks=[0])])
    args.profile = tmp_path / "graph.txt"  # missing
    prediction, why = _predict(args, cfg, plan)
    assert prediction == {} and why and "\n" not in why


def test_predicted_memory_of_a_run_by_hand() -> None:
    """chain(4) profiled at 8 samples, 800 activation bytes and 100 parameter bytes per layer, split 2 | 2
    layers (node0..2 | node3..4). At the run's batch 16 each layer stashes 1600 bytes."""
    g = chain(4, 1e-3, 2e-3, act_bytes=800.0, param_bytes=100.0)
    nodes = [["node0", "node1", "node2"], ["node3", "node4"]]
    # 1F1B, SGD momentum: stage 0 holds NOAM = 2 minibatches (each with its 1600-byte data and the buffer posted
    # for its 1600-byte output's gradient), 2 weight copies; stage 1 holds one, receives 1600 bytes and posts the
    # next 1600 ahead
    got = predict_memory(TrainConfig(model="alexnet", batch_size=16, momentum=0.9), "pipedream", g, nodes, [1, 1],
                         EpochShape("1f1b", 16, 1, 8, 128))
    assert [m["total"] for m in got] == [2 * 200 + 200 + 200 + 2 * (3200 + 1600 + 1600),
                                         200 + 200 + 200 + 3200 + 1600 + 1600]
    # GPipe, 4 microbatches of 4 samples (400 bytes a layer), Adam: one copy, two moments, 4 in flight
    got = predict_memory(TrainConfig(model="alexnet", batch_size=16, schedule="gpipe", microbatches=4, optimizer="adam"),
                         "pipedream", g,
                         nodes, [1, 1], EpochShape("gpipe", 4, 4, 8, 128))
    assert got[1] == {"weights": 200, "gradients": 200, "optimizer": 400, "activations": 4 * 800,
                      "buffers": 4 * 400 + 400, "total": 200 + 200 + 400 + 3200 + 1600 + 400}
    # PipeDream-Flush with recomputation, SGD without momentum: stage 0 holds min(4, 2) microbatches' inputs
    # (the 400-byte data and the posted buffer of its output's 400-byte gradient), and the activations of one
    # (2 x 400: without a record of saved tensors, every layer's output)
    got = predict_memory(TrainConfig(model="alexnet", batch_size=16, schedule="pipedream_flush", microbatches=4,
                                     momentum=0.0, recompute=True), "pipedream", g, nodes, [1, 1],
                         EpochShape("pipedream_flush", 4, 4, 8, 128, recompute=True))
    assert got[0] == {"weights": 200, "gradients": 200, "optimizer": 0, "activations": 800, "buffers": 2 * 800,
                      "total": 200 + 200 + 800 + 1600}


def test_the_optimizer_step_is_charged_after_each_minibatch_by_hand() -> None:
    """DP on 2 ranks of their own cores, 4 minibatches of F + B = 6 s, 1000 bytes of parameters a layer and SGD at
    1 ms a byte: each rank steps over both layers' 2000 bytes after each of its 2 minibatches, 2 s a step, so the
    epoch is 2 x (6 + 2) s plus two allreduces of 2000 bytes at 1 GB/s (microseconds): 16 s instead of 12."""
    g = chain(2, 1.0, 2.0, param_bytes=1000.0)
    shape = EpochShape("dp", 8, 1, 4, 32)
    stepped = predict(g, [["node1", "node2"]], [[0, 1]], shape, cores=2, step=StepRates("sgd", 1e-3))
    assert stepped.epoch_s == pytest.approx(16.0, rel=1e-3)
    assert predict(g, [["node1", "node2"]], [[0, 1]], shape, cores=2).epoch_s == pytest.approx(12.0, rel=1e-3)
    assert stepped.compute_s == pytest.approx([12.0])  # the step is not the forwards' and backwards' compute


def test_a_checkpoint_flushes_1f1b_but_adds_nothing_to_gpipe_by_hand() -> None:
    """2 stages, F = 1 s, B = 2 s, 6 minibatches (the 1F1B epoch of 21 s above). A segment of 4 minibatches alone takes
    15 s (3 s a minibatch after a 3 s fill and drain), so a checkpoint's flush adds 3 s; GPipe with one microbatch
    already drains after every minibatch (6 s each): nothing."""
    from pipedream.sim.predict import checkpoint_flush_s

    g = chain(2, 1.0, 2.0)
    for schedule, flush in (("1f1b", 3.0), ("gpipe", 0.0)):
        shape = EpochShape(schedule, 8, 1, 6, 48)
        pred = predict(g, *STRAIGHT, shape, cores=2)
        got = checkpoint_flush_s(g, *STRAIGHT, Cluster("c", [(2, 1e9)]), pred, RunCosts(host=Host(cores=2, ranks_per_host=2)))
        assert got == pytest.approx(flush), schedule
