"""Schedules as data: per-rank action lists for PipeDream 1F1B-RR, GPipe, PipeDream-2BW, PipeDream-Flush and DP.

A schedule is a plain table ``order: dict[rank, list[Action]]``. The runtime executes a rank's list in
order, the simulator times the same lists, and the plots draw them (one source of truth). The design
follows the idea of ``torch.distributed.pipelining``'s action tables (a small named tuple with a
compact text form such as ``"1F3"``), written here for PipeDream's mechanisms.

Semantics every consumer relies on:

* ``F``/``B``: forward/backward of one (micro)batch on the stage; the last stage's ``F`` includes the
  loss and its ``B`` starts from it. Zero-bubble schedules split ``B`` in two (Qi et al., ICLR'24): ``I``, the
  gradient of the stage's input (what the previous stage waits for, sent after it), and ``W``, the gradient of
  its weights (needed only by the step), after ``I`` of the same (micro)batch on the same rank.
* A rank may run several stages (model chunks, virtual stages: interleaved and V-shaped schedules); ``stage``
  is the chunk's index in the pipeline, the rank the key of ``order`` (:mod:`pipedream.torch_schedules`).
* ``SEND_F(s, m)`` sends stage ``s``'s output of ``m`` to stage ``s + 1``; it matches
  ``RECV_F(s + 1, m)``. ``SEND_B(s, m)`` sends the gradient of stage ``s``'s input to stage ``s - 1``;
  it matches ``RECV_B(s - 1, m)``. Sends are asynchronous (never block); receives block until the
  matching send has happened.
* Replicas of a stage take turns (:attr:`Schedule.round_robin`). In 1F1B-RR and DP they take whole
  minibatches: minibatch ``m`` of stage ``s`` runs on rank ``stage_ranks[s][m % replicas(s)]`` (§3.2).
  In GPipe, 2BW and PipeDream-Flush they take the microbatches of every minibatch: microbatch ``j`` runs on
  ``stage_ranks[s][j % replicas(s)]``, so ``num_microbatches`` is a multiple of every stage's replicas.
  Either way the same replica does a unit's forward and backward.
* ``ALLREDUCE(s, m)``: the ``k``-th of every replica of stage ``s`` forms one collective that combines their
  gradients: *averaged* under minibatch round robin (whole minibatches: data parallelism inside the stage, §3.1),
  *summed* under microbatch round robin (shares of the same minibatches, already scaled by
  ``1 / num_microbatches``: exactly the unreplicated update; :meth:`Schedule.reduce_divisor`).
* ``STEP(s, m)`` applies the (combined, coalesced) gradients: one optimizer step, one new weight version.

Text form: ``f"{stage}{kind}{minibatch}"`` plus ``".{microbatch}"`` for GPipe, 2BW and PipeDream-Flush, e.g. ``"1F3"``,
``"0SEND_F2.1"``, ``"2STEP4"``.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import NamedTuple

from pipedream.errors import PipeDreamError


class Kind(StrEnum):
    """What an action does (its text form is the enum value)."""

    F = "F"
    B = "B"
    I = "I"  # noqa: E741 (the field's name: the input-gradient half of a backward)
    W = "W"
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"
    ALLREDUCE = "ALLREDUCE"
    STEP = "STEP"


COMPUTE = (Kind.F, Kind.B, Kind.I, Kind.W)
BACKWARDS = (Kind.B, Kind.I)  # what sends the input's gradient back
_ACTION_RE = re.compile(r"^(\d+)([A-Z_]+?)(\d+)(?:\.(\d+))?$")


class Action(NamedTuple):
    """One step of a rank's work: ``kind`` on ``stage`` for ``minibatch`` (and ``microbatch``)."""

    stage: int
    kind: Kind
    minibatch: int
    microbatch: int | None = None

    def __str__(self) -> str:
        s = f"{self.stage}{self.kind.value}{self.minibatch}"
        return s if self.microbatch is None else f"{s}.{self.microbatch}"

    @property
    def key(self) -> tuple[int, int]:
        """``(minibatch, microbatch)`` with microbatch 0 when absent: the unit of work F/B act on."""
        return (self.minibatch, self.microbatch or 0)

    @classmethod
    def from_str(cls, text: str) -> Action:
        """Inverse of ``str(action)``; raises ValueError on malformed text."""
        m = _ACTION_RE.match(text.strip())
        if m is None or m.group(2) not in Kind.__members__:
            raise ValueError(f"malformed action {text!r}; expected e.g. '1F3', '0SEND_F2.1'")
        micro = int(m.group(4)) if m.group(4) is not None else None
        return cls(int(m.group(1)), Kind(m.group(2)), int(m.group(3)), micro)


