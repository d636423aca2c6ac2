"""The host's measurements of a training step: copies at once against each alone, and where copies land."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

import pipedream.host_timing as host_timing
from pipedream.host_timing import Sharing, host_contention
from pipedream.paths import REPO


def _sleep() -> None:
    time.sleep(0.005)


def _sleeper() -> Callable[[], None]:  # what each fresh process steps (module level: spawned processes import it)
    return _sleep


def _rounds(pairs: Callable[[int], list[tuple[float, float]]]):  # type: ignore[no-untyped-def]
    """A stand-in for the children's rounds: each round runs ``before_round()`` then gives, for each count n, the
    first n copies' times together from ``pairs(n)``, and every copy's time alone from the largest count's."""
    def fake(fresh, counts, rounds, seconds, min_steps, before_round):  # type: ignore[no-untyped-def]
        out = []
        for _ in range(rounds):
            before_round()
            got = {n: pairs(n) for n in counts}
            alone = [a for _, a in got[max(counts)]]
            out.append(({n: [t for t, _ in p] for n, p in got.items()}, alone, [{} for _ in alone]))
        return out
    return fake


def _copies(alone: Callable[[int, int], float],
            updates: Callable[[int, int], dict[str, float]] = lambda r, j: {}):  # type: ignore[no-untyped-def]
    """A stand-in for the children's rounds from every copy's own figures: copy ``j`` of round ``r`` steps alone in
    ``alone(r, j)`` s and twice that together, and its optimizer steps take ``updates(r, j)``."""
    def fake(fresh, counts, rounds, seconds, min_steps, before_round):  # type: ignore[no-untyped-def]
        out = []
        for r in range(rounds):
            before_round()
            a = [alone(r, j) for j in range(max(counts))]
            out.append(({n: [2 * x for x in a[:n]] for n in counts}, a, [updates(r, j) for j in range(max(counts))]))
        return out
    return fake


def test_copies_of_a_step_that_only_sleeps_contend_for_nothing() -> None:
    """Fresh processes sleeping 5 ms a step: together as fast as alone, and each as fast as this process."""
    got = host_contention(_sleep, _sleeper, 2, seconds=0.6, rounds=2)
    assert 0.8 < got.slowdown < 1.3
    assert len(got.layouts) == 4  # two copies in each of two rounds
    assert all(0.7 < p < 1.4 for p in got.layouts)
    assert 0.004 < got.alone_s < 0.008


def test_the_host_has_the_cores_this_process_may_run_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under taskset or a cpuset of 4 of a machine's 16 cores a run has 4 cores for its workers, not 16; where the
    platform has no affinity, the machine's count; never 0."""
    monkeypatch.setattr(host_timing.os, "cpu_count", lambda: 16)
    monkeypatch.setattr(host_timing.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert host_timing.host_cores() == 4
    monkeypatch.delattr(host_timing.os, "sched_getaffinity")
    assert host_timing.host_cores() == 16
    monkeypatch.setattr(host_timing.os, "cpu_count", lambda: None)
    assert host_timing.host_cores() == 1


def test_the_last_level_cache_is_the_largest_size_sysfs_gives(tmp_path: Path) -> None:
    """The 2-core CI VM's sysfs: L1d and L1i 32K, L2 1024K, L3 32768K: 32 MiB; a size without a unit is bytes, an
    unreadable one is skipped; no cache directory: None."""
    for index, size in enumerate(["32K", "32K", "1024K", "32768K", "garbage"]):
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "size").write_text(size + "\n")
    (tmp_path / "index9").mkdir()  # no size file
    assert host_timing.last_level_cache_bytes(str(tmp_path)) == 32 << 20
    (tmp_path / "index5").mkdir()
    (tmp_path / "index5" / "size").write_text("40000000")
    assert host_timing.last_level_cache_bytes(str(tmp_path)) == 40_000_000
    assert host_timing.last_level_cache_bytes(str(tmp_path / "none")) is None


def _logged_sleeper(log: str) -> Callable[[], None]:  # each call appends this process's pid to ``log``
    with open(log, "a") as f:
        f.write(f"{os.getpid()}\n")
    return _sleep


