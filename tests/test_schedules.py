"""Schedules as data: exact action lists for small cases, text/CSV round trips, deadlock-freedom."""

from __future__ import annotations

import pytest

from pipedream import schedules as S
from pipedream.errors import PipeDreamError
from pipedream.schedules import Action, Kind


def texts(sched: S.Schedule, rank: int, kinds: tuple[Kind, ...] | None = None) -> str:
    return " ".join(str(a) for a in sched.order[rank] if kinds is None or a.kind in kinds)


def test_action_text_round_trip() -> None:
    for a in [Action(1, Kind.F, 3), Action(0, Kind.SEND_F, 2, 1), Action(12, Kind.ALLREDUCE, 40), Action(2, Kind.STEP, 0)]:
        assert Action.from_str(str(a)) == a
    assert str(Action(1, Kind.F, 3)) == "1F3"
    assert str(Action(0, Kind.RECV_B, 2, 1)) == "0RECV_B2.1"
    with pytest.raises(ValueError):
        Action.from_str("1X3")


def test_1f1b_four_stages_eight_minibatches_compute_order() -> None:
    s = S.build("1f1b", S.consecutive_ranks([1, 1, 1, 1]), 8)
    c = (Kind.F, Kind.B)
    assert texts(s, 0, c) == "0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0F6 0B3 0F7 0B4 0B5 0B6 0B7"
    assert texts(s, 1, c) == "1F0 1F1 1F2 1B0 1F3 1B1 1F4 1B2 1F5 1B3 1F6 1B4 1F7 1B5 1B6 1B7"
    assert texts(s, 2, c) == "2F0 2F1 2B0 2F2 2B1 2F3 2B2 2F4 2B3 2F5 2B4 2F6 2B5 2F7 2B6 2B7"
    assert texts(s, 3, c) == "3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5 3F6 3B6 3F7 3B7"


def test_1f1b_full_list_of_a_middle_stage() -> None:
    s = S.build("1f1b", S.consecutive_ranks([1, 1, 1, 1]), 8)
    assert texts(s, 2).split()[:14] == (
        "2RECV_F0 2F0 2SEND_F0 2RECV_F1 2F1 2SEND_F1 2RECV_B0 2B0 2SEND_B0 2STEP0 2RECV_F2 2F2 2SEND_F2 2RECV_B1"
    ).split()
    assert len(s.order[2]) == 8 * 7  # RECV_F F SEND_F RECV_B B SEND_B STEP per minibatch


def test_replicated_2_1_on_three_ranks_round_robin() -> None:
    s = S.build("1f1b", S.consecutive_ranks([2, 1]), 4)
    assert S.warmup_count([2, 1], 0) == 2  # NOAM = ceil(3 workers / 2 input replicas)
    assert texts(s, 0) == "0F0 0SEND_F0 0F2 0SEND_F2 0RECV_B0 0B0 0ALLREDUCE0 0STEP0 0RECV_B2 0B2 0ALLREDUCE2 0STEP2"
    assert texts(s, 1) == "0F1 0SEND_F1 0F3 0SEND_F3 0RECV_B1 0B1 0ALLREDUCE1 0STEP1 0RECV_B3 0B3 0ALLREDUCE3 0STEP3"
    assert texts(s, 2) == ("1RECV_F0 1F0 1B0 1SEND_B0 1STEP0 1RECV_F1 1F1 1B1 1SEND_B1 1STEP1 "
                           "1RECV_F2 1F2 1B2 1SEND_B2 1STEP2 1RECV_F3 1F3 1B3 1SEND_B3 1STEP3")
    assert [s.rank_of(0, m) for m in range(4)] == [0, 1, 0, 1]
    assert s.peer(Action(1, Kind.SEND_B, 3)) == 1
    assert s.peer(Action(0, Kind.SEND_F, 2)) == 2


