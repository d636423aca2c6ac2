"""Where a plan's stages run on torch.distributed.pipelining: pipelines, positions and the chunks of each rank.

A plan for one of torch's seven schedules (:data:`pipedream.torch_schedules.TORCH_CLASSES`) has ``S = p v`` stages
(``v`` chunks per rank) on ``w`` parallel straight pipelines of depth ``p``: stage ``s`` has one rank per pipeline,
``stage.ranks[i]`` on pipeline ``i``. torch's schedule places stage ``s`` on pipeline position
:func:`pipedream.torch_schedules.positions` ``[s]`` (loop placement ``s mod p``; V placement for ZBV and DualPipeV),
and a position is a *group rank* of the pipeline's process group, which numbers its members in increasing global
rank. :func:`layout` checks a plan against that and gives the :class:`TorchLayout` the torch worker
(:mod:`pipedream.runtime.torch_worker`) builds its process groups and ``PipelineStage`` objects from;
:func:`place` places an unplaced split (one stage a rank, in order) as torch places it.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipedream.errors import PipeDreamError
from pipedream.plan import Plan
from pipedream.torch_schedules import TORCH_CLASSES, chunks_of, positions, schedule_name


@dataclass(frozen=True)
class TorchLayout:
    """A plan's stages on torch's pipelines.

    Attributes:
        schedule: our name of torch's schedule (a key of :data:`~pipedream.torch_schedules.TORCH_CLASSES`).
        chunks: stages per rank (``v``).
        pipelines: per pipeline, the global rank at each position ``0 .. p - 1`` (increasing).
        position: per stage, its pipeline position.
    """

    schedule: str
    chunks: int
    pipelines: list[list[int]]
    position: list[int]

    @property
    def depth(self) -> int:
        """Pipeline positions ``p``."""
        return len(self.pipelines[0])

    @property
    def width(self) -> int:
        """Parallel pipelines ``w`` (the replicas of every stage)."""
        return len(self.pipelines)

    @property
    def stages(self) -> int:
        """Stages ``S = p v``."""
        return len(self.position)

    @property
    def torch_class(self) -> str:
        """The name of torch's schedule class, e.g. ``"ScheduleInterleaved1F1B"``."""
        return TORCH_CLASSES[self.schedule]

    def pipeline_of(self, rank: int) -> int:
        """The pipeline global ``rank`` is on.

        Raises:
            PipeDreamError: no pipeline holds ``rank``.
        """
        for i, ranks in enumerate(self.pipelines):
            if rank in ranks:
                return i
        raise PipeDreamError(f"rank {rank} is on none of the pipelines {self.pipelines}")

    def stages_of(self, rank: int) -> list[int]:
        """The stages global ``rank`` runs, in increasing order (``v`` of them)."""
        q = self.pipelines[self.pipeline_of(rank)].index(rank)
        return [s for s, where in enumerate(self.position) if where == q]

    def replicas_at(self, position: int) -> list[int]:
        """The global ranks of ``position`` on every pipeline: the replicas of its stages."""
        return [ranks[position] for ranks in self.pipelines]


def layout(plan: Plan, schedule: str) -> TorchLayout:
    """The layout of ``plan`` under torch's ``schedule`` (our name or torch's class name).

    Raises:
        PipeDreamError: not one of torch's schedules; stages with different replica counts; a stage count that is
            not ``v`` per rank; a stage not where torch's schedule puts it; a pipeline whose ranks do not increase
            with the position (its process group would number them otherwise).
    """
    name = schedule_name(schedule)
    widths = {s.replicas for s in plan.stages}
    if len(widths) != 1 or any(len(s.ranks) != s.replicas for s in plan.stages):
        raise PipeDreamError(f"plan {plan.config!r} replicates its stages unevenly (PipeDream's 1F1B-RR), which "
                             "torch's schedules do not run; plan with `pipedream plan --runtime torch`")
    (w,) = widths
    if plan.workers % w or len(plan.stages) % (plan.workers // w):
        raise PipeDreamError(f"plan of {len(plan.stages)} stages on {plan.workers} workers in {w} pipelines: not "
                             f"the same number of stages on every rank")
    p = plan.workers // w
    v = chunks_of(name, len(plan.stages) // p)
    where = list(positions(name, p, v))
    pipelines: list[list[int | None]] = [[None] * p for _ in range(w)]
    for s, stage in enumerate(plan.stages):
        for i, r in enumerate(stage.ranks):
            held = pipelines[i][where[s]]
            if held is not None and held != r:
                raise PipeDreamError(f"stage {s} runs on rank {r}, but {TORCH_CLASSES[name]} puts it on position "
                                     f"{where[s]} with stage {where.index(where[s])}, on rank {held}; plan again "
                                     "with `pipedream plan --runtime torch --schedule " + name + "`")
            pipelines[i][where[s]] = r
    placed = [[r for r in ranks if r is not None] for ranks in pipelines]
    for ranks in placed:
        if len(ranks) != p or ranks != sorted(ranks):
            raise PipeDreamError(f"pipeline on ranks {ranks}: torch's pipeline positions are the ranks in increasing "
                                 f"order, {p} of them; plan again with `pipedream plan --runtime torch`")
    return TorchLayout(name, v, placed, where)


def place(plan: Plan, schedule: str, workers: int) -> Plan:
    """``plan``'s ``workers x v`` stages (one rank each, in order: an even split) placed as torch's ``schedule``
    places them on ranks ``0 .. workers - 1``: stage ``s`` on rank ``positions[s]``, ``extra["chunks"] = v``.

    Raises:
        PipeDreamError: the stage count is not a multiple of ``workers``, or not ``v`` a rank for the schedule.
    """
    name = schedule_name(schedule)
    if len(plan.stages) % workers:
        raise PipeDreamError(f"{len(plan.stages)} stages do not divide over {workers} workers")
    v = chunks_of(name, len(plan.stages) // workers)
    for stage, q in zip(plan.stages, positions(name, workers, v), strict=True):
        stage.replicas, stage.ranks = 1, [q]
    plan.workers = workers
    plan.extra.update(schedule=name, chunks=v)
    return plan
