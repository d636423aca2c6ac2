"""A pipeline configuration: what the planner writes and the runtime and simulator read.

A :class:`Plan` is a list of :class:`Stage` objects in pipeline order. Each stage owns a set of layer
graph nodes, is replicated on ``replicas`` workers (data parallel inside the stage) and maps to the
global ranks ``ranks``. The config string follows the paper's Table 1: ``"15-1"`` (two stages,
replicated 15 and 1 times), ``"16"`` (data parallelism), ``"straight"`` (1-1-...-1 with more than one
stage).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipedream.errors import PipeDreamError
from pipedream.io import atomic_write_json, read_json_object


@dataclass
class Stage:
    """One pipeline stage.

    Attributes:
        nodes: layer-graph node ids the stage runs, in topological order.
        replicas: number of workers running this stage (data parallel inside the stage).
        ranks: global ranks of those workers (``len(ranks) == replicas``) in round-robin order: replica
            ``i``, on ``ranks[i]``, runs the minibatches ``m`` with ``m % replicas == i``
            (:meth:`pipedream.schedules.Schedule.rank_of`). The planner writes them
            (:mod:`pipedream.placement`); the runtime and the simulator both run exactly them.
        compute_s: forward+backward time of the stage for one profiled minibatch on one worker, s.
        comm_s: communication time charged to the stage per minibatch (activations, weight sync), s.
        memory_bytes: estimated memory one replica needs (weights, stashed versions, activations), bytes.
    """

    nodes: list[str]
    replicas: int = 1
    ranks: list[int] = field(default_factory=list)
    compute_s: float = 0.0
    comm_s: float = 0.0
    memory_bytes: float = 0.0


def config_string(replicas: list[int]) -> str:
    """The paper's config string for per-stage replica counts.

    ``[15, 1] -> "15-1"``, ``[16] -> "16"``, ``[1, 1, 1, 1] -> "straight"``.
    """
    if len(replicas) > 1 and all(r == 1 for r in replicas):
        return "straight"
    return "-".join(str(r) for r in replicas)


@dataclass
class Plan:
    """A partitioned, replicated pipeline for one model on one cluster.

    Attributes:
        model: model name, e.g. ``"vgg16"``.
        cluster: cluster name, e.g. ``"A_4x4"`` or ``"cpu4"``.
        workers: total number of workers (sum of replicas).
        stages: the stages in pipeline order.
        minibatch_size: samples in the profiled minibatch that times refer to.
        time_per_sample_s: predicted pipeline time per sample (bottleneck stage / minibatch), s.
        dp_time_per_sample_s: predicted data-parallel time per sample on the same workers, s.
        extra: planner-specific details (flags, explanation), JSON-serialisable.
    """

    model: str
    cluster: str
    workers: int
    stages: list[Stage]
    minibatch_size: int
    time_per_sample_s: float
    dp_time_per_sample_s: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def config(self) -> str:
        """Config string, e.g. ``"15-1"``; see :func:`config_string`."""
        return config_string([s.replicas for s in self.stages])

    @property
    def predicted_speedup(self) -> float:
        """Predicted DP time / pipeline time (>1 means the pipeline is faster)."""
        return self.dp_time_per_sample_s / self.time_per_sample_s if self.time_per_sample_s > 0 else float("nan")

    @property
    def optimizer(self) -> str | None:
        """The optimizer whose step the planner charged (``extra["optimizer"]``: PipeDream's planner and
        re-ranking, the 2BW planner); None for a plan that does not say (older plans, hand-written ones)."""
        value = self.extra.get("optimizer")
        return value if isinstance(value, str) else None

    @property
    def chunks(self) -> int:
        """Stages (model chunks) each rank runs: ``extra["chunks"]`` of a plan for an interleaved or V-shaped
        schedule (:mod:`pipedream.planner.schedule_search`), else 1."""
        value = self.extra.get("chunks", 1)
        return value if isinstance(value, int) and value > 1 else 1

    def stage_of_rank(self, rank: int) -> int:
        """Index of the stage that global ``rank`` runs; raises PipeDreamError if none does, or if ranks run several
        (a plan for torch's interleaved or V-shaped schedules, which this runtime does not run)."""
        if self.chunks > 1:
            raise PipeDreamError(f"plan runs {self.chunks} stages a rank for schedule {self.extra.get('schedule')!r}, "
                                 "which torch.distributed.pipelining runs and this runtime does not; train it with "
                                 "--runtime torch")
        for i, s in enumerate(self.stages):
            if rank in s.ranks:
                return i
        raise PipeDreamError(f"rank {rank} has no stage in plan {self.config!r} for {self.workers} workers")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict, including the derived ``config`` and ``predicted_speedup``."""
        d = asdict(self)
        d["config"] = self.config
        d["predicted_speedup"] = self.predicted_speedup
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        """Inverse of :meth:`to_dict`; raises PipeDreamError naming a missing or bad key."""
        try:
            stages = [Stage(**s) for s in d["stages"]]
            plan = cls(model=d["model"], cluster=d["cluster"], workers=int(d["workers"]), stages=stages,
                       minibatch_size=int(d["minibatch_size"]), time_per_sample_s=float(d["time_per_sample_s"]),
                       dp_time_per_sample_s=float(d["dp_time_per_sample_s"]), extra=dict(d.get("extra", {})))
        except (KeyError, TypeError, ValueError) as e:
            raise PipeDreamError(f"malformed plan: {type(e).__name__}: {e}; regenerate it with `pipedream plan`") from None
        plan.validate()
        return plan

    def validate(self, allow_empty_stages: bool = False) -> None:
        """Refuse what the runtime cannot run; raises PipeDreamError naming the stage and the fix.

        Every stage has layers and ``replicas`` ranks (``len(ranks) == replicas``, in round-robin order:
        replica ``i`` takes minibatches ``m % replicas == i``); together the stages use the ranks
        ``0 .. workers - 1`` each exactly once (:attr:`chunks` times in a plan for several stages a rank). A plan
        written before the placement moved into ``Stage.ranks`` (it has ``extra["placement_rank_map"]``) is refused:
        its stages' ranks are not the placement its estimate assumed. ``allow_empty_stages`` lets the planner's compat
        mode return the release's answer when that has a stage without layers (it cannot be run, nor loaded from a
        file).
        """
        if not self.stages:
            raise PipeDreamError("plan has no stages; regenerate it with `pipedream plan`")
        if "placement_rank_map" in self.extra:
            raise PipeDreamError("plan has extra.placement_rank_map, the placement of an older planner that its "
                                 "stages' ranks do not follow; regenerate it with `pipedream plan`")
        owner: dict[int, int] = {}
        uses: dict[int, int] = {}
        for i, s in enumerate(self.stages):
            if not s.nodes and not allow_empty_stages:
                raise PipeDreamError(f"plan stage {i} has no layers; give it layers or remove the stage")
            if s.replicas < 1 or len(s.ranks) != s.replicas:
                raise PipeDreamError(f"plan stage {i}: replicas={s.replicas} but ranks={s.ranks}; "
                                     "give the stage exactly one rank per replica")
            for r in s.ranks:
                if not isinstance(r, int) or not 0 <= r < self.workers:
                    raise PipeDreamError(f"plan stage {i}: rank {r!r} is not one of 0..{self.workers - 1} "
                                         f"(workers={self.workers}); use ranks 0..{self.workers - 1}")
                uses[r] = uses.get(r, 0) + 1
                if r in owner and (owner[r] == i or uses[r] > self.chunks):
                    where = "twice" if owner[r] == i else f"also by stage {owner[r]}"
                    raise PipeDreamError(f"plan stage {i}: rank {r} is used {where}; give every rank to one "
                                         f"replica of {'one stage' if self.chunks == 1 else f'{self.chunks} stages'}")
                owner.setdefault(r, i)
        if len(owner) != self.workers:
            missing = sorted(set(range(self.workers)) - set(owner))
            raise PipeDreamError(f"plan uses {len(owner)} ranks but says workers={self.workers} (ranks {missing} "
                                 f"have no stage); set workers={len(owner)} or give those ranks a stage")

    def save(self, path: str | Path) -> None:
        """Write the plan as JSON atomically."""
        atomic_write_json(Path(path), self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        """Read a plan JSON file; raises PipeDreamError if missing or malformed."""
        d = read_json_object(Path(path), "plan", "the plan's JSON file", "regenerate it with `pipedream plan`",
                             "; run `pipedream plan` first")
        return cls.from_dict(d)