def test_gpipe_four_stages_four_microbatches() -> None:
    s = S.build("gpipe", S.consecutive_ranks([1, 1, 1, 1]), 1, 4)
    assert texts(s, 0) == ("0F0.0 0SEND_F0.0 0F0.1 0SEND_F0.1 0F0.2 0SEND_F0.2 0F0.3 0SEND_F0.3 "
                           "0RECV_B0.0 0B0.0 0RECV_B0.1 0B0.1 0RECV_B0.2 0B0.2 0RECV_B0.3 0B0.3 0STEP0")
    assert texts(s, 3, (Kind.F, Kind.B, Kind.STEP)) == "3F0.0 3F0.1 3F0.2 3F0.3 3B0.0 3B0.1 3B0.2 3B0.3 3STEP0"
    times = S.dry_run(s)
    f_last = [t for a, t in zip(s.order[3], times[3], strict=True) if a.kind == Kind.F]
    assert f_last == [3, 4, 5, 6]  # the fill of the pipeline: stage 3 starts after 3 forwards


def test_2bw_coalesces_and_steps_once_per_minibatch() -> None:
    s = S.build("2bw", S.consecutive_ranks([1, 1]), 2, 2)
    assert texts(s, 0, (Kind.F, Kind.B, Kind.STEP)) == "0F0.0 0F0.1 0B0.0 0F1.0 0B0.1 0STEP0 0F1.1 0B1.0 0B1.1 0STEP1"
    assert texts(s, 1, (Kind.F, Kind.B, Kind.STEP)) == "1F0.0 1B0.0 1F0.1 1B0.1 1STEP0 1F1.0 1B1.0 1F1.1 1B1.1 1STEP1"
    with pytest.raises(PipeDreamError, match="microbatches"):
        S.build("2bw", S.consecutive_ranks([1, 1, 1]), 2, 2)


def test_pipedream_flush_three_stages_four_microbatches() -> None:
    """Written out by hand: stage s runs 1F1B over the 4 microbatches with 3 - 1 - s warm-up forwards (3 - s
    before its first backward), then alternates, cools down, and steps once per minibatch."""
    s = S.build("pipedream_flush", S.consecutive_ranks([1, 1, 1]), 1, 4)
    assert texts(s, 0) == ("0F0.0 0SEND_F0.0 0F0.1 0SEND_F0.1 0F0.2 0SEND_F0.2 0RECV_B0.0 0B0.0 0F0.3 0SEND_F0.3 "
                           "0RECV_B0.1 0B0.1 0RECV_B0.2 0B0.2 0RECV_B0.3 0B0.3 0STEP0")
    assert texts(s, 1) == ("1RECV_F0.0 1F0.0 1SEND_F0.0 1RECV_F0.1 1F0.1 1SEND_F0.1 1RECV_B0.0 1B0.0 1SEND_B0.0 "
                           "1RECV_F0.2 1F0.2 1SEND_F0.2 1RECV_B0.1 1B0.1 1SEND_B0.1 1RECV_F0.3 1F0.3 1SEND_F0.3 "
                           "1RECV_B0.2 1B0.2 1SEND_B0.2 1RECV_B0.3 1B0.3 1SEND_B0.3 1STEP0")
    assert texts(s, 2) == ("2RECV_F0.0 2F0.0 2B0.0 2SEND_B0.0 2RECV_F0.1 2F0.1 2B0.1 2SEND_B0.1 "
                           "2RECV_F0.2 2F0.2 2B0.2 2SEND_B0.2 2RECV_F0.3 2F0.3 2B0.3 2SEND_B0.3 2STEP0")
    # the next minibatch starts only after the flush: the same pattern again, after this minibatch's STEP
    two = S.build("pipedream_flush", S.consecutive_ranks([1, 1, 1]), 2, 4)
    for rank in range(3):
        first = [str(a) for a in two.order[rank]][: len(s.order[rank])]
        assert " ".join(first) == texts(s, rank)
        assert texts(two, rank).split()[len(first):] == [t.replace("0.", "1.").replace("STEP0", "STEP1")
                                                          for t in texts(s, rank).split()]
    assert two.round_robin == "microbatch" and two.name == "pipedream_flush"
    # one minibatch, forwards 1 and backwards 2 time units: (m + d - 1)(f + b) = 6 x 3, as GPipe's flush
    assert _makespan(s, 2) == 18


