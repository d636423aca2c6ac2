"""torch.distributed.pipelining's seven schedules as our action lists: converted from torch's own, not re-derived.

``torch.distributed.pipelining._schedule_visualizer.get_schedule_ops(cls, p, m, v)`` gives each of ``p`` ranks its
compute actions for ``m`` microbatches and ``v`` stages (model chunks) per rank without starting a process
(:func:`torch_ops` reads the same list faster).
:func:`from_torch` turns them into a :class:`pipedream.schedules.Schedule` that the simulator times:

* torch's ``F``, ``B`` (full backward), ``I`` (input gradient) and ``W`` (weight gradient) become ours, with the same
  stage (chunk) and microbatch; torch's idle slots (``None``) are dropped; an ``OVERLAP_F_B`` (DualPipeV: the
  forward of one chunk overlapped with the backward of the other) becomes its sub-actions in order, since the
  simulator runs one compute action at a time on a rank; torch's ``REDUCE_GRAD`` (the data-parallel reduction of a
  stage's gradients), ``UNSHARD`` and ``RESHARD`` (FSDP's) are dropped: the reduction and the step are ours;
* the transfers are ours, placed as :mod:`pipedream.schedules` places them: ``RECV_F`` before the ``F`` of a stage
  with a predecessor and ``SEND_F`` after the ``F`` of one with a successor; ``RECV_B`` before the ``B``/``I`` of a
  stage with a successor and ``SEND_B`` after the ``B``/``I`` of one with a predecessor (``W`` sends nothing). A
  transfer between two chunks on the same rank costs nothing;
* each stage runs on the rank torch's lists put it on (loop placement: stage ``s`` on rank ``s mod p``; V
  placement, ZBV and DualPipeV: rank ``r`` holds stages ``r`` and ``2p - 1 - r``);
* ``minibatches`` iterations one after another, each ending on every rank with one ``STEP`` per chunk it holds
  (all seven are flush schedules: one weight version, the step after the last backward of the iteration).

Every action keeps torch's text form apart from the minibatch: :func:`torch_text` writes ours as torch writes its.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from pipedream.errors import PipeDreamError
from pipedream.schedules import BACKWARDS, Action, Kind, Schedule

# our name -> torch.distributed.pipelining.schedules class
TORCH_CLASSES = {"gpipe": "ScheduleGPipe", "pipedream_flush": "Schedule1F1B",
                 "interleaved_1f1b": "ScheduleInterleaved1F1B", "looped_bfs": "ScheduleLoopedBFS",
                 "interleaved_zb": "ScheduleInterleavedZeroBubble", "zbv": "ScheduleZBVZeroBubble",
                 "dualpipev": "ScheduleDualPipeV"}
# chunks (stages) per rank each schedule takes: exactly one, exactly two (the V shapes), or two or more
CHUNKS = {"gpipe": (1,), "pipedream_flush": (1,), "zbv": (2,), "dualpipev": (2,)}
DEFAULT_CHUNKS = 2  # of a looped schedule (interleaved_1f1b, looped_bfs, interleaved_zb) when none is given
_KINDS = {"F": Kind.F, "B": Kind.B, "I": Kind.I, "W": Kind.W}
_DROPPED = ("REDUCE_GRAD", "UNSHARD", "RESHARD")  # data-parallel (FSDP) actions: the step's reduction is ours


def schedule_name(schedule: str | type) -> str:
    """Our name (a key of :data:`TORCH_CLASSES`) of a schedule given by our name, torch's class or its name.

    Raises:
        PipeDreamError: not one of the seven.
    """
    cls = schedule if isinstance(schedule, str) else schedule.__name__
    for ours, theirs in TORCH_CLASSES.items():
        if cls in (ours, theirs):
            return ours
    raise PipeDreamError(f"unknown torch schedule {cls!r}; use one of {', '.join(TORCH_CLASSES)}")


def chunks_of(name: str, chunks: int | None = None) -> int:
    """Chunks per rank of schedule ``name``: ``chunks`` checked against what the schedule takes, or its default.

    Raises:
        PipeDreamError: a count the schedule does not take (names the ones it does).
    """
    allowed = CHUNKS.get(name)
    if chunks is None:
        return allowed[0] if allowed else DEFAULT_CHUNKS
    if (allowed and chunks not in allowed) or chunks < 1 or (not allowed and chunks < 2):
        what = f"exactly {allowed[0]}" if allowed else "2 or more"
        raise PipeDreamError(f"schedule {name} runs {what} chunks (stages) per rank, not {chunks}; pass --chunks "
                             f"{allowed[0] if allowed else DEFAULT_CHUNKS}")
    return chunks


def torch_schedule(name: str, n_ranks: int, n_microbatches: int, chunks: int) -> Any:
    """torch's schedule class of ``name`` built on stub stages of rank 0 (``n_ranks`` ranks, ``chunks`` stages a rank,
    no process group), as ``get_schedule_ops`` builds it, but for the constructor's preparation of the list with
    transfers, which is skipped: its ``pipeline_order`` (per rank, torch's actions with ``None`` for idle slots) in
    a fraction of the time. Its ``_load_csv`` reads a list in the same way.

    Raises:
        PipeDreamError: counts torch refuses (its message, e.g. microbatches not a multiple of the rounds).
    """
    from torch.distributed.pipelining import schedules as ts

    cls = getattr(ts, TORCH_CLASSES[name])
    listed = type(cls.__name__, (cls,), {"_prepare_schedule_with_comms": lambda self, *args, **kwargs: None})
    stage = {"group_rank": 0, "group_size": n_ranks, "num_stages": n_ranks * chunks, "submod": None}
    single = issubclass(cls, ts.PipelineScheduleSingle)
    try:
        out = listed(SimpleNamespace(**stage) if single else [SimpleNamespace(**stage) for _ in range(chunks)],
                     n_microbatches)
        if sorted(out.pipeline_order) != list(range(n_ranks)):
            raise KeyError(f"pipeline_order lists ranks {sorted(out.pipeline_order)}")
    except (ValueError, AssertionError, RuntimeError, KeyError, IndexError, ZeroDivisionError) as e:
        raise PipeDreamError(f"torch's {cls.__name__} refuses {n_ranks} ranks, {n_microbatches} microbatches and "
                             f"{chunks} chunks per rank: {e}") from None
    return out


@functools.lru_cache(maxsize=1024)
def torch_ops(name: str, n_ranks: int, n_microbatches: int, chunks: int) -> tuple[tuple[tuple[int, str, int], ...], ...]:
    """Per rank, torch's compute actions ``(stage, "F" | "B" | "I" | "W", microbatch)`` in order, idle slots
    dropped and an ``OVERLAP_F_B`` replaced by its sub-actions (cached: they depend on the counts only).

    The schedule's ``pipeline_order`` is read from :func:`torch_schedule` (the conversion test compares with
    ``get_schedule_ops`` itself).

    Raises:
        PipeDreamError: counts torch refuses (its message, e.g. microbatches not a multiple of the rounds).
    """
    order = torch_schedule(name, n_ranks, n_microbatches, chunks).pipeline_order
    ops = [order[r] for r in range(n_ranks)]
    cls_name = TORCH_CLASSES[name]

    def flat(rank: list[Any]) -> tuple[tuple[int, str, int], ...]:
        out = []
        for a in rank:
            for b in (a.sub_actions or (a,)) if a is not None else ():
                kind = b.computation_type.value
                if kind in _KINDS:
                    out.append((b.stage_index, kind, b.microbatch_index))
                elif kind not in _DROPPED:
                    raise PipeDreamError(f"torch's {cls_name} has an action {b} of kind {kind}, which has no "
                                         "meaning here")
        return tuple(out)

    return tuple(flat(rank) for rank in ops)


@functools.lru_cache(maxsize=256)
def positions(name: str, n_ranks: int, chunks: int) -> tuple[int, ...]:
    """Per stage, the pipeline position (rank ``0 .. n_ranks - 1``) torch's lists run it on (:func:`torch_ops` at
    ``2 n_ranks`` microbatches, a count all seven take; the placement does not depend on it).

    Raises:
        PipeDreamError: a list that does not place every stage.
    """
    where: dict[int, int] = {}
    for q, rank_ops in enumerate(torch_ops(name, n_ranks, 2 * n_ranks, chunks)):
        for s, _, _ in rank_ops:
            where.setdefault(s, q)
    if sorted(where) != list(range(n_ranks * chunks)):
        raise PipeDreamError(f"torch's {TORCH_CLASSES[name]} does not place stages 0..{n_ranks * chunks - 1} on its ranks")
    return tuple(where[s] for s in range(n_ranks * chunks))


def iteration_defect(ops: Sequence[Sequence[tuple[int, str, int]]], stages: int, microbatches: int) -> str | None:
    """What keeps per-rank compute actions (:func:`torch_ops`) from being one training iteration, or None: every
    stage and microbatch ``0 .. microbatches - 1`` must have one ``F`` and either one ``B`` or one ``I`` and one
    ``W``, all on one rank, ``F`` before the backward and ``I`` before ``W``."""
    seen: dict[tuple[int, int], list[str]] = {}
    rank_of: dict[int, int] = {}
    for q, rank_ops in enumerate(ops):
        for s, kind, j in rank_ops:
            if not (0 <= s < stages and 0 <= j < microbatches):
                return f"rank {q} runs {s}{kind}{j}, outside stages 0..{stages - 1} or microbatches 0..{microbatches - 1}"
            if rank_of.setdefault(s, q) != q:
                return f"stage {s} runs on ranks {rank_of[s]} and {q}"
            seen.setdefault((s, j), []).append(kind)
    for s in range(stages):
        for j in range(microbatches):
            kinds = seen.get((s, j), [])
            if kinds not in (["F", "B"], ["F", "I", "W"]):
                return f"stage {s}, microbatch {j} runs {kinds or 'nothing'}, not F then B or F, I, W"
    return None


def torch_text(action: Action) -> str:
    """``action`` in torch's text form, ``f"{stage}{kind}{microbatch}"`` (e.g. ``"3I5"``): ours without the minibatch."""
    return f"{action.stage}{action.kind.value}{action.microbatch}"


