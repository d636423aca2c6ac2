"""The order in which ranks issue sends and receives, checked under NCCL's in-order semantics (on the CPU).

NCCL ignores tags: a rank's point-to-point operations run in the order they were issued (for a pair
of ranks on one CUDA stream), a receive holds up everything queued behind it until its peer's
matching send runs, and a send waits for its peer's receive. Posting receives ahead of one's own
sends can therefore deadlock two stages (NVIDIA/nccl#479). :func:`run_in_order` replays what every
rank issues (the executor's :attr:`pipedream.runtime.comm.P2P.log`, or the same derived from
:func:`pipedream.runtime.actions.issue_plan`) on a deliberately strict model of that:

* each rank has one queue of issued batches (one ``batch_isend_irecv`` each, or one lone operation);
  only the batch at the head of the queue runs, and it ends when all of its transfers are done;
* a transfer is done when the send and the receive are both in the head batches of their ranks
  (matched by position: the k-th send from a to b is the k-th receive at b from a);
* the host blocks where the log says ``wait`` (until that receive is done), ``allreduce`` (until every
  rank of the group got there; collectives use their own communicator) and ``drain`` (until all its
  sends are done); issuing never blocks.

A run that cannot finish under this model can hang on NCCL; one that finishes cannot (one queue per
rank is stricter than one per pair of ranks).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from pipedream import schedules
from pipedream.runtime.actions import RECVS, SENDS, issue_plan
from pipedream.runtime.stage import straight_plan
from pipedream.schedules import Action, Kind, Schedule

Log = list[tuple]


def planned_log(sched: Schedule, rank: int, batched: bool, phase: int = 0) -> Log:
    """What the executor issues on ``rank`` for ``sched`` according to :func:`issue_plan`, in the
    format of ``P2P.log`` (receives of a step before its sends, as ``P2P.exchange`` issues them)."""
    actions = sched.order[rank]
    log: Log = []
    batch = 0

    def tag(a: Action) -> tuple[int, bool, int, int]:
        return (phase, a.kind in (Kind.RECV_B, Kind.SEND_B), a.minibatch, a.microbatch or 0)

    for a, issued in zip(actions, issue_plan(actions, batched), strict=True):
        comm = [actions[k] for k in issued]
        for c in [c for c in comm if c.kind in RECVS] + [c for c in comm if c.kind in SENDS]:
            batch += not batched
            log.append(("recv" if c.kind in RECVS else "send", sched.peer(c), tag(c), batch))
        batch += bool(batched and comm)
        if a.kind in RECVS:
            log.append(("wait", sched.peer(a), tag(a)))
        elif a.kind == Kind.ALLREDUCE:
            log.append(("allreduce", tuple(sched.stage_ranks[a.stage])))
    return [*log, ("drain",)]


def _normalised(log: Log) -> Log:
    """Batch numbers replaced by 0, 1, 2, ...: a new one wherever the number changes (logs compare by structure)."""
    out: Log = []
    last, current = None, -1
    for e in log:
        if e[0] in ("send", "recv"):
            if e[3] != last:
                last, current = e[3], current + 1
            e = (*e[:3], current)
        out.append(e)
    return out


def assert_sends_match_receives(logs: dict[int, Log]) -> None:
    """On every pair of ranks, the order of sends on one side is the order of receives on the other."""
    sent: dict[tuple[int, int], list[tuple]] = defaultdict(list)
    received: dict[tuple[int, int], list[tuple]] = defaultdict(list)
    for r, log in logs.items():
        for e in log:
            if e[0] == "send":
                sent[(r, e[1])].append(e[2])
            elif e[0] == "recv":
                received[(e[1], r)].append(e[2])
    assert sent.keys() == received.keys()
    for pair in sent:
        assert sent[pair] == received[pair], f"ranks {pair}: sends and receives in different orders"


def run_in_order(logs: dict[int, Log]) -> None:
    """Replay ``logs`` (rank -> issued operations) on the in-order model of the module docstring.

    Raises:
        AssertionError: the ranks deadlock; the message says what every stuck rank waits for.
    """
    programs: dict[int, list[tuple]] = {}
    for r, log in logs.items():
        count: dict[tuple[int, int], int] = defaultdict(int)  # transfers so far per (src, dst)
        collectives: dict[tuple, int] = defaultdict(int)
        recv_key: dict[tuple, tuple] = {}
        prog: list[tuple] = []
        for e in log:
            if e[0] in ("send", "recv"):
                pair = (r, e[1]) if e[0] == "send" else (e[1], r)
                key = (*pair, count[pair])
                count[pair] += 1
                if e[0] == "recv":
                    recv_key[(e[1], e[2])] = key  # the next wait for this (peer, tag) is on this one
                if prog and prog[-1][0] == "batch" and prog[-1][1] == e[3]:
                    prog[-1][2].append((e[0], key))
                else:
                    prog.append(("batch", e[3], [(e[0], key)]))
            elif e[0] == "wait":
                prog.append(("wait", recv_key[(e[1], e[2])]))
            elif e[0] == "allreduce":
                prog.append(("allreduce", (e[1], collectives[e[1]])))
                collectives[e[1]] += 1
            else:
                prog.append(("drain",))
        programs[r] = prog
    pc = dict.fromkeys(programs, 0)
    queue: dict[int, list[set[tuple]]] = {r: [] for r in programs}  # keys of each issued batch
    sends: dict[int, set[tuple]] = {r: set() for r in programs}
    done: set[tuple] = set()
    arrived: dict[tuple, set[int]] = defaultdict(set)
    progress = True
    while progress:
        progress = False
        for r, prog in programs.items():  # host side
            while pc[r] < len(prog):
                item = prog[pc[r]]
                if item[0] == "batch":
                    queue[r].append({key for _, key in item[2]})
                    sends[r] |= {key for kind, key in item[2] if kind == "send"}
                elif item[0] == "wait" and item[1] not in done:
                    break
                elif item[0] == "allreduce":
                    arrived[item[1]].add(r)
                    if arrived[item[1]] != set(item[1][0]):
                        break
                elif item[0] == "drain" and not sends[r] <= done:
                    break
                pc[r] += 1
                progress = True
        for r in programs:  # the head batch of each queue
            while queue[r]:
                for key in queue[r][0] - done:
                    peer = key[1] if key[0] == r else key[0]
                    if queue[peer] and key in queue[peer][0]:
                        done.add(key)
                        progress = True
                if queue[r][0] <= done:
                    queue[r].pop(0)
                    progress = True
                else:
                    break
    stuck = {r: (programs[r][pc[r]][:2] if pc[r] < len(programs[r]) else "end",
                 sorted(queue[r][0] - done) if queue[r] else None)
             for r in programs if pc[r] < len(programs[r]) or queue[r]}
    assert not stuck, f"deadlock under in-order semantics; rank: (host waits at, head batch's open transfers): {stuck}"


def _logs(sched: Schedule, batched: bool) -> dict[int, Log]:
    return {r: planned_log(sched, r, batched) for r in sched.order}


SCHEDULES = [("1f1b", [1, 1], 6, 1), ("1f1b", [1, 1, 1], 8, 1), ("1f1b", [1, 1, 1, 1], 8, 1),
             ("1f1b", [2, 1], 8, 1), ("1f1b", [1, 2], 8, 1), ("1f1b", [1, 2, 1], 8, 1), ("1f1b", [3, 1], 6, 1),
             ("gpipe", [1, 1, 1, 1], 3, 4), ("gpipe", [2, 1], 2, 4), ("2bw", [1, 1], 4, 2), ("2bw", [2, 1], 3, 4),
             ("2bw", [1, 1, 1, 1], 4, 4), ("pipedream_flush", [1, 1, 1], 3, 4), ("pipedream_flush", [2, 1], 2, 4),
             ("pipedream_flush", [1, 1, 1, 1], 2, 2)]


@pytest.mark.parametrize("name,replicas,minibatches,micro", SCHEDULES)
def test_batched_issue_order_cannot_deadlock_in_order(name: str, replicas: list[int], minibatches: int,
                                                      micro: int) -> None:
    sched = schedules.build(name, schedules.consecutive_ranks(replicas), minibatches, micro)
    logs = _logs(sched, batched=True)
    assert_sends_match_receives(logs)
    run_in_order(logs)
    run_in_order(_logs(schedules.forward_only(sched.stage_ranks, minibatches), batched=True))


@pytest.mark.parametrize("replicas", [[1, 1], [1, 1, 1, 1]])
def test_receives_posted_ahead_deadlock_in_order(replicas: list[int]) -> None:
    """The checker bites: gloo's look-ahead (receives posted before the sends the peer waits for) hangs."""
    logs = _logs(schedules.build("1f1b", schedules.consecutive_ranks(replicas), 8), batched=False)
    assert_sends_match_receives(logs)
    with pytest.raises(AssertionError, match="deadlock"):
        run_in_order(logs)