def test_pipedream_flush_replicated_stage_takes_microbatches_round_robin() -> None:
    s = S.build("pipedream_flush", S.consecutive_ranks([2, 1]), 1, 4)
    core = (Kind.F, Kind.B, Kind.ALLREDUCE, Kind.STEP)
    # NOAM = ceil(3 / 2) = 2 forwards before the first backward; the allreduce follows the last backward
    assert texts(s, 0, core) == "0F0.0 0F0.2 0B0.0 0B0.2 0ALLREDUCE0 0STEP0"
    assert texts(s, 1, core) == "0F0.1 0F0.3 0B0.1 0B0.3 0ALLREDUCE0 0STEP0"
    assert texts(s, 2, core) == "1F0.0 1B0.0 1F0.1 1B0.1 1F0.2 1B0.2 1F0.3 1B0.3 1STEP0"
    assert s.reduce_divisor(0) == 1  # a sum of the microbatches' gradients, as GPipe's
    # fewer microbatches than stages work (2BW refuses them): the warm-up is cut to what the minibatch has
    short = S.build("pipedream_flush", S.consecutive_ranks([1, 1, 1, 1]), 2, 2)
    assert texts(short, 0, core) == "0F0.0 0F0.1 0B0.0 0B0.1 0STEP0 0F1.0 0F1.1 0B1.0 0B1.1 0STEP1"


def test_gpipe_replicated_stage_takes_microbatches_round_robin() -> None:
    s = S.build("gpipe", S.consecutive_ranks([2, 1]), 2, 2)
    assert texts(s, 0) == ("0F0.0 0SEND_F0.0 0RECV_B0.0 0B0.0 0ALLREDUCE0 0STEP0 "
                           "0F1.0 0SEND_F1.0 0RECV_B1.0 0B1.0 0ALLREDUCE1 0STEP1")
    assert texts(s, 1) == ("0F0.1 0SEND_F0.1 0RECV_B0.1 0B0.1 0ALLREDUCE0 0STEP0 "
                           "0F1.1 0SEND_F1.1 0RECV_B1.1 0B1.1 0ALLREDUCE1 0STEP1")
    assert texts(s, 2) == ("1RECV_F0.0 1F0.0 1RECV_F0.1 1F0.1 1B0.0 1SEND_B0.0 1B0.1 1SEND_B0.1 1STEP0 "
                           "1RECV_F1.0 1F1.0 1RECV_F1.1 1F1.1 1B1.0 1SEND_B1.0 1B1.1 1SEND_B1.1 1STEP1")
    assert [s.rank_of(0, m, j) for m in range(2) for j in range(2)] == [0, 1, 0, 1]
    assert s.peer(Action(1, Kind.SEND_B, 0, 1)) == 1
    assert s.peer(Action(0, Kind.SEND_F, 1, 0)) == 2
    assert s.reduce_divisor(0) == 1  # replicas hold microbatches of one minibatch: their gradients add up
    assert S.build("1f1b", S.consecutive_ranks([2, 1]), 2).reduce_divisor(0) == 2  # whole minibatches: averaged


def _makespan(s: S.Schedule, backward_cost: int) -> int:
    times = S.dry_run(s, backward_cost)
    return max(t + (1 if a.kind == Kind.F else backward_cost if a.kind == Kind.B else 0)
               for r in s.order for a, t in zip(s.order[r], times[r], strict=True))


