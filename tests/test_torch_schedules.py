"""torch.distributed.pipelining's seven schedules converted to our action lists: action by action against torch's
own text form, the invariants of a training iteration, the placement of chunks, and ours where both have one."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from torch.distributed.pipelining import schedules as ts
from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

from pipedream import schedules as S
from pipedream.errors import PipeDreamError
from pipedream.schedules import COMPUTE, Kind
from pipedream.torch_schedules import TORCH_CLASSES, from_torch, torch_text

CASES = [(name, p, m) for name in TORCH_CLASSES for p in (2, 4) for m in (p, p + 1, 2 * p, 3 * p, 4 * p)]


def torch_texts(name: str, p: int, m: int, v: int) -> list[list[str]] | None:
    """torch's actions per rank in its own text form, an ``OVERLAP_F_B`` read back into its sub-actions from the
    text ``(0F3;5B1)OVERLAP_F_B``; None where torch refuses the counts."""
    try:
        ops = get_schedule_ops(getattr(ts, TORCH_CLASSES[name]), p, m, v)
    except (ValueError, AssertionError):
        return None
    out = []
    for rank in ops:
        texts: list[str] = []
        for a in rank:
            text = "" if a is None else str(a)
            if text.startswith("("):
                texts += text[1:text.index(")")].split(";")
            elif re.fullmatch(r"\d+[FBIW]\d+", text):  # compute; torch's REDUCE_GRAD (the DP reduction) is not
                texts.append(text)
        out.append(texts)
    return out


def chunks(name: str) -> int:
    return 1 if name in ("gpipe", "pipedream_flush") else 2


@pytest.mark.parametrize("name,p,m", CASES)
def test_conversion_matches_torch_action_by_action(name: str, p: int, m: int) -> None:
    v = chunks(name)
    expected = torch_texts(name, p, m, v)
    if expected is None:
        with pytest.raises(PipeDreamError, match="refuses"):
            from_torch(name, p, m, v)
        return
    sched = from_torch(name, p, m, v, check=False)
    assert sorted(sched.order) == list(range(p))
    for rank in range(p):
        ours = [torch_text(a) for a in sched.order[rank] if a.kind in COMPUTE]
        assert ours == expected[rank]
    if name == "pipedream_flush":  # torch's Schedule1F1B numbers the last rank's forwards 1..m (its IR only)
        with pytest.raises(PipeDreamError, match=f"rank {p - 1} runs {p - 1}F{m}, outside"):
            from_torch(name, p, m, v)
        return
    assert from_torch(name, p, m, v).order == sched.order  # the check finds nothing to refuse
    # every (stage, microbatch) once forward and once backward, as B or as I then W, on the stage's rank
    kinds: dict[tuple[int, int], Counter[Kind]] = {}
    for rank, acts in sched.order.items():
        for a in acts:
            if a.kind in COMPUTE:
                assert sched.stage_ranks[a.stage] == [rank]
                kinds.setdefault((a.stage, a.microbatch or 0), Counter())[a.kind] += 1
    assert set(kinds) == {(s, j) for s in range(p * v) for j in range(m)}
    for c in kinds.values():
        assert c in (Counter({Kind.F: 1, Kind.B: 1}), Counter({Kind.F: 1, Kind.I: 1, Kind.W: 1}))
    # in dependency order: run with unit times, forwards go up the stages, backwards down, W after its I
    times = S.dry_run(sched)
    start = {(a.kind, a.stage, a.microbatch): t for r in sched.order for a, t in zip(sched.order[r], times[r], strict=True)}
    for (s, j), c in kinds.items():
        back = Kind.B if Kind.B in c else Kind.I
        duration = 1
        assert start[(back, s, j)] >= start[(Kind.F, s, j)] + duration
        if s > 0:
            assert start[(Kind.F, s, j)] >= start[(Kind.F, s - 1, j)] + duration
        if s < p * v - 1:
            assert start[(back, s, j)] >= start[(Kind.I if (Kind.I, s + 1, j) in start else Kind.B, s + 1, j)] + duration
        if back == Kind.I:
            assert start[(Kind.W, s, j)] >= start[(Kind.I, s, j)] + duration


def test_coverage_of_the_conversion_test() -> None:
    """Each of the seven converts at 2 and 4 ranks and at three or more microbatch counts (1F1B's with the defect)."""
    for name in TORCH_CLASSES:
        for p in (2, 4):
            ok = [m for n, q, m in CASES if (n, q) == (name, p) and torch_texts(n, q, m, chunks(n)) is not None]
            assert len(ok) >= 3, (name, p, ok)


@pytest.mark.parametrize("name", ["interleaved_1f1b", "looped_bfs", "interleaved_zb"])
def test_looped_schedules_place_stage_s_on_rank_s_mod_p(name: str) -> None:
    sched = from_torch(name, 4, 8, 2)
    assert sched.stage_ranks == [[s % 4] for s in range(8)]


@pytest.mark.parametrize("name", ["zbv", "dualpipev"])
def test_v_schedules_place_stages_r_and_2p_minus_1_minus_r_on_rank_r(name: str) -> None:
    sched = from_torch(name, 4, 8)
    assert sched.stage_ranks == [[min(s, 7 - s)] for s in range(8)]


@pytest.mark.parametrize("name", ["gpipe", "pipedream_flush"])
def test_torchs_gpipe_and_1f1b_are_ours_on_a_straight_pipeline(name: str) -> None:
    """Equal action lists; but for one defect of torch's 1F1B list (``Schedule1F1B._get_pipeline_order``, which only
    the visualizer and the IR read): its last rank's forwards are numbered ``1 .. m``, ours ``0 .. m - 1``."""
    for p, m in ((2, 3), (4, 8), (4, 5)):
        theirs = from_torch(name, p, m, minibatches=2, check=name == "gpipe")
        ours = S.build(name, S.consecutive_ranks([1] * p), 2, m)
        if name == "pipedream_flush":
            last = theirs.order[p - 1]
            theirs.order[p - 1] = [a._replace(microbatch=a.microbatch - 1) if a.kind in (Kind.F, Kind.RECV_F) else a
                                   for a in last]
        assert theirs.order == ours.order


def test_minibatches_repeat_the_iteration_and_step_every_chunk_and_ranks_relabel() -> None:
    sched = from_torch("zbv", 2, 4, minibatches=2, ranks=[5, 3])
    acts = sched.order[3]
    steps = [str(a) for a in acts if a.kind == Kind.STEP]
    assert steps == ["1STEP0", "2STEP0", "1STEP1", "2STEP1"]
    assert sched.stage_ranks == [[5], [3], [3], [5]]
    assert sched.rank_of(2, 0, 1) == 3
    first = [a for a in acts if a.minibatch == 0 and a.kind in COMPUTE]
    second = [a for a in acts if a.minibatch == 1 and a.kind in COMPUTE]
    assert [(a.stage, a.kind, a.microbatch) for a in first] == [(a.stage, a.kind, a.microbatch) for a in second]
    assert S.dry_run(sched)  # no deadlock across the two iterations


def test_bad_requests_say_what_to_pass() -> None:
    with pytest.raises(PipeDreamError, match="unknown torch schedule"):
        from_torch("ScheduleFoo", 2, 4)
    with pytest.raises(PipeDreamError, match="exactly 2 chunks"):
        from_torch("zbv", 2, 4, 3)
    with pytest.raises(PipeDreamError, match="2 or more"):
        from_torch(ts.ScheduleInterleaved1F1B, 2, 4, 1)
    assert from_torch(ts.ScheduleInterleaved1F1B, 2, 4, 3).num_stages == 6