@dataclass
class Schedule:
    """Per-rank action lists plus what is needed to interpret them.

    Attributes:
        name: ``"1f1b"``, ``"gpipe"``, ``"2bw"``, ``"pipedream_flush"`` or ``"dp"``.
        stage_ranks: global ranks of each stage's replicas, stages in pipeline order.
        num_minibatches: minibatches (weight updates of a straight pipeline) in the schedule.
        num_microbatches: microbatches per minibatch (1 for 1F1B and DP).
        order: rank -> its actions in execution order.
        round_robin: what a stage's replicas take turns over: ``"minibatch"`` (1F1B-RR, DP) or
            ``"microbatch"`` (GPipe, 2BW, PipeDream-Flush; the microbatches of every minibatch), see the module
            docstring.
    """

    name: str
    stage_ranks: list[list[int]]
    num_minibatches: int
    num_microbatches: int = 1
    order: dict[int, list[Action]] = field(default_factory=dict)
    round_robin: str = "minibatch"

    @property
    def num_stages(self) -> int:
        return len(self.stage_ranks)

    def rank_of(self, stage: int, minibatch: int, microbatch: int | None = None) -> int:
        """The rank that runs ``minibatch`` (microbatch ``microbatch``) on ``stage``: round robin over the
        stage's replicas by minibatch or by microbatch (:attr:`round_robin`)."""
        ranks = self.stage_ranks[stage]
        turn = (microbatch or 0) if self.round_robin == "microbatch" else minibatch
        return ranks[turn % len(ranks)]

    def peer(self, action: Action) -> int | None:
        """Rank at the other end of a send or receive; None for other kinds."""
        offset = {Kind.SEND_F: 1, Kind.RECV_F: -1, Kind.SEND_B: -1, Kind.RECV_B: 1}.get(action.kind)
        return None if offset is None else self.rank_of(action.stage + offset, action.minibatch, action.microbatch)

    def reduce_divisor(self, stage: int) -> int:
        """What an ``ALLREDUCE`` of ``stage`` divides the summed gradients by: the stage's replicas when
        they hold whole minibatches (an average), 1 when they hold microbatches of the same minibatch
        (a sum of gradients already scaled by ``1 / num_microbatches``)."""
        return len(self.stage_ranks[stage]) if self.round_robin == "minibatch" else 1

    def grid(self, backward_cost: int = 1) -> str:
        """A step x rank text grid of the compute actions, timed by :func:`dry_run`."""
        times = dry_run(self, backward_cost)
        ranks = sorted(self.order)
        cells: dict[tuple[int, int], str] = {}
        end = 0
        for r in ranks:
            for a, t in zip(self.order[r], times[r], strict=True):
                if a.kind in COMPUTE:
                    dur = backward_cost if a.kind == Kind.B else 1
                    for k in range(dur):
                        cells[(t + k, r)] = str(a)
                    end = max(end, t + dur)
        width = max([len(c) for c in cells.values()] + [6])
        lines = ["step  " + " ".join(f"rank{r}".ljust(width) for r in ranks)]
        lines += [f"{t:<5} " + " ".join(cells.get((t, r), ".").ljust(width) for r in ranks) for t in range(end)]
        return "\n".join(line.rstrip() for line in lines)

    def save_csv(self, path: str | Path) -> None:
        """Write one row per rank: ``rank, action, action, ...`` in text form."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as f:
            w = csv.writer(f)
            for r in sorted(self.order):
                w.writerow([r, *(str(a) for a in self.order[r])])


def load_csv(path: str | Path) -> dict[int, list[Action]]:
    """Read per-rank action lists written by :meth:`Schedule.save_csv`; raises ValueError if malformed."""
    order: dict[int, list[Action]] = {}
    with Path(path).open(newline="") as f:
        for row in csv.reader(f):
            if row:
                order[int(row[0])] = [Action.from_str(c) for c in row[1:] if c]
    return order


def warmup_count(replicas: Sequence[int], stage: int) -> int:
    """Forwards a replica of ``stage`` admits before its first backward in 1F1B-RR (§3.2).

    ``ceil(workers in stages stage..end / replicas of stage)``; for the input stage this is the
    paper's NOAM = ceil(workers / replicas of the input stage).
    """
    return math.ceil(sum(replicas[stage:]) / replicas[stage])


def warmup_count_consistent(replicas: Sequence[int], stage: int) -> int:
    """Warm-up forwards that cover what the downstream stages actually hold in flight (an option).

    :func:`warmup_count` (the release's formula) counts one minibatch per downstream *worker*; but a
    replica of a downstream stage ``t`` holds ``w_t`` minibatches (it needs its ``w_t``-th forward before
    its first backward), i.e. ``D_t = r_t * w_t``, which exceeds the workers when ``r_t`` does not divide
    evenly. Here ``D_last = r_last`` and ``w_s = ceil(D_{s+1} / r_s) + 1``, so stage ``s`` admits
    enough to feed ``D_{s+1}`` plus one of its own per replica. Equal to :func:`warmup_count` for straight
    pipelines and for ``15-1``-like configs; larger when a single stage feeds a replicated one
    (``1-5-1-1-7-1``: stage 3 admits 15, not 9).
    """
    held = 0
    w = 1
    for s in range(len(replicas) - 1, stage - 1, -1):
        w = math.ceil(held / replicas[s]) + 1 if held else 1
        held = replicas[s] * w
    return w


WARMUPS = {"release": warmup_count, "consistent": warmup_count_consistent}
# What our runtime and simulator run by default; ``release`` (the release runtime's counts) is ``--compat``.
DEFAULT_WARMUP = "consistent"


def consecutive_ranks(replicas: Sequence[int]) -> list[list[int]]:
    """Consecutive ranks for each stage: ``[15, 1] -> [[0..14], [15]]``."""
    out, nxt = [], 0
    for r in replicas:
        out.append(list(range(nxt, nxt + r)))
        nxt += r
    return out


def _check(stage_ranks: list[list[int]], num_minibatches: int, name: str, num_microbatches: int | None = None) -> None:
    """Replicas take turns over minibatches (``num_microbatches`` None) or over the microbatches of each
    minibatch; either count must then be a multiple of every stage's replicas."""
    if not stage_ranks or any(not rs for rs in stage_ranks):
        raise PipeDreamError(f"{name} schedule: every stage needs at least one rank, got {stage_ranks}")
    if num_minibatches < 1:
        raise PipeDreamError(f"{name} schedule: needs at least one minibatch, got {num_minibatches}")
    if num_microbatches is not None and num_microbatches < 1:
        raise PipeDreamError(f"{name} schedule: needs at least one microbatch per minibatch, got {num_microbatches}")
    for s, rs in enumerate(stage_ranks):
        if num_microbatches is None and num_minibatches % len(rs):
            raise PipeDreamError(f"{name} schedule: {num_minibatches} minibatches do not divide evenly over "
                                 f"the {len(rs)} replicas of stage {s}; use a multiple of {len(rs)}")
        if num_microbatches is not None and num_microbatches % len(rs):
            raise PipeDreamError(f"{name} schedule: {num_microbatches} microbatches per minibatch do not divide "
                                 f"evenly over the {len(rs)} replicas of stage {s} (replicas take turns over "
                                 f"microbatches); use --microbatches a multiple of {len(rs)}")


def _forward(s: int, last: int, m: int, j: int | None = None) -> list[Action]:
    acts = [Action(s, Kind.RECV_F, m, j)] if s > 0 else []
    acts.append(Action(s, Kind.F, m, j))
    if s < last:
        acts.append(Action(s, Kind.SEND_F, m, j))
    return acts


def _backward(s: int, last: int, m: int, j: int | None = None) -> list[Action]:
    acts = [Action(s, Kind.RECV_B, m, j)] if s < last else []
    acts.append(Action(s, Kind.B, m, j))
    if s > 0:
        acts.append(Action(s, Kind.SEND_B, m, j))
    return acts


def _update(s: int, m: int, replicated: bool) -> list[Action]:
    return ([Action(s, Kind.ALLREDUCE, m)] if replicated else []) + [Action(s, Kind.STEP, m)]


def one_f_one_b(stage_ranks: list[list[int]], num_minibatches: int, warmup: str = DEFAULT_WARMUP) -> Schedule:
    """PipeDream 1F1B-RR (§3.2): a warm-up of forwards, then one backward, one forward.

    ``warmup`` picks the warm-up counts: ``consistent`` (:func:`warmup_count_consistent`, the default of our
    runtime and simulator) or ``release`` (:func:`warmup_count`, the release runtime's; ``--compat``). The two
    differ only when a stage feeds a replicated one unevenly.

    Replicas of a stage take minibatches round robin; each replica updates its weights after every
    backward (averaging gradients with the other replicas of its stage first when replicated).

    Raises:
        PipeDreamError: empty stages, or ``num_minibatches`` not a multiple of some stage's replicas.
    """
    _check(stage_ranks, num_minibatches, "1F1B")
    if warmup not in WARMUPS:
        raise PipeDreamError(f"unknown warm-up {warmup!r}; use {' or '.join(WARMUPS)}")
    replicas = [len(rs) for rs in stage_ranks]
    last = len(stage_ranks) - 1
    order: dict[int, list[Action]] = {}
    for s, ranks in enumerate(stage_ranks):
        for i, rank in enumerate(ranks):
            mine = list(range(i, num_minibatches, len(ranks)))
            w = min(WARMUPS[warmup](replicas, s), len(mine))
            acts: list[Action] = []
            for m in mine[:w]:
                acts += _forward(s, last, m)
            for k, m in enumerate(mine):
                acts += _backward(s, last, m) + _update(s, m, len(ranks) > 1)
                if k + w < len(mine):
                    acts += _forward(s, last, mine[k + w])
            order[rank] = acts
    return Schedule("1f1b", stage_ranks, num_minibatches, 1, order)


def gpipe(stage_ranks: list[list[int]], num_minibatches: int, num_microbatches: int) -> Schedule:
    """GPipe: the forwards of all microbatches of a minibatch, then their backwards, then a flush (STEP).

    A replicated stage's replicas take the microbatches of every minibatch round robin (microbatch ``j``
    on replica ``j % r``) and sum their gradients at the flush (``ALLREDUCE``) before all of them step,
    so training stays exactly synchronous SGD on the whole minibatch. With every stage replicated ``r``
    times this is ``r`` independent pipelines of ``M / r`` microbatches each; with equal stage times its
    bubble is ``(p - 1) / (M / r + p - 1)`` for ``p`` stages (GPipe's ``(p - 1) / (M + p - 1)`` at ``r = 1``).

    Raises:
        PipeDreamError: empty stages, or ``num_microbatches`` not a multiple of some stage's replicas.
    """
    _check(stage_ranks, num_minibatches, "GPipe", num_microbatches)
    last = len(stage_ranks) - 1
    order: dict[int, list[Action]] = {}
    for s, ranks in enumerate(stage_ranks):
        for i, rank in enumerate(ranks):
            mine = range(i, num_microbatches, len(ranks))
            acts: list[Action] = []
            for m in range(num_minibatches):
                for j in mine:
                    acts += _forward(s, last, m, j)
                for j in mine:
                    acts += _backward(s, last, m, j)
                acts += _update(s, m, len(ranks) > 1)
            order[rank] = acts
    return Schedule("gpipe", stage_ranks, num_minibatches, num_microbatches, order, "microbatch")


def two_bw(stage_ranks: list[list[int]], num_minibatches: int, num_microbatches: int) -> Schedule:
    """PipeDream-2BW: 1F1B over the stream of microbatches, gradients coalesced over each minibatch.

    A replicated stage's replicas take the microbatches of every minibatch round robin (microbatch ``j``
    on replica ``j % r``); each replica runs 1F1B over its own stream with :func:`warmup_count` forwards
    of warm-up (``stages - s`` when unreplicated) and, after its last microbatch of a minibatch, sums the
    coalesced gradients with the other replicas (``ALLREDUCE``) and steps. With double-buffered weights,
    minibatch ``t`` runs on version ``max(t - 1, 0)`` at every stage (the runtime's concern); that needs
    the microbatches a stage's replicas hold in flight, ``r * warmup``, to fit in one minibatch
    (``num_microbatches >= stages`` when unreplicated).

    Raises:
        PipeDreamError: bad counts (microbatches not a multiple of some stage's replicas, or too few).
    """
    _check(stage_ranks, num_minibatches, "2BW", num_microbatches)
    replicas = [len(rs) for rs in stage_ranks]
    need = max(r * warmup_count(replicas, s) for s, r in enumerate(replicas))
    if num_microbatches < need and max(replicas) == 1:
        raise PipeDreamError(f"2BW needs at least as many microbatches per minibatch as stages "
                             f"({num_microbatches} < {need}); raise --microbatches")
    if num_microbatches < need:
        raise PipeDreamError(f"2BW on replicas {replicas} needs at least {need} microbatches per minibatch (the "
                             f"replicas x warm-up microbatches a stage holds in flight must fit in one minibatch), "
                             f"got {num_microbatches}; raise --microbatches")
    last = len(stage_ranks) - 1
    order: dict[int, list[Action]] = {}
    for s, ranks in enumerate(stage_ranks):
        r = len(ranks)
        for i, rank in enumerate(ranks):
            stream = [(m, j) for m in range(num_minibatches) for j in range(i, num_microbatches, r)]
            order[rank] = _microbatch_1f1b(s, last, stream, warmup_count(replicas, s), r, num_microbatches)
    return Schedule("2bw", stage_ranks, num_minibatches, num_microbatches, order, "microbatch")


def pipedream_flush(stage_ranks: list[list[int]], num_minibatches: int, num_microbatches: int) -> Schedule:
    """PipeDream-Flush (PipeDream-2BW paper, ICML 2021): 1F1B over the microbatches of each minibatch, then a flush.

    Per minibatch, each replica of stage ``s`` runs 1F1B over its microbatches: :func:`warmup_count` forwards
    before its first backward (``d - s`` on a straight pipeline of ``d`` stages: a warm-up of ``d - 1 - s``
    forwards, then one forward and one backward in turn, then the cool-down backwards). Gradients accumulate
    over the minibatch; after its last backward the replica sums them with the other replicas of its stage
    (``ALLREDUCE``, microbatch round robin as in :func:`gpipe`) and steps. So every microbatch of minibatch
    ``t`` runs on the same weights and there is one weight version, no stashing:
    ``W(t + 1) = W(t) - lr * grad f(W(t))``, GPipe's update, with at most ``d - s`` microbatches' activations in
    flight on stage ``s`` instead of all ``m``. Unlike 2BW, any number of microbatches works.

    Raises:
        PipeDreamError: empty stages, or ``num_microbatches`` not a multiple of some stage's replicas.
    """
    _check(stage_ranks, num_minibatches, "PipeDream-Flush", num_microbatches)
    replicas = [len(rs) for rs in stage_ranks]
    last = len(stage_ranks) - 1
    order: dict[int, list[Action]] = {}
    for s, ranks in enumerate(stage_ranks):
        r = len(ranks)
        for i, rank in enumerate(ranks):
            order[rank] = [a for m in range(num_minibatches) for a in _microbatch_1f1b(
                s, last, [(m, j) for j in range(i, num_microbatches, r)], warmup_count(replicas, s), r, num_microbatches)]
    return Schedule("pipedream_flush", stage_ranks, num_minibatches, num_microbatches, order, "microbatch")


def _microbatch_1f1b(s: int, last: int, stream: list[tuple[int, int]], warmup: int, r: int,
                     num_microbatches: int) -> list[Action]:
    """1F1B over ``stream``, one replica's ``(minibatch, microbatch)`` units of stage ``s`` (of ``r`` replicas) in
    order: ``min(warmup, len(stream))`` forwards, then a backward and the next forward in turn, then the
    remaining backwards; after the replica's last microbatch of a minibatch, the update (:func:`_update`)."""
    w = min(warmup, len(stream))
    acts: list[Action] = []
    for m, j in stream[:w]:
        acts += _forward(s, last, m, j)
    for k, (m, j) in enumerate(stream):
        acts += _backward(s, last, m, j)
        if j + r >= num_microbatches:  # this replica's last microbatch of minibatch m
            acts += _update(s, m, r > 1)
        if k + w < len(stream):
            acts += _forward(s, last, *stream[k + w])
    return acts


def forward_only(stage_ranks: list[list[int]], num_minibatches: int) -> Schedule:
    """Evaluation: every minibatch goes forward through the pipeline once (round robin over replicas)."""
    if not stage_ranks or any(not rs for rs in stage_ranks):
        raise PipeDreamError(f"forward-only schedule: every stage needs at least one rank, got {stage_ranks}")
    last = len(stage_ranks) - 1
    order: dict[int, list[Action]] = {}
    for s, ranks in enumerate(stage_ranks):
        for i, rank in enumerate(ranks):
            order[rank] = [a for m in range(i, num_minibatches, len(ranks)) for a in _forward(s, last, m)]
    return Schedule("forward", stage_ranks, num_minibatches, 1, order)


def build(name: str, stage_ranks: Sequence[Sequence[int]], num_minibatches: int, num_microbatches: int = 1,
          warmup: str = DEFAULT_WARMUP) -> Schedule:
    """Schedule ``name`` for stages on ``stage_ranks`` (per stage its ranks in round-robin order, e.g.
    ``[s.ranks for s in plan.stages]``; ``warmup``: 1F1B's warm-up counts, see :func:`one_f_one_b`).
    ``"dp"`` runs the whole model on all the ranks of ``stage_ranks`` (one stage, minibatches round robin).

    Raises:
        PipeDreamError: unknown name, or the checks of the chosen schedule.
    """
    ranks = [list(rs) for rs in stage_ranks]
    if name == "1f1b":
        return one_f_one_b(ranks, num_minibatches, warmup)
    if name == "gpipe":
        return gpipe(ranks, num_minibatches, num_microbatches)
    if name == "2bw":
        return two_bw(ranks, num_minibatches, num_microbatches)
    if name == "pipedream_flush":
        return pipedream_flush(ranks, num_minibatches, num_microbatches)
    if name == "dp":  # one stage on all the ranks, in the order given
        sched = one_f_one_b([[r for rs in ranks for r in rs]], num_minibatches)
        sched.name = "dp"
        return sched
    raise PipeDreamError(f"unknown schedule {name!r}; use 1f1b, gpipe, 2bw, pipedream_flush or dp")


def dry_run(schedule: Schedule, backward_cost: int = 1) -> dict[int, list[int]]:
    """Execute the lists with unit-time ``F``, ``I`` and ``W`` (``backward_cost`` for a whole ``B``), zero-time rest.

    Receives wait for their matching send, allreduces for all replicas of the stage; sends never block.

    Returns:
        rank -> start time of each of its actions.
    Raises:
        ValueError: the lists deadlock or a receive has no matching send (names the stuck actions).
    """
    order = schedule.order
    pos = dict.fromkeys(order, 0)
    clock = dict.fromkeys(order, 0)
    times: dict[int, list[int]] = {r: [] for r in order}
    sent: dict[tuple[Kind, int, int, int | None], int] = {}
    arrivals: dict[tuple[int, int], dict[int, int]] = {}  # (stage, k-th allreduce) -> rank -> time
    ar_count = dict.fromkeys(order, 0)
    progress = True
    while progress:
        progress = False
        for r, acts in order.items():
            while pos[r] < len(acts):
                a = acts[pos[r]]
                t = clock[r]
                if a.kind in (Kind.RECV_F, Kind.RECV_B):
                    src = (Kind.SEND_F, a.stage - 1) if a.kind == Kind.RECV_F else (Kind.SEND_B, a.stage + 1)
                    key = (src[0], src[1], a.minibatch, a.microbatch)
                    if key not in sent:
                        break
                    t = max(t, sent[key])
                elif a.kind == Kind.ALLREDUCE:
                    group = arrivals.setdefault((a.stage, ar_count[r]), {})
                    group.setdefault(r, t)
                    if len(group) < len(schedule.stage_ranks[a.stage]):
                        break
                    t = max(group.values())
                    ar_count[r] += 1
                times[r].append(t)
                if a.kind in (Kind.SEND_F, Kind.SEND_B):
                    sent[(a.kind, a.stage, a.minibatch, a.microbatch)] = t
                clock[r] = t + (backward_cost if a.kind == Kind.B else 1 if a.kind in COMPUTE else 0)
                pos[r] += 1
                progress = True
    stuck = {r: str(acts[pos[r]]) for r, acts in order.items() if pos[r] < len(acts)}
    if stuck:
        raise ValueError(f"schedule {schedule.name!r} deadlocks; ranks stuck at {stuck}")
    return times