@pytest.mark.parametrize("p,r,m", [(2, 1, 4), (3, 1, 4), (2, 2, 4), (3, 2, 8), (2, 4, 8), (4, 3, 6)])
def test_gpipe_bubble_with_every_stage_replicated(p: int, r: int, m: int) -> None:
    """``r`` replicas of each of ``p`` equal stages: ``(p - 1) / (m / r + p - 1)`` idle (GPipe's at r = 1)."""
    s = S.build("gpipe", S.consecutive_ranks([r] * p), 1, m)
    span = _makespan(s, 2)
    busy = m * p * 3  # every microbatch: one forward (1) and one backward (2) on every stage
    assert 1 - busy / (r * p * span) == pytest.approx((p - 1) / (m / r + p - 1))


def test_2bw_replicated_stage_round_robin_and_versions() -> None:
    s = S.build("2bw", S.consecutive_ranks([2, 1]), 2, 4)
    core = (Kind.F, Kind.B, Kind.ALLREDUCE, Kind.STEP)
    assert texts(s, 0, core) == "0F0.0 0F0.2 0B0.0 0F1.0 0B0.2 0ALLREDUCE0 0STEP0 0F1.2 0B1.0 0B1.2 0ALLREDUCE1 0STEP1"
    assert texts(s, 1, core) == "0F0.1 0F0.3 0B0.1 0F1.1 0B0.3 0ALLREDUCE0 0STEP0 0F1.3 0B1.1 0B1.3 0ALLREDUCE1 0STEP1"
    assert texts(s, 2, core) == ("1F0.0 1B0.0 1F0.1 1B0.1 1F0.2 1B0.2 1F0.3 1B0.3 1STEP0 "
                                 "1F1.0 1B1.0 1F1.1 1B1.1 1F1.2 1B1.2 1F1.3 1B1.3 1STEP1")
    with pytest.raises(PipeDreamError, match="at least 4 microbatches"):
        S.build("2bw", S.consecutive_ranks([2, 1]), 2, 2)


@pytest.mark.parametrize("replicas,m", [([1, 1, 1, 1], 4), ([2, 1], 4), ([1, 2], 4), ([2, 2], 4), ([1, 2, 1], 4),
                                        ([3, 1], 6), ([2, 2, 2], 6), ([2, 3], 6)])
def test_2bw_forwards_find_version_t_minus_1(replicas: list[int], m: int) -> None:
    """2BW's forward of minibatch ``t`` uses version ``max(t - 1, 0)``; the runtime keeps the newest two."""
    s = S.build("2bw", S.consecutive_ranks(replicas), 5, m)
    S.dry_run(s, backward_cost=2)
    for acts in s.order.values():
        steps = 0
        for a in acts:
            steps += a.kind == Kind.STEP
            if a.kind == Kind.F:
                assert max(a.minibatch - 1, 0) in (steps - 1, steps), (a, steps)


def test_data_parallel_is_one_replicated_stage() -> None:
    s = S.build("dp", S.consecutive_ranks([3]), 6)
    assert texts(s, 1) == "0F1 0B1 0ALLREDUCE1 0STEP1 0F4 0B4 0ALLREDUCE4 0STEP4"


@pytest.mark.parametrize("name,replicas,n,m", [
    ("1f1b", [1, 1, 1, 1], 8, 1), ("1f1b", [2, 1], 6, 1), ("1f1b", [3, 1], 6, 1), ("1f1b", [1, 2, 1], 8, 1),
    ("1f1b", [2, 2], 4, 1), ("1f1b", [1, 3], 9, 1), ("gpipe", [1, 1, 1], 3, 4), ("2bw", [1, 1, 1, 1], 3, 4),
    ("gpipe", [2, 1], 3, 4), ("gpipe", [1, 3, 2], 2, 6), ("2bw", [2, 1], 3, 4), ("2bw", [1, 3], 3, 6),
    ("pipedream_flush", [1, 1, 1], 3, 4), ("pipedream_flush", [1, 1, 1, 1], 3, 2), ("pipedream_flush", [2, 1], 3, 4),
    ("pipedream_flush", [1, 3, 2], 2, 6), ("pipedream_flush", [2, 3], 2, 6), ("dp", [4], 8, 1),
])
def test_every_schedule_runs_without_deadlock_and_balances(name: str, replicas: list[int], n: int, m: int) -> None:
    s = S.build(name, S.consecutive_ranks(replicas), n, m)
    S.dry_run(s, backward_cost=2)
    for rank, acts in s.order.items():
        fs = [a.key for a in acts if a.kind == Kind.F]
        bs = [a.key for a in acts if a.kind == Kind.B]
        assert sorted(fs) == sorted(bs)  # every forward has its backward on the same rank
        for k in fs:
            stage = next(a.stage for a in acts if a.kind == Kind.F)
            assert s.rank_of(stage, *k) == rank
    units = n * m
    assert sum(a.kind == Kind.F for acts in s.order.values() for a in acts) == units * len(replicas)


