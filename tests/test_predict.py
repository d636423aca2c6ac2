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
from pipedream.run_prediction import predict as _predict
from pipedream.run_prediction import resimulation_factors
from pipedream.runtime.config import TrainConfig
from pipedream.sim.cores import host_scale
from pipedream.sim.predict import (
    EpochShape,
    compute_concurrency,
    emulated_cluster,
    epoch_shape,
    predict_epoch,
    predict_memory,
)
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


def test_host_scale_is_runnable_threads_over_cores_and_never_below_one() -> None:
    assert host_scale(4, 1, 2) == 2.0
    assert host_scale(3, 2, 4) == 1.5
    assert host_scale(1, 1, 2) == 1.0  # one rank on two cores runs at full speed, no faster


def test_host_scale_adds_the_measured_contention_as_the_cores_fill() -> None:
    assert host_scale(1, 1, 2, contention=1.2) == 1.0  # one thread computing: nothing to contend with
    assert host_scale(1.5, 1, 2, contention=1.2) == pytest.approx(1.1)  # half-way to both cores busy
    assert host_scale(4, 1, 2, contention=1.2) == pytest.approx(2.4)  # both busy, each shared by two ranks
    assert host_scale(3, 1, 5, contention=1.4) == pytest.approx(1.2)  # 2 of the 4 steps from 1 to 5 threads
    assert host_scale(8, 1, 1, contention=1.4) == 8.0  # one core: no copies on other cores


def test_host_scale_takes_the_oversubscribed_slowdown_from_full_cores_to_two_threads_per_core() -> None:
    # 2 cores, contention 1.1 with both busy, 1.3 per fair share with 4 threads (two per core)
    assert host_scale(2, 1, 2, contention=1.1, oversubscribed=1.3) == pytest.approx(1.1)  # cores just full
    assert host_scale(3, 1, 2, contention=1.1, oversubscribed=1.3) == pytest.approx(1.5 * 1.2)  # half-way
    assert host_scale(4, 1, 2, contention=1.1, oversubscribed=1.3) == pytest.approx(2 * 1.3)  # measured point
    assert host_scale(6, 1, 2, contention=1.1, oversubscribed=1.3) == pytest.approx(3 * 1.3)  # no more beyond
    assert host_scale(1.5, 1, 2, contention=1.1, oversubscribed=1.3) == pytest.approx(1.05)  # below: unchanged
    assert host_scale(2, 2, 2, contention=1.1, oversubscribed=1.3) == pytest.approx(2.6)  # threads count too


def test_compute_concurrency_by_hand() -> None:
    assert compute_concurrency([(0, 2), (1, 3)]) == pytest.approx(6 / 4)  # n = 1, 2, 1 over 1 s each
    assert compute_concurrency([(0, 1)] * 4) == pytest.approx(4)  # lockstep: every unit of compute sees 4
    assert compute_concurrency([(0, 1), (1, 2)]) == pytest.approx(1)  # one after the other
    assert compute_concurrency([]) == 0.0
    # per stage: only the flagged spans' compute is weighted; the others still count in n(t)
    assert compute_concurrency([(0, 2), (1, 3)], [True, False]) == pytest.approx((1 * 1 + 1 * 2) / 2)
    assert compute_concurrency([(0, 1), (0, 1), (1, 3)], [False, False, True]) == pytest.approx(1.0)  # alone
    assert compute_concurrency([(0, 1), (0, 1), (0, 4)], [False, False, True]) == pytest.approx((3 + 3) / 4)


