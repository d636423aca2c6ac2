"""What the original release's driver configs ran for Table 1's GNMT pipeline rows, as data.

Table 1 names a configuration (``"straight"``) but not the split; the release (msr-fiddle/pipedream,
``runtime/translation/``) ships the stage modules its driver configs ran (``models/<model>/gpus=N/stageK.py``)
and the stage map each driver config names (``mp_conf.json``: ``stage_to_rank_map``). Those facts, read off the
release's files, are in ``experiments/release_runs.yaml``: per row, each stage as ranges of the release profile's
node ids, the ranks of each stage, the optimizer's own configuration for the row where the release has one
(``hybrid_conf.json``) and the per-GPU batch (the driver config's ``batch_size``). The file says how the stage
files were matched to the profile's nodes and which row-to-run mappings are inferences.

:func:`load_release_runs` reads and checks the file: every node of the row's profile in exactly one stage, and
the stages in the graph's order (no edge from a later stage back to an earlier one, i.e. the stages laid end to
end are a topological order; the profile's inputs go to stage 0, which reads the data). :func:`release_run_plan`
is the run as a :class:`pipedream.plan.Plan`, which :mod:`pipedream.table1.predicted` simulates for every row.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipedream.errors import PipeDreamError
from pipedream.experiment import load_yaml
from pipedream.graph import LayerGraph
from pipedream.paths import RELEASE_PROFILES, shipped
from pipedream.plan import Plan, Stage, config_string
from pipedream.topology import Cluster

RELEASE_RUNS_FILE = "experiments/release_runs.yaml"
RELEASE_PREFIX = "runtime/translation/"  # where the release's GNMT driver configs and modules live
_RANGE_RE = re.compile(r"^node(?P<first>\d+)(?:\.\.node(?P<last>\d+))?$")
_KEYS = ("model", "cluster", "profile", "driver_config", "stage_map", "planned", "batch_size", "stages", "ranks")


@dataclass(frozen=True)
class ReleaseRun:
    """One Table 1 row's run in the release: its stage modules as profile nodes, on the ranks its stage map names.

    Attributes:
        model: paper model, e.g. ``"gnmt8"``.
        cluster: the row's cluster, e.g. ``"A_1x4"`` (``experiments/clusters.yaml``).
        profile: the release profile folder the node ids refer to (``experiments/data/profiles/<profile>``).
        driver_config: the driver config, a path in msr-fiddle/pipedream.
        stage_map: the stage map that driver config names (its ``config_file``), a path in msr-fiddle/pipedream.
        planned: the release optimizer's configuration for the row (``hybrid_conf.json``), or None where the
            release has none.
        batch_size: samples per minibatch on one GPU (the driver config's ``batch_size``).
        stages: node ids of each stage, in pipeline order, each in the profile's topological order.
        ranks: global ranks of each stage (``stage_to_rank_map``); replicas are their number.
        note: why the row is mapped to this run where that is an inference, else empty.
    """

    model: str
    cluster: str
    profile: str
    driver_config: str
    stage_map: str
    planned: str | None
    batch_size: int
    stages: tuple[tuple[str, ...], ...]
    ranks: tuple[tuple[int, ...], ...]
    note: str = ""

    @property
    def config(self) -> str:
        """The paper-style config string of the run, e.g. ``"straight"``."""
        return config_string([len(r) for r in self.ranks])

    @property
    def source(self) -> str:
        """The driver config and the stage map it names, e.g. ``"runtime/translation/driver_configs/x.yml ->
        models/gnmt/gpus=12/mp_conf.json"``."""
        return f"{self.driver_config} -> {self.stage_map.removeprefix(RELEASE_PREFIX)}"

    def describe(self, workers: int) -> str:
        """The run in words for a cluster of ``workers`` GPUs, e.g. ``"straight on 10 of 12 GPUs (ranks 0-9)"``."""
        used = sorted(r for rs in self.ranks for r in rs)
        return f"{self.config} on {len(used)} of {workers} GPUs (ranks {used[0]}-{used[-1]})"


def release_run_plan(run: ReleaseRun, cluster: Cluster) -> Plan:
    """``run`` as a plan on ``cluster``: the release's stage modules as node sets, on the ranks of its stage map
    (estimates NaN: the simulator times it).

    Raises:
        PipeDreamError: the run needs more GPUs than ``cluster`` has, or its ranks are not ``0 .. n - 1``.
    """
    used = sum(len(r) for r in run.ranks)
    if used > cluster.workers:
        raise PipeDreamError(f"release run of {run.model} {run.cluster} uses {used} GPUs but cluster "
                             f"{cluster.name!r} has {cluster.workers}; check {RELEASE_RUNS_FILE}")
    stages = [Stage(nodes=list(s), replicas=len(r), ranks=list(r)) for s, r in zip(run.stages, run.ranks, strict=True)]
    plan = Plan(model=run.model, cluster=cluster.name, workers=used, stages=stages, minibatch_size=run.batch_size,
                time_per_sample_s=math.nan, dp_time_per_sample_s=math.nan, extra={"source": run.source})
    plan.validate()
    return plan


def expand(item: str, graph: LayerGraph) -> list[str]:
    """The node ids of one range, ``"node11..node27"`` (every node numbered 11 to 27) or ``"node4"``.

    Raises:
        PipeDreamError: a malformed or empty range, or one naming a node ``graph`` does not have.
    """
    m = _RANGE_RE.match(str(item).strip())
    if m is None:
        raise PipeDreamError(f"stage range {item!r} is not 'nodeA..nodeB' or 'nodeA'")
    first = int(m["first"])
    last = int(m["last"]) if m["last"] is not None else first
    if last < first:
        raise PipeDreamError(f"stage range {item!r} is empty; write the lower node first")
    ids = [f"node{i}" for i in range(first, last + 1)]
    missing = [n for n in ids if n not in graph.nodes]
    if missing:
        raise PipeDreamError(f"stage range {item!r} names {', '.join(missing)}, which the profile does not have")
    return ids


def check_stages(stages: list[list[str]], graph: LayerGraph) -> None:
    """Refuse a split that is not every node of ``graph`` in exactly one stage, stages in the graph's order.

    Raises:
        PipeDreamError: an empty stage, a node in two stages or in none, or an edge from a later stage to an
            earlier one (the message names them).
    """
    where: dict[str, int] = {}
    for s, nodes in enumerate(stages):
        if not nodes:
            raise PipeDreamError(f"stage {s} has no nodes")
        for n in nodes:
            if n in where:
                raise PipeDreamError(f"node {n!r} is in stages {where[n]} and {s}; give every node one stage")
            where[n] = s
    missing = [n for n in graph.nodes if n not in where]
    if missing:
        raise PipeDreamError(f"nodes {', '.join(missing)} of the profile are in no stage; give every node one stage")
    for src, dst in graph.edges:
        if where[dst] < where[src]:
            raise PipeDreamError(f"node {dst!r} (stage {where[dst]}) consumes {src!r} of the later stage {where[src]}; "
                                 "stages must follow the graph's order")


def _run(d: Any, i: int, graphs: dict[str, LayerGraph], profiles_dir: Path) -> ReleaseRun:
    """One entry of the file, checked; raises PipeDreamError (without the file name) naming what is wrong."""
    if not isinstance(d, dict) or any(k not in d for k in _KEYS):
        raise PipeDreamError(f"run {i} needs the keys {', '.join(_KEYS)}")
    what = f"run {i} ({d['model']} {d['cluster']})"
    stages, ranks = d["stages"], d["ranks"]
    if not isinstance(stages, list) or not isinstance(ranks, list) or len(stages) != len(ranks) or not stages:
        raise PipeDreamError(f"{what}: 'stages' and 'ranks' must be lists of the same length, one entry per stage")
    if not all(isinstance(r, list) and r and all(isinstance(x, int) and x >= 0 for x in r) for r in ranks):
        raise PipeDreamError(f"{what}: every entry of 'ranks' must be a non-empty list of ranks (integers >= 0)")
    if not isinstance(d["batch_size"], int) or d["batch_size"] <= 0:
        raise PipeDreamError(f"{what}: 'batch_size' must be a positive integer (the driver config's)")
    profile = str(d["profile"])
    if profile not in graphs:
        graphs[profile] = LayerGraph.read(profiles_dir / profile / "graph.txt")
    graph = graphs[profile]
    try:
        nodes = [[n for item in ([s] if isinstance(s, str) else s) for n in expand(item, graph)] for s in stages]
        check_stages(nodes, graph)
    except PipeDreamError as e:
        raise PipeDreamError(f"{what}, profile {profile}: {e}") from None
    order = {n: k for k, n in enumerate(graph.topological_order())}
    return ReleaseRun(model=str(d["model"]), cluster=str(d["cluster"]), profile=profile,
                      driver_config=str(d["driver_config"]), stage_map=str(d["stage_map"]),
                      planned=None if d["planned"] is None else str(d["planned"]), batch_size=d["batch_size"],
                      stages=tuple(tuple(sorted(s, key=order.__getitem__)) for s in nodes),
                      ranks=tuple(tuple(r) for r in ranks), note=str(d.get("note") or ""))


@functools.lru_cache(maxsize=8)
def _load(path: Path, profiles_dir: Path) -> tuple[ReleaseRun, ...]:
    doc = load_yaml(path, "release runs file")
    if not isinstance(doc, dict) or not isinstance(doc.get("runs"), list):
        raise PipeDreamError(f"release runs file {path}: expected a top-level 'runs:' list")
    graphs: dict[str, LayerGraph] = {}
    runs = []
    for i, d in enumerate(doc["runs"]):
        try:
            runs.append(_run(d, i, graphs, profiles_dir))
        except PipeDreamError as e:
            raise PipeDreamError(f"release runs file {path}: {e}") from None
    return tuple(runs)


def load_release_runs(path: str | Path = RELEASE_RUNS_FILE,
                      profiles_dir: Path = RELEASE_PROFILES) -> dict[tuple[str, str], ReleaseRun]:
    """The release runs of ``path`` by ``(model, cluster)``, checked against the profiles under ``profiles_dir``
    (read once per file: the result is cached).

    Raises:
        PipeDreamError: the file or a profile is missing or malformed, a key is missing or wrong, two runs are
            for the same row, or a run's stages are not a split of its profile (:func:`check_stages`); the
            message names the file and the run.
    """
    runs = _load(shipped(path), profiles_dir)
    out: dict[tuple[str, str], ReleaseRun] = {}
    for run in runs:
        if (run.model, run.cluster) in out:
            raise PipeDreamError(f"release runs file {path}: two runs for {run.model} {run.cluster}; keep one")
        out[(run.model, run.cluster)] = run
    return out
