"""Parameters that several stages hold, such as a language model's tied input and output embeddings.

When a plan puts two users of one parameter in different stages, each of those stages keeps its own copy
of it (every rank builds the whole model from the same seed, so the copies start equal). Before every
optimizer step the copies' gradients are summed over all the ranks that hold one, on a process group of
those ranks, so that each copy takes the step the one parameter takes in a single process (Megatron-LM does
the same for its embeddings). The copies then stay equal: same gradient, same optimizer, same learning rate.

The sum is taken at each ``STEP``: the ``k``-th step of every holding stage is the update of the same
minibatches (one per step, or a round of ``r`` minibatches on stages replicated ``r`` times under 1F1B-RR),
so every holding stage must step over the same minibatches: under 1F1B they need equal replica counts
(:func:`check`; its rule, :func:`pipedream.tied.replica_conflict`, is the one the planner applies too). A
replica's gradient is already its stage's (averaged or summed over the replicas by the ``ALLREDUCE`` before the
step), so each rank adds ``grad / replicas of its stage`` and the sum over the group is the sum over the stages.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from pipedream.errors import PipeDreamError
from pipedream.tied import replica_conflict


@dataclass(frozen=True)
class Shared:
    """One parameter held by several stages.

    Attributes:
        stages: the stages holding it, in pipeline order.
        names: its name in each of those stages' modules (the model's names for the layer that reads it:
            ``transformer.wte.weight`` in one stage, ``lm_head.weight`` in another).
    """

    stages: tuple[int, ...]
    names: tuple[str, ...]

    def name_in(self, stage: int) -> str:
        """The parameter's name in ``stage``'s module."""
        return self.names[self.stages.index(stage)]


def find(modules: list[nn.Module]) -> list[Shared]:
    """Parameters (the same tensor object) held by more than one of ``modules``, in order of first appearance."""
    seen: dict[int, list[tuple[int, str]]] = {}
    for s, module in enumerate(modules):
        for name, p in module.named_parameters():
            holders = seen.setdefault(id(p), [])
            if not any(h == s for h, _ in holders):
                holders.append((s, name))
    return [Shared(tuple(s for s, _ in h), tuple(n for _, n in h)) for h in seen.values() if len(h) > 1]


def check(shared: list[Shared], replicas: list[int], schedule: str, clip_norm: float) -> None:
    """Refuse what would move the copies of a shared parameter apart.

    Raises:
        PipeDreamError: under 1F1B, holding stages with different replica counts (their steps cover different
            minibatches); gradient clipping per stage (each stage would scale the shared gradient differently).
    """
    for sh in shared:
        why = replica_conflict(sh.names[0], sh.stages, replicas, schedule)  # the planner drops such plans too
        if why is not None:
            raise PipeDreamError(why)
        if clip_norm > 0:
            raise PipeDreamError(f"parameter {sh.names[0]} is used by stages {list(sh.stages)}: --clip-norm clips each "
                                 "stage's gradients on its own, which would move its copies apart; leave --clip-norm out")


class SharedGrads:
    """Sums the gradients of one stage's shared parameters over every rank that holds them (one rank's part).

    Args:
        shared: every shared parameter of the plan (:func:`find`), the same list on every rank.
        stage: this rank's stage; ``module`` its module.
        stage_ranks: the ranks of every stage.
        timeout_s: longest wait for one sum, s.
    Every rank must construct it, in the same order, since it creates one process group per set of holding
    stages (``torch.distributed.new_group`` is collective).
    """

    def __init__(self, shared: list[Shared], stage: int, module: nn.Module, stage_ranks: list[list[int]],
                 timeout_s: float) -> None:
        params = dict(module.named_parameters())
        self.timeout_s = timeout_s
        self.divisor = float(len(stage_ranks[stage]))
        self.sets: list[tuple[object, list[torch.Tensor], tuple[int, ...]]] = []
        by_stages: dict[tuple[int, ...], list[Shared]] = {}
        for sh in shared:
            by_stages.setdefault(sh.stages, []).append(sh)
        for stages, members in by_stages.items():  # the same order everywhere: new_group is collective
            ranks = sorted(r for s in stages for r in stage_ranks[s])
            group = dist.new_group(ranks)
            if stage in stages:
                self.sets.append((group, [params[sh.name_in(stage)] for sh in members], stages))

    def sum_(self) -> None:
        """Replace each shared parameter's ``.grad`` by the sum of its stages' gradients (before the step).

        Raises:
            CommTimeout: a holding rank did not join within the timeout.
        """
        from pipedream.runtime.comm import wait_or_raise

        for group, params, stages in self.sets:
            flat = torch.cat([p.grad.reshape(-1) for p in params]).div_(self.divisor)  # type: ignore[union-attr]
            work = dist.all_reduce(flat, group=group, async_op=True)
            wait_or_raise(work, self.timeout_s, f"sum of the gradients of parameters shared by stages {list(stages)}")
            offset = 0
            for p in params:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))  # type: ignore[union-attr]
                offset += p.numel()