def test_straight_two_stage_pipeline_on_one_core_by_hand() -> None:
    """2 stages, F = 1 s, B = 2 s each, 6 minibatches, free links. Alone (2 cores) the 1F1B run takes 21 s. On
    one core the two ranks share it: some rank always computes (the first waits only for the second's backward
    while the second computes it), so the core never idles and the epoch is all 2 x 6 x 3 = 36 s of work; each
    stage's forwards and backwards then take longer than their 18 s of work, by the factor ``f_s``."""
    g = chain(2, 1.0, 2.0)
    shape = EpochShape("1f1b", 8, 1, 6, 48)
    one = predict_epoch(g, [["node1"], ["node2"]], [[0], [1]], Cluster("c", [(2, 1e9)]), shape, cores=1)
    assert one.epoch_s == pytest.approx(36.0)
    assert one.compute_s == pytest.approx([18 * f for f in one.compute_scale])
    assert all(1.0 < f <= 2.0 for f in one.compute_scale)
    two = predict_epoch(g, [["node1"], ["node2"]], [[0], [1]], Cluster("c", [(2, 1e9)]), shape, cores=2)
    assert two.compute_scale == [1.0, 1.0] and two.epoch_s == pytest.approx(21.0)
    # the work at full speed is each stage's 6 x 3 s, shared cores or not (no optimizer step: no rate)
    assert one.work_s == pytest.approx([18.0, 18.0]) and two.work_s == pytest.approx([18.0, 18.0])


def test_loading_the_data_is_the_first_stages_forward_work() -> None:
    """The pipeline above on 2 cores (no sharing) with 0.5 s to load a profiled minibatch of ``chain``'s
    size: stage 0's F becomes 1 + 0.5 x 8 / minibatch_size s, so its 6 minibatches compute that much more."""
    g = chain(2, 1.0, 2.0)
    shape = EpochShape("1f1b", 8, 1, 6, 48)
    plain = predict_epoch(g, [["node1"], ["node2"]], [[0], [1]], Cluster("c", [(2, 1e9)]), shape, cores=2)
    loaded = predict_epoch(g, [["node1"], ["node2"]], [[0], [1]], Cluster("c", [(2, 1e9)]), shape, cores=2,
                           data_s=0.5)
    extra = 0.5 * 8 / g.minibatch_size
    assert loaded.compute_s == pytest.approx([plain.compute_s[0] + 6 * extra, plain.compute_s[1]])


def test_composition_scales_the_layers_not_the_step_nor_the_data() -> None:
    """The pipeline above on 2 cores with a whole step 1.25x the layers' sum (``chain(2, 1, 2)``: 6 s at 8
    samples, so ``whole_step_s`` 7.5 s): every F and B is 1.25x, so the free-link epoch of 21 s becomes 26.25 s
    and each stage computes 6 x 3 x 1.25 s; the 0.5 s of data loading is not scaled."""
    g = chain(2, 1.0, 2.0)
    assert profiled_composition({"whole_step_s": 7.5}, g) == pytest.approx(1.25)
    assert profiled_composition({}, g) == 1.0
    # the host probe's copies stepped 9 s on average over all its rounds: their step, not the one 7.5 s window
    assert profiled_composition({"whole_step_s": 7.5, "host": {"copy_step_s": 9.0}}, g) == pytest.approx(1.5)
    assert profiled_composition({"whole_step_s": 7.5, "host": {"cores": 2}}, g) == pytest.approx(1.25)
    shape = EpochShape("1f1b", 8, 1, 6, 48)
    run = predict_epoch(g, [["node1"], ["node2"]], [[0], [1]], Cluster("c", [(2, 1e9)]), shape, cores=2,
                        composition=1.25, data_s=0.5)
    assert run.compute_s == pytest.approx([6 * (3 * 1.25 + 0.5), 6 * 3 * 1.25])
    bare = predict_epoch(g, [["node1"], ["node2"]], [[0], [1]], Cluster("c", [(2, 1e9)]), shape, cores=2,
                         composition=1.25)
    assert bare.epoch_s == pytest.approx(21 * 1.25)