def test_dry_run_reports_deadlock() -> None:
    s = S.build("1f1b", S.consecutive_ranks([1, 1]), 2)
    s.order[1] = [a for a in s.order[1] if a.kind != Kind.SEND_B]
    with pytest.raises(ValueError, match="deadlock"):
        S.dry_run(s)


def test_bad_counts_are_explained() -> None:
    with pytest.raises(PipeDreamError, match="replicas"):
        S.build("1f1b", S.consecutive_ranks([2, 1]), 3)
    with pytest.raises(PipeDreamError, match="multiple of 2"):
        S.build("gpipe", S.consecutive_ranks([2, 1]), 2, 3)  # replicas take turns over the microbatches
    with pytest.raises(PipeDreamError, match="multiple of 3"):
        S.build("2bw", S.consecutive_ranks([1, 3]), 2, 8)
    with pytest.raises(PipeDreamError, match="PipeDream-Flush schedule: 3 microbatches .* multiple of 2"):
        S.build("pipedream_flush", S.consecutive_ranks([1, 2]), 2, 3)
    with pytest.raises(PipeDreamError, match="unknown schedule"):
        S.build("zero-bubble", S.consecutive_ranks([1]), 1)


def test_csv_round_trip_and_grid(tmp_path) -> None:
    s = S.build("1f1b", S.consecutive_ranks([2, 1]), 4)
    s.save_csv(tmp_path / "s.csv")
    assert S.load_csv(tmp_path / "s.csv") == s.order
    grid = s.grid().splitlines()
    assert grid[0].split() == ["step", "rank0", "rank1", "rank2"]
    assert grid[1].split() == ["0", "0F0", "0F1", "."]


def test_forward_only_round_robin() -> None:
    s = S.forward_only([[0, 1], [2]], 3)
    assert texts(s, 1) == "0F1 0SEND_F1"
    assert texts(s, 2) == "1RECV_F0 1F0 1RECV_F1 1F1 1RECV_F2 1F2"


def test_runtime_default_warmup_is_consistent_and_compat_keeps_the_release() -> None:
    from pipedream.runtime.config import TrainConfig

    def forwards_before_first_backward(acts: list[S.Action]) -> int:
        return sum(1 for a in acts[: [a.kind for a in acts].index(S.Kind.B)] if a.kind == S.Kind.F)

    replicas = [1, 7, 1]  # the single input stage must admit 14 + 1 for the 7 replicas (release: 9)
    assert forwards_before_first_backward(S.build("1f1b", S.consecutive_ranks(replicas), 28).order[0]) == 15
    assert forwards_before_first_backward(S.build("1f1b", S.consecutive_ranks(replicas), 28, warmup="release").order[0]) == 9
    assert TrainConfig().warmup == S.DEFAULT_WARMUP == "consistent" and TrainConfig(compat=True).warmup == "release"


def test_simulate_command_uses_the_simulators_allreduce_default() -> None:
    import argparse

    from pipedream.commands import simulate
    from pipedream.sim import DEFAULT_ALLREDUCE

    p = argparse.ArgumentParser()
    simulate.add_arguments(p)
    assert p.parse_args(["--profile", "x", "--cluster", "y"]).allreduce == DEFAULT_ALLREDUCE
