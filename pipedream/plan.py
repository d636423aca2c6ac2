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
        ranks: global ranks of those workers (``len(ranks) == replicas``).
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

    def stage_of_rank(self, rank: int) -> int:
        """Index of the stage that global ``rank`` runs; raises PipeDreamError if none does."""
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
            plan = cls(
                model=d["model"],
                cluster=d["cluster"],
                workers=int(d["workers"]),
                stages=stages,
                minibatch_size=int(d["minibatch_size"]),
                time_per_sample_s=float(d["time_per_sample_s"]),
                dp_time_per_sample_s=float(d["dp_time_per_sample_s"]),
                extra=dict(d.get("extra", {})),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise PipeDreamError(f"malformed plan: {type(e).__name__}: {e}; regenerate it with `pipedream plan`") from None
        plan.validate()
        return plan

    def validate(self) -> None:
        """Check ranks and replicas agree; raises PipeDreamError naming the inconsistency."""
        if not self.stages:
            raise PipeDreamError("plan has no stages")
        seen: set[int] = set()
        for i, s in enumerate(self.stages):
            if s.replicas < 1 or len(s.ranks) != s.replicas:
                raise PipeDreamError(f"plan stage {i}: replicas={s.replicas} but ranks={s.ranks}")
            if seen & set(s.ranks):
                raise PipeDreamError(f"plan stage {i}: rank(s) {sorted(seen & set(s.ranks))} already used by another stage")
            seen |= set(s.ranks)
        if sum(s.replicas for s in self.stages) != self.workers:
            raise PipeDreamError(f"plan uses {sum(s.replicas for s in self.stages)} workers but says workers={self.workers}")

    def save(self, path: str | Path) -> None:
        """Write the plan as JSON atomically."""
        atomic_write_json(Path(path), self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        """Read a plan JSON file; raises PipeDreamError if missing or malformed."""
        d = read_json_object(Path(path), "plan", "the plan's JSON file", "regenerate it with `pipedream plan`",
                             "; run `pipedream plan` first")
        return cls.from_dict(d)