def from_torch(schedule: str | type, n_ranks: int, n_microbatches: int, chunks: int | None = None, *,
               minibatches: int = 1, ranks: Sequence[int] | None = None, check: bool = True) -> Schedule:
    """torch's ``schedule`` for ``n_ranks`` ranks, ``n_microbatches`` microbatches and ``chunks`` stages per rank as
    a :class:`~pipedream.schedules.Schedule` (see the module docstring).

    Args:
        schedule: our name (:data:`TORCH_CLASSES`), torch's class or the class's name.
        n_ranks: pipeline ranks ``p``; the pipeline has ``p * chunks`` stages.
        n_microbatches: microbatches per minibatch (iteration).
        chunks: stages per rank (None: the schedule's default, :func:`chunks_of`).
        minibatches: iterations, one after another.
        ranks: the global rank of each of the ``p`` pipeline positions (None: ``0 .. p - 1``).
        check: refuse a list that is not one training iteration (:func:`iteration_defect`).
    Raises:
        PipeDreamError: an unknown schedule, a chunk count it does not take, counts torch refuses, ``ranks`` of
            the wrong length, or (``check``) a defect of torch's list.
    """
    name = schedule_name(schedule)
    v = chunks_of(name, chunks)
    if n_ranks < 1 or n_microbatches < 1 or minibatches < 1:
        raise PipeDreamError(f"schedule {name} needs positive ranks, microbatches and minibatches, got {n_ranks}, "
                             f"{n_microbatches} and {minibatches}")
    where = list(ranks) if ranks is not None else list(range(n_ranks))
    if len(where) != n_ranks:
        raise PipeDreamError(f"schedule {name}: {len(where)} ranks given for {n_ranks} pipeline positions")
    ops = torch_ops(name, n_ranks, n_microbatches, v)
    last = n_ranks * v - 1
    position: dict[int, int] = {}
    for q, rank_ops in enumerate(ops):
        for s, _, _ in rank_ops:
            position.setdefault(s, q)
    if sorted(position) != list(range(last + 1)):
        raise PipeDreamError(f"torch's {TORCH_CLASSES[name]} does not place stages 0..{last} on its ranks")
    defect = iteration_defect(ops, last + 1, n_microbatches) if check else None
    if defect:
        raise PipeDreamError(f"torch's {TORCH_CLASSES[name]} list for {n_ranks} ranks and {n_microbatches} microbatches "
                             f"is not one training iteration: {defect}")
    order: dict[int, list[Action]] = {}
    for q, rank_ops in enumerate(ops):
        acts: list[Action] = []
        mine = sorted({s for s, _, _ in rank_ops})
        for k in range(minibatches):
            for s, kind_text, j in rank_ops:
                kind = _KINDS[kind_text]
                if kind == Kind.F and s > 0:
                    acts.append(Action(s, Kind.RECV_F, k, j))
                if kind in BACKWARDS and s < last:
                    acts.append(Action(s, Kind.RECV_B, k, j))
                acts.append(Action(s, kind, k, j))
                if kind == Kind.F and s < last:
                    acts.append(Action(s, Kind.SEND_F, k, j))
                if kind in BACKWARDS and s > 0:
                    acts.append(Action(s, Kind.SEND_B, k, j))
            acts += [Action(s, Kind.STEP, k) for s in mine]
        order[where[q]] = acts
    stage_ranks = [[where[position[s]]] for s in range(last + 1)]
    return Schedule(name, stage_ranks, minibatches, n_microbatches, order, "microbatch")
