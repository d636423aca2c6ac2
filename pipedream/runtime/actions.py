"""What a rank's action list (:mod:`pipedream.schedules`) implies for the executor, decided before it runs: when
each send and receive is issued (:func:`issue_plan`), which backwards launch the gradient allreduce
(:func:`overlapped_backwards`) and over how many leading actions the memory meter counts (:func:`memory_window`).
"""

from __future__ import annotations

from pipedream.schedules import Action, Kind

SENDS = (Kind.SEND_F, Kind.SEND_B)
RECVS = (Kind.RECV_F, Kind.RECV_B)


def issue_plan(actions: list[Action], batched: bool) -> list[list[int]]:
    """Which send/receive actions a rank issues right before executing each action of ``actions``.

    Returns ``plan`` with ``plan[i]`` the indices (into ``actions``) issued before action ``i``
    runs; every send and receive appears exactly once, a send never before the computation that
    produces it, a receive never after the action that waits for it.

    * ``batched`` (in-order backends, NCCL): each maximal run of consecutive sends and receives is
      issued at its first action, as one batch (one ``batch_isend_irecv``). In 1F1B's steady state a
      batch is a ``SEND_F`` with the next ``RECV_B`` (or a ``SEND_B`` with the next ``RECV_F``): the
      exchange with a neighbour that both sides need before they can compute again.
    * otherwise (tag-matched backends, gloo): a send at its own action; a receive as early as its data can
      come, and no earlier, so that a posted buffer is never held for a (micro)batch the stage has not
      started: a ``RECV_B`` with the ``SEND_F`` of the same (micro)batch (its gradient cannot come before the
      activation went), a ``RECV_F`` one ahead (at the previous ``RECV_F``; the first at the start). The
      buffers this holds are what :func:`pipedream.memory.stage_memory` counts: one gradient per
      (micro)batch in flight and one input posted ahead.
    """
    plan: list[list[int]] = [[] for _ in actions]
    comm = [k in SENDS or k in RECVS for k in (a.kind for a in actions)]
    if batched:
        for i, is_comm in enumerate(comm):
            if is_comm and (i == 0 or not comm[i - 1]):
                j = i
                while j < len(actions) and comm[j]:
                    j += 1
                plan[i] = list(range(i, j))
        return plan
    sent_at = {a.key: i for i, a in enumerate(actions) if a.kind == Kind.SEND_F}
    previous_recv_f = 0
    for i, a in enumerate(actions):
        if a.kind == Kind.RECV_B:
            plan[min(sent_at.get(a.key, i), i)].append(i)
        elif a.kind == Kind.RECV_F:
            plan[previous_recv_f].append(i)
            previous_recv_f = i
        elif a.kind in SENDS:
            plan[i].append(i)
    return plan


# the memory meter counts over the first 2 x stages + 2 minibatches of each training pass (memory_minibatches)
MEMORY_MINIBATCHES_PER_STAGE = 2


def memory_minibatches(stages: int) -> int:
    """How many leading minibatches of each training pass the memory meter counts over, for a pipeline of
    ``stages`` stages: ``2 x stages + 2``, past the warm-up (at most ``stages`` in flight, :func:`memory_window`).
    The PipeDream workers pass it to :func:`memory_window`; the DP baseline (one stage) counts its first 4 steps of
    each epoch. Counting after every step would slow every step (a count walks every tensor the worker holds; the
    saved-tensor hooks keep every activation alive until the backward ends), time the prediction does not have."""
    return MEMORY_MINIBATCHES_PER_STAGE * stages + 2


def memory_window(actions: list[Action], minibatches: int) -> int:
    """How many leading actions of ``actions`` the memory meter counts after: up to and including the last
    backward of the ``minibatches``-th distinct minibatch whose backward the rank runs (all of ``actions``
    when it runs fewer).

    A schedule is periodic once its warm-up is over (1F1B: at most ``stages`` minibatches in flight, §3.2;
    GPipe, 2BW and PipeDream-Flush: each minibatch's microbatches run alike), so the peak of a training pass is reached
    within its first few minibatches, and counting after every action of a long epoch (a Python walk over every
    tensor the stage holds) only costs time. Every forward inside the window records its saved tensors, and no
    count happens after it, so what is counted is complete.
    """
    last_b = {a.minibatch: i for i, a in enumerate(actions) if a.kind == Kind.B}  # in order of first backward
    ends = list(last_b.values())
    return ends[minibatches - 1] + 1 if 0 < minibatches <= len(ends) else len(actions)


def overlapped_backwards(actions: list[Action]) -> set[int]:
    """Indices of the ``B`` actions whose gradients complete an update: those followed by an ``ALLREDUCE``
    with only sends and receives in between. Their backward launches the bucket allreduces; earlier
    backwards of the same minibatch (GPipe and 2BW microbatches) only accumulate."""
    out: set[int] = set()
    last_b: int | None = None
    for i, a in enumerate(actions):
        if a.kind == Kind.ALLREDUCE and last_b is not None:
            out.add(last_b)
        if a.kind not in SENDS and a.kind not in RECVS:
            last_b = i if a.kind == Kind.B else None
    return out