def test_a_resimulation_scales_each_stages_compute_with_its_data() -> None:
    """The pipeline above on 2 cores, free links. Factors of 1 are the prediction. Factors (2, 2) double every F
    and B, so every time of the schedule: 21 s becomes 42 s; with 0.5 s of data per profiled minibatch of 8, the
    data doubles too (stage 0 computes 6 x (3 + 0.5) x 2 s). Factors (1, 3): stage 1's F = 3, B = 6 s, run back to
    back for each minibatch from its first input at 1 s (stage 0's later forwards come long before they are
    needed): 1 + 6 x 9 = 55 s, then stage 0's last backward of 2 s, 57 s."""
    g = chain(2, 1.0, 2.0)
    shape = EpochShape("1f1b", 8, 1, 6, 48)
    stages, ranks, cluster = [["node1"], ["node2"]], [[0], [1]], Cluster("c", [(2, 1e9)])
    plain = predict_epoch(g, stages, ranks, cluster, shape, cores=2, data_s=0.5)
    same = predict_epoch(g, stages, ranks, cluster, shape, cores=2, data_s=0.5, compute_factors=[1.0, 1.0])
    assert same.epoch_s == pytest.approx(plain.epoch_s) and same.compute_s == pytest.approx(plain.compute_s)
    double = predict_epoch(g, stages, ranks, cluster, shape, cores=2, compute_factors=[2.0, 2.0])
    assert double.epoch_s == pytest.approx(42.0)
    loaded = predict_epoch(g, stages, ranks, cluster, shape, cores=2, data_s=0.5, compute_factors=[2.0, 2.0])
    assert loaded.compute_s == pytest.approx([6 * (3 + 0.5) * 2, 6 * 3 * 2])
    slow_last = predict_epoch(g, stages, ranks, cluster, shape, cores=2, compute_factors=[1.0, 3.0])
    assert slow_last.epoch_s == pytest.approx(57.0)
    with pytest.raises(PipeDreamError, match="one positive factor per stage"):
        predict_epoch(g, stages, ranks, cluster, shape, cores=2, compute_factors=[1.0])
    with pytest.raises(PipeDreamError, match="one positive factor per stage"):
        predict_epoch(g, stages, ranks, cluster, shape, cores=2, compute_factors=[1.0, 0.0])


def test_a_resimulation_shares_the_cores_fairly_and_draws_no_layouts() -> None:
    """The measured CPU already holds the host's sharing costs and the ranks' layouts: with factors, a host
    contention of 1.3 (both ranks compute at once on the 2 cores) and layout draws of 0.5 and 1.5 change nothing,
    and the pipeline above takes its hand-computed 21 s (42 s at factors 2). Without factors they slow it."""
    g = chain(2, 1.0, 2.0)
    shape = EpochShape("1f1b", 8, 1, 6, 48)
    stages, ranks, cluster = [["node1"], ["node2"]], [[0], [1]], Cluster("c", [(2, 1e9)])
    host = {"contention": 1.3, "oversubscribed": 1.6, "layouts": (0.5, 1.5)}
    assert predict_epoch(g, stages, ranks, cluster, shape, cores=2, **host).epoch_s > 21.5
    resim = predict_epoch(g, stages, ranks, cluster, shape, cores=2, compute_factors=[1.0, 1.0], **host)
    assert resim.epoch_s == pytest.approx(21.0)
    assert (resim.contention, resim.oversubscribed) == (1.0, 1.0)
    assert predict_epoch(g, stages, ranks, cluster, shape, cores=2, compute_factors=[2.0, 2.0],
                         **host).epoch_s == pytest.approx(42.0)


def test_resimulation_factors_are_the_measured_compute_cpu_over_the_predicted_work() -> None:
    final = {"predicted_compute_s_stage0": 9.0, "measured_compute_cpu_s_stage0": 3.0,
             "predicted_compute_work_s_stage0": 2.0, "predicted_compute_s_stage1": 9.0,
             "measured_compute_cpu_s_stage1": 1.0, "predicted_compute_work_s_stage1": 4.0}
    assert resimulation_factors(final) == pytest.approx([1.5, 0.25])
    del final["measured_compute_cpu_s_stage1"]  # a stage without its CPU (a GPU run): no resimulation
    assert resimulation_factors(final) is None
    assert resimulation_factors({}) is None  # no prediction