def test_the_copies_start_once_and_build_a_new_step_every_round(tmp_path: Path) -> None:
    """3 rounds with counts (2, 3): 3 processes in all (their imports and data loading paid once), each building a
    step in every round (a new memory layout every round), 3 times; this process's own timing runs once a round,
    after every copy built that round's step. Each round gives the first 2 copies' times together with 2, all 3
    copies' together with 3, and each copy's alone."""
    log = tmp_path / "fresh.log"
    calls: list[int] = []
    rounds = host_timing._together_then_alone(
        functools.partial(_logged_sleeper, str(log)), (2, 3), 3, 0.06, 2,
        before_round=lambda: calls.append(len(log.read_text().split())))
    pids = log.read_text().split()
    assert len(set(pids)) == 3 and sorted(pids.count(p) for p in set(pids)) == [3, 3, 3]
    assert calls == [3, 6, 9]
    assert len(rounds) == 3
    for together, alone, updates in rounds:
        assert sorted(together) == [2, 3] and len(together[2]) == 2 and len(together[3]) == 3 and len(alone) == 3
        assert all(0.004 < t < 0.05 for t in [*together[2], *together[3], *alone])
        assert updates == [{}, {}, {}]  # a step without optimizer steps


def _interval_step(log: str) -> None:  # sleeps 5 ms and appends "pid start end" to ``log``
    t0 = time.monotonic()
    time.sleep(0.005)
    with open(log, "a") as f:
        f.write(f"{os.getpid()} {t0} {time.monotonic()}\n")


def _interval_stepper(log: str) -> Callable[[], None]:
    return functools.partial(_interval_step, log)


def test_the_copies_step_together_only_in_their_count_and_alone_one_at_a_time(tmp_path: Path) -> None:
    """Every step of every process logged as a time interval, counts (2, 3), 2 rounds: this process's own steps
    overlap no copy's; at most 3 copies step at once, and 3 do; every copy has steps that overlap no other's (its
    time alone)."""
    log = tmp_path / "steps.log"
    host_timing.host_sharing(functools.partial(_interval_step, str(log)),
                             functools.partial(_interval_stepper, str(log)), (2, 3), seconds=0.2, rounds=2)
    steps = [(int(p), float(a), float(b)) for p, a, b in (line.split() for line in log.read_text().splitlines())]
    me = os.getpid()
    copies = {p for p, _, _ in steps} - {me}
    assert len(copies) == 3

    def others(i: int) -> set[int]:  # the processes stepping while step i runs
        p, a, b = steps[i]
        return {q for q, c, d in steps if q != p and c < b and d > a}

    beside = [others(i) for i in range(len(steps))]
    assert not any(beside[i] for i, (p, _, _) in enumerate(steps) if p == me)
    assert max(len(o) for o in beside) == 2
    assert {p for i, (p, _, _) in enumerate(steps) if not beside[i]} >= copies


def test_each_count_is_measured_in_turn_by_the_same_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    """``host_sharing`` with counts (2, 4) on 2 cores: one measurement per count, in order; copies stepping 3 ms
    together and 1.5 ms alone are 2x themselves with 2 copies (all contention) and 2x over their half core with
    4 (1.0); a count below 2 measures nothing, wherever it stands."""
    monkeypatch.setattr(host_timing, "host_cores", lambda: 2)
    monkeypatch.setattr(host_timing, "_mean_step_s", lambda step, seconds, min_steps: 1e-3)
    monkeypatch.setattr(host_timing, "_together_then_alone", _rounds(lambda n: [(3e-3, 1.5e-3)] * n))
    one, none, two = host_timing.host_sharing(lambda: None, lambda: lambda: None, (2, 1, 4), rounds=3)
    assert one.slowdown == pytest.approx(2.0) and len(one.layouts) == 6
    assert two.slowdown == pytest.approx(1.0) and len(two.layouts) == 12
    assert none == Sharing(1.0, ())