def test_a_batch_never_waits_for_a_later_one() -> None:
    """Every batch of 1F1B on two stages: the first stage pairs SEND_F m with RECV_B m - 1."""
    sched = schedules.build("1f1b", schedules.consecutive_ranks([1, 1]), 4)
    actions = sched.order[0]
    batches = [[str(actions[k]) for k in ks] for ks in issue_plan(actions, batched=True) if ks]
    assert batches == [["0SEND_F0"], ["0SEND_F1", "0RECV_B0"], ["0SEND_F2", "0RECV_B1"], ["0SEND_F3", "0RECV_B2"],
                       ["0RECV_B3"]]


@pytest.mark.slow
@pytest.mark.parametrize("replicas,batched", [([1, 1, 1, 1], True), ([2, 1], True), ([1, 1], False)])
def test_executor_issues_the_planned_order(tmp_path: Path, replicas: list[int], batched: bool) -> None:
    """Workers on gloo, with NCCL's batching switched on (or gloo's look-ahead): the operations they hand
    to torch.distributed (recorded by ``P2P``) are the planned ones, and only the batched ones pass the
    in-order replay."""
    from pipedream.runtime.worker import BATCHED_ENV
    from tests.test_runtime_pipeline import run

    plan = straight_plan("t", 8, [8 // len(replicas)] * len(replicas), replicas=replicas)
    dumps = run(tmp_path, sum(replicas), plan=plan, max_minibatches=8, epochs=2,
                env={BATCHED_ENV: "1" if batched else "0"})
    train = schedules.build("1f1b", schedules.consecutive_ranks(replicas), 8)
    evaluate = schedules.forward_only(train.stage_ranks, 32 // 8)  # tests.tiny.write_data: 32 samples
    logs = {}
    for rank, d in enumerate(dumps):
        assert d["batched"] == batched
        logs[rank] = d["comm_log"]
        expected = [e for _ in range(2) for e in planned_log(train, rank, batched) + planned_log(evaluate, rank, batched, 1)]
        assert _normalised(logs[rank]) == _normalised(expected)
    assert_sends_match_receives(logs)
    if batched:
        run_in_order(logs)
    else:
        with pytest.raises(AssertionError, match="deadlock"):
            run_in_order(logs)