def test_lockstep_dp_on_one_core_takes_all_the_work() -> None:
    """2 DP workers, no weights, 4 minibatches of F + B = 2 x (1 + 2) = 6 s: both ranks compute at once all the
    time (C = 2), so on 1 core f = 2 and the epoch is 2 minibatches x 6 s x 2 = 24 s = all 4 x 6 s of work."""
    g = chain(2, 1.0, 2.0)
    pred = predict_epoch(g, [["node1", "node2"]], [[0, 1]], Cluster("c", [(2, 1e9)]), EpochShape("dp", 8, 1, 4, 32),
                         cores=1)
    assert pred.concurrency == pytest.approx([2.0])
    assert pred.epoch_s == pytest.approx(24.0)
    assert pred.compute_s == pytest.approx([2 * 6 * 2])  # each rank: 2 minibatches of 6 s at factor 2
    assert pred.work_s == pytest.approx([2 * 6])  # ... of which 2 x 6 s is work


def test_shared_cores_never_compute_more_than_they_have() -> None:
    """4 stages on 2 cores with transfers as long as compute: the epoch is at least all the work over 2 cores
    and at most all of it on one, and no stage computes faster than alone or slower than on a core shared 2 ways."""
    g = chain(4, 1e-3, 2e-3, act_bytes=1e6, param_bytes=1e6)
    cluster = Cluster("slow", [(4, 1e9)])
    pred = predict_epoch(g, [["node1"], ["node2"], ["node3"], ["node4"]], [[0], [1], [2], [3]], cluster,
                         EpochShape("1f1b", 8, 1, 40, 320), cores=2)
    work = 4 * 40 * 3e-3
    assert work / 2 <= pred.epoch_s <= work
    assert all(1.0 <= f <= 2.0 for f in pred.compute_scale)


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


def test_no_sharing_on_gpus_and_per_host_sharing() -> None:
    """The lockstep DP of 2 ranks above: on GPUs (cores None) nothing is shared, 12 s; spread over 2 hosts of
    1 core each, each host runs C / 2 = 1 rank at a time: no slowdown either."""
    g = chain(2, 1.0, 2.0)
    args = ([["node1", "node2"]], [[0, 1]], Cluster("c", [(2, 1e9)]), EpochShape("dp", 8, 1, 4, 32))
    assert predict_epoch(g, *args, cores=None).epoch_s == pytest.approx(12.0)
    assert predict_epoch(g, *args, cores=1, hosts=2).epoch_s == pytest.approx(12.0)


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


def test_the_optimizer_steps_work_per_stage_by_hand() -> None:
    """The straight 2-stage 1F1B pipeline above with 1000 bytes of parameters a layer and SGD at 1 ms a byte:
    6 minibatches, so 6 steps a stage. Stage 0 keeps 2 weight versions and copies on write (COPY_TRAFFIC /
    STEP_TRAFFIC["sgd"] = 2 / 6 more): 6 x 1.0 s x (1 + 1/3) = 8 s; stage 1 keeps one: 6 x 1.0 s = 6 s. Both are in
    the stages' work, beside the 18 s of forwards and backwards. DP on 2 ranks, 4 minibatches: 2 steps a rank over
    both layers' 2000 bytes, no copy: 4 s."""
    g = chain(2, 1.0, 2.0, param_bytes=1000.0)
    shape = EpochShape("1f1b", 8, 1, 6, 48)
    pred = predict_epoch(g, [["node1"], ["node2"]], [[0], [1]], Cluster("c", [(2, 1e9)]), shape, cores=2,
                         step=StepRates("sgd", 1e-3))
    assert pred.step_work_s == pytest.approx([6 * 1.0 * (1 + 2 / 6), 6 * 1.0])
    assert pred.work_s == pytest.approx([18 + 8, 18 + 6])
    assert pred.to_dict()["step_work_s"] == pytest.approx([8.0, 6.0])
    dp = predict_epoch(g, [["node1", "node2"]], [[0, 1]], Cluster("c", [(2, 1e9)]), EpochShape("dp", 8, 1, 4, 32),
                       cores=2, step=StepRates("sgd", 1e-3))
    assert dp.step_work_s == pytest.approx([2 * 2.0])