@pytest.mark.slow
def test_the_copies_die_with_the_profiling_process(tmp_path: Path) -> None:
    """A profile killed while its copies time 30 s windows leaves none of them behind."""
    log = tmp_path / "fresh.log"
    code = ("import functools; from pipedream.host_timing import host_contention; "
            "from tests.test_host_timing import _logged_sleeper, _sleep; "
            f"host_contention(_sleep, functools.partial(_logged_sleeper, {str(log)!r}), 2, seconds=600)")
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        while len(log.read_text().split() if log.exists() else []) < 2:
            assert time.monotonic() < deadline and parent.poll() is None, "the copies did not start"
            time.sleep(0.1)
        time.sleep(0.5)  # in their rounds now
    finally:
        parent.kill()
        parent.wait()
    pids = [int(p) for p in log.read_text().split()]

    def gone(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    deadline = time.monotonic() + 10
    while not all(gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(gone(p) for p in pids)


def test_one_copy_measures_nothing() -> None:
    assert host_contention(_sleep, lambda: _sleep, 1) == Sharing(1.0, ())


@pytest.mark.parametrize(("processes", "slowdown"), [(2, 2.4), (4, 1.2), (3, 1.6)])
def test_the_ratio_is_each_copy_against_itself_over_its_fair_share(monkeypatch: pytest.MonkeyPatch,
                                                                   processes: int, slowdown: float) -> None:
    """Copies that step 1.5 ms alone (this process: 1 ms) and 3.6 ms together: 2.4x themselves. With one copy per
    core (2 on 2 cores) that is all contention; with two per core (4 on 2) each gets half a core, which
    processor sharing already explains: 2.4 / 2 = 1.2; 3 copies on 2 cores: 2.4 / 1.5 = 1.6. Their memory layout is
    1.5x this process's, and does not enter the ratio."""
    monkeypatch.setattr(host_timing, "host_cores", lambda: 2)
    monkeypatch.setattr(host_timing, "_mean_step_s", lambda step, seconds, min_steps: 1e-3)
    monkeypatch.setattr(host_timing, "_together_then_alone", _rounds(lambda n: [(3.6e-3, 1.5e-3)] * n))
    got = host_contention(lambda: None, lambda: lambda: None, processes, rounds=3)
    assert got.slowdown == pytest.approx(slowdown)
    assert got.layouts == pytest.approx((1.5,) * (3 * processes))
    assert got.alone_s == pytest.approx(1.5e-3)


def test_every_copys_step_alone_is_kept_round_by_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two rounds of counts (2, 4): copy j of round r steps alone in (r + 1) ms + j x 0.1 ms (this process: 2 ms).
    Each count keeps its own copies' steps alone, round by round in the layouts' order (count 2: copies 0 and 1 of
    each round), and their mean is the mean step alone: count 4 (1.15 + 2.15) / 2 = 1.65 ms."""
    monkeypatch.setattr(host_timing, "host_cores", lambda: 2)
    monkeypatch.setattr(host_timing, "_mean_step_s", lambda step, seconds, min_steps: 2e-3)
    monkeypatch.setattr(host_timing, "_together_then_alone", _copies(lambda r, j: (r + 1) * 1e-3 + j * 1e-4))
    one, two = host_timing.host_sharing(lambda: None, lambda: lambda: None, (2, 4), rounds=2)
    assert one.alone == pytest.approx((1.0e-3, 1.1e-3, 2.0e-3, 2.1e-3))
    assert two.alone == pytest.approx((1.0e-3, 1.1e-3, 1.2e-3, 1.3e-3, 2.0e-3, 2.1e-3, 2.2e-3, 2.3e-3))
    assert two.alone_s == pytest.approx(1.65e-3)
    assert two.layouts == pytest.approx(tuple(a / 2e-3 for a in two.alone))


def test_the_rounds_median_keeps_a_burst_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three rounds measure 1.1, 3.0 (another process burst in) and 1.2: the slowdown is 1.2."""
    monkeypatch.setattr(host_timing, "host_cores", lambda: 2)
    monkeypatch.setattr(host_timing, "_mean_step_s", lambda step, seconds, min_steps: 1.0)
    rounds = iter([1.1, 3.0, 1.2])
    monkeypatch.setattr(host_timing, "_together_then_alone", _rounds(lambda n: [(next(rounds), 1.0)] * 1))
    assert host_contention(lambda: None, lambda: lambda: None, 2, rounds=3).slowdown == pytest.approx(1.2)


def test_five_rounds_keep_two_bursts_out_and_record_every_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default five rounds measure 1.1, 3.0, 1.2, 2.5 and 1.15: the median 1.2 ignores both bursts (of three
    rounds, two bursts would have set it), and every round is kept, in order."""
    monkeypatch.setattr(host_timing, "host_cores", lambda: 2)
    monkeypatch.setattr(host_timing, "_mean_step_s", lambda step, seconds, min_steps: 1.0)
    rounds = iter([1.1, 3.0, 1.2, 2.5, 1.15])
    monkeypatch.setattr(host_timing, "_together_then_alone", _rounds(lambda n: [(next(rounds), 1.0)] * 1))
    got = host_contention(lambda: None, lambda: lambda: None, 2)
    assert got.slowdown == pytest.approx(1.2)
    assert got.rounds == pytest.approx((1.1, 3.0, 1.2, 2.5, 1.15))


def test_copies_that_got_unequal_shares_count_by_their_total_throughput(monkeypatch: pytest.MonkeyPatch) -> None:
    """4 copies on 2 cores, each 1 ms alone; in the window together one got a quarter of a core (4 ms a step), the
    other three 0.5, 0.5 and 0.75 of a core (2, 2 and 1.33 ms). Their speeds add up to
    0.25 + 0.5 + 0.5 + 0.75 = 2 cores: the host lost nothing, slowdown 1.0 (the mean of the ratios over the fair
    share, (4 + 2 + 2 + 1.33) / 4 / 2 = 1.17, would count the scheduler's unevenness as contention)."""
    monkeypatch.setattr(host_timing, "host_cores", lambda: 2)
    monkeypatch.setattr(host_timing, "_mean_step_s", lambda step, seconds, min_steps: 1e-3)
    monkeypatch.setattr(host_timing, "_together_then_alone", _rounds(lambda n:
                        [(4e-3, 1e-3), (2e-3, 1e-3), (2e-3, 1e-3), (1e-3 / 0.75, 1e-3)]))
    assert host_contention(lambda: None, lambda: lambda: None, 4, rounds=1).slowdown == pytest.approx(1.0)


def test_a_copy_builds_a_new_model_and_minibatch_every_round_on_data_loaded_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`pipedream profile`'s fresh step (commands/profile.worker_step, called by each copy every round): a new
    model and minibatch each call (a memory layout of its own), the data sets loaded by the first call only."""
    import torch

    import pipedream.runtime.task as task_module
    from pipedream.commands import profile as profile_cmd
    from pipedream.runtime.config import TrainConfig

    loads: list[int] = []
    real = task_module.load_datasets

    def counted(cfg):  # type: ignore[no-untyped-def]
        loads.append(1)
        return real(cfg)

    monkeypatch.setattr(task_module, "load_datasets", counted)
    monkeypatch.setattr(profile_cmd, "_DATASETS", {})
    cfg = TrainConfig(model="alexnet", preset="reduced", data="synthetic", train_subset=8, val_subset=4,
                      batch_size=4)
    built: list[object] = []
    monkeypatch.setattr(profile_cmd, "runtime_step", lambda model, criterion, x, y:
                        built.append((model, x)) or types.SimpleNamespace(params=[], grads=[]))
    for _ in range(3):
        profile_cmd.worker_step(cfg, [0, 1, 2, 3], 1)
    assert loads == [1] and len(built) == 3
    models, inputs = [m for m, _ in built], [x for _, x in built]
    assert len({id(m) for m in models}) == 3 and len({x.data_ptr() for x in inputs}) == 3
    assert all(torch.equal(x, inputs[0]) for x in inputs)  # the same rows of the same data


def _update(log: str, seconds: float) -> None:  # an optimizer step: sleeps, appends "pid start end" to ``log``
    t0 = time.monotonic()
    time.sleep(seconds)
    with open(log, "a") as f:
        f.write(f"{os.getpid()} {t0} {time.monotonic()}\n")


def _updating_stepper(log: str, updates_log: str) -> Callable[[], None]:
    """A copy's step (5 ms, logged to ``log``) that carries a 20 ms SGD step (logged to ``updates_log``)."""
    step = functools.partial(_interval_step, log)
    step.updates = {"sgd": functools.partial(_update, updates_log, 0.02)}  # type: ignore[attr-defined]
    return step


def test_every_copy_times_its_optimizer_step_alone_once_a_round(tmp_path: Path) -> None:
    """Counts (2,), 2 rounds, a step that carries a 20 ms SGD step: each copy steps the optimizer twice a round (an
    untimed first step, then the timed one), while no other process steps anything; the 4 timings (2 copies x 2
    rounds) are kept in ``updates``, each about 20 ms."""
    log, updates_log = tmp_path / "steps.log", tmp_path / "updates.log"
    got = host_timing.host_sharing(functools.partial(_interval_step, str(log)),
                                   functools.partial(_updating_stepper, str(log), str(updates_log)), (2,),
                                   seconds=0.1, rounds=2)[0]
    assert set(got.updates) == {"sgd"} and len(got.updates["sgd"]) == 4
    assert all(0.02 <= t < 0.06 for t in got.updates["sgd"])
    steps = [(int(p), float(a), float(b)) for p, a, b in (line.split() for line in log.read_text().splitlines())]
    updates = [(int(p), float(a), float(b)) for p, a, b in
               (line.split() for line in updates_log.read_text().splitlines())]
    assert sorted({p for p, _, _ in updates}) == sorted({p for p, _, _ in steps} - {os.getpid()})
    assert all([p for p, _, _ in updates].count(q) == 4 for q, _, _ in updates)
    assert not any(q != p and c < b and d > a for p, a, b in updates for q, c, d in steps)


def test_an_optimizer_step_is_timed_after_an_untimed_one_and_a_training_step() -> None:
    """The first optimizer step creates its state (50 ms here) and is not timed; a training step then leaves the
    caches as a worker's step does; the second (5 ms) is the timing."""
    calls: list[str] = []

    def step() -> None:
        calls.append("step")

    def update() -> None:
        calls.append("update")
        time.sleep(0.05 if calls.count("update") == 1 else 0.005)

    step.updates = {"adam": update}  # type: ignore[attr-defined]
    got = host_timing._update_s(step)
    assert calls == ["update", "step", "update"]
    assert 0.005 <= got["adam"] < 0.04
    assert host_timing._update_s(_sleep) == {}


def test_a_count_keeps_the_optimizer_steps_of_its_own_copies_over_every_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counts (2, 4), 2 rounds, copy i's Adam step i + 1 ms in round 0 and 2 (i + 1) ms in round 1: the count of 2
    keeps copies 0 and 1 of both rounds (1, 2, 2, 4 ms), the count of 4 all eight."""
    monkeypatch.setattr(host_timing, "host_cores", lambda: 2)
    monkeypatch.setattr(host_timing, "_mean_step_s", lambda step, seconds, min_steps: 1e-3)
    monkeypatch.setattr(host_timing, "_together_then_alone",
                        _copies(lambda r, j: 1e-3, lambda r, j: {"adam": (r + 1) * (j + 1) * 1e-3}))
    two, four = host_timing.host_sharing(lambda: None, lambda: lambda: None, (2, 4), rounds=2)
    assert two.updates == {"adam": pytest.approx((1e-3, 2e-3, 2e-3, 4e-3))}
    assert four.updates == {"adam": pytest.approx((1e-3, 2e-3, 3e-3, 4e-3, 2e-3, 4e-3, 6e-3, 8e-3))}


def test_the_profile_takes_the_copies_mean_optimizer_step_as_its_rate(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """`pipedream profile` with the host probe: the copies (here a stand-in whose four Adam steps took 10, 12, 14
    and 24 ms) make the whole model's step their mean, 15 ms: with a step's call at 1 ms and each of the model's
    tensors at 0.1 ms (a stand-in for the timed overheads), ``optimizer_step_s_per_param_byte`` is the rest over the
    model's parameter bytes; the profiling process's own rate is kept under ``host``, and every copy's optimizer
    step and training step alone; the copies' steps carry Adam's step (the optimizer asked for)."""
    import json

    import pipedream.runtime.message_cost as message_cost
    import pipedream.step_rates as step_rates
    from pipedream.cli import build_parser
    from pipedream.commands import profile as profile_cmd
    from pipedream.runtime.config import TrainConfig
    from pipedream.runtime.task import load_task

    asked: list[tuple[str, ...]] = []

    def probe(step, fresh, counts, seconds):  # type: ignore[no-untyped-def]
        asked.append(fresh.args[3])
        one = Sharing(1.0, (1.0,) * 4, alone=(1e-3,) * 4)
        return one, Sharing(1.1, (1.0,) * 4, (1.1,), {"adam": (0.010, 0.012, 0.014, 0.024)},
                            (0.8e-3, 0.9e-3, 1.1e-3, 1.2e-3))

    monkeypatch.setattr(profile_cmd, "host_sharing", probe)
    monkeypatch.setattr(step_rates, "step_overheads", lambda model, x, settings, names: {"adam": (1e-3, 1e-4)})
    monkeypatch.setattr(profile_cmd, "host_cores", lambda: 2)
    monkeypatch.setattr(message_cost, "message_cost", lambda: (1e-4, 1e-10))
    args = build_parser().parse_args(["profile", "--model", "alexnet", "--preset", "reduced", "--data", "synthetic",
                                      "--profiled-batch", "4", "--warmup", "0", "--iters", "1",
                                      "--optimizers", "adam", "--host-seconds", "1", "--out-dir", str(tmp_path)])
    assert profile_cmd.run(args) == 0
    meta = json.loads((tmp_path / "meta.json").read_text())
    model = load_task(TrainConfig(model="alexnet", preset="reduced", data="synthetic", batch_size=4)).model
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    tensors = sum(1 for p in model.parameters() if p.requires_grad)
    assert tensors == 16  # AlexNet's five convolutions and three linear layers, a weight and a bias each
    assert asked == [("adam",)]
    assert meta["optimizer_step_s_per_param_byte"] == {"adam": pytest.approx((0.015 - 1e-3 - 16e-4) / param_bytes)}
    assert meta["optimizer_step_overheads"] == {"adam": {"s_per_call": 1e-3, "s_per_tensor": 1e-4}}
    assert meta["host"]["optimizer_steps_s"] == {"adam": [0.010, 0.012, 0.014, 0.024]}
    assert meta["host"]["copy_steps_s"] == pytest.approx([0.8e-3, 0.9e-3, 1.1e-3, 1.2e-3])  # every copy's step alone
    assert meta["host"]["copy_step_s"] == pytest.approx(1e-3)
    own = meta["host"]["process_optimizer_step_s_per_param_byte"]["adam"]
    assert own > 0


@pytest.mark.parametrize(("flag", "cores", "counts"), [("--host-oversubscribed", 2, (2, 4)),
                                                       ("--no-host-oversubscribed", 2, (2,)),
                                                       ("--no-host-oversubscribed", 1, (1, 2))])
def test_the_profile_times_two_copies_per_core_unless_told_not_to(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  flag: str, cores: int, counts: tuple[int, ...]) -> None:
    """`pipedream profile --no-host-oversubscribed` asks the host probe for one copy per core only: meta.json then has
    the contention and the copies' steps alone from those copies and no ``oversubscribed``; by default (or on one
    core, where one copy shares nothing) it asks for one and two per core and keeps both."""
    import json

    import pipedream.runtime.message_cost as message_cost
    from pipedream.cli import build_parser
    from pipedream.commands import profile as profile_cmd

    asked: list[tuple[int, ...]] = []

    def probe(step, fresh, counts, seconds):  # type: ignore[no-untyped-def]
        asked.append(counts)
        return tuple(Sharing(1.0 + 0.1 * k, (1.0,) * n, (1.0 + 0.1 * k,), {}, (1e-3 * (k + 1),) * n)
                     for k, n in enumerate(counts))

    monkeypatch.setattr(profile_cmd, "host_sharing", probe)
    monkeypatch.setattr(profile_cmd, "host_cores", lambda: cores)
    monkeypatch.setattr(message_cost, "message_cost", lambda: (1e-4, 1e-10))
    args = build_parser().parse_args(["profile", "--model", "alexnet", "--preset", "reduced", "--data", "synthetic",
                                      "--profiled-batch", "4", "--warmup", "0", "--iters", "1", "--optimizers", "sgd",
                                      "--host-seconds", "1", flag, "--out-dir", str(tmp_path)])
    assert profile_cmd.run(args) == 0
    host = json.loads((tmp_path / "meta.json").read_text())["host"]
    assert asked == [counts]
    assert host["contention"] == pytest.approx(1.0)
    assert ("oversubscribed" in host) == (len(counts) == 2)
    if len(counts) == 2:
        assert host["oversubscribed"] == pytest.approx(1.1)
    # the copies' steps alone come from the last count's copies: 1 ms each with one count, 2 ms with two
    assert host["copy_step_s"] == pytest.approx(1e-3 * len(counts))
    assert len(host["copy_steps_s"]) == counts[-1]
