"""Cluster topologies: levels of workers and the bandwidth that links them (paper §3.1, §5.1).

A :class:`Cluster` is a list of levels, innermost first, each ``(workers, bandwidth_Bps)``: the
number of lower-level groups joined at this level and the bandwidth in bytes/s between them. Cluster A
of the paper (4 servers x 4 V100 on PCIe, 10 Gbps between servers) is
``[(4, 15.75e9), (4, 1.25e9)]`` -- the same order as the release optimizer's ``-n 4 4 -b 15.75e9 1.25e9``.

Clusters are read from ``experiments/clusters.yaml``::

    clusters:
      A_4x4:
        description: Azure, 4 servers x 4 V100 16 GB, PCIe inside, 10 Gbps between
        levels:                        # innermost first
          - {workers: 4, bandwidth_Bps: 15.75e9}
          - {workers: 4, bandwidth_Bps: 1.25e9}
        device_memory_bytes: 16e9
        latency_s: 20e-6               # optional: one message between two ranks, s

or given on the command line as a what-if string, innermost level first like the release's flags:
``"8x2:25e9,3.125e9"`` (8 workers per server joined at 25e9 B/s, 2 servers joined at 3.125e9 B/s),
optionally with ``@<device memory bytes>``, e.g. ``"4:1e9@8e9"``; a what-if cluster has the default
latency (:data:`pipedream.costmodel.DEFAULT_STEP_LATENCY_S`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipedream import costmodel
from pipedream.errors import PipeDreamError
from pipedream.paths import CLUSTERS

DEFAULT_CLUSTERS_PATH = CLUSTERS  # found in the checkout from any directory (pipedream.paths)
# The release optimizer's default for -s/--memory_size (bytes); used when a cluster gives none.
RELEASE_DEFAULT_MEMORY_BYTES = 16e9

_WHATIF_RE = re.compile(r"^(?P<shape>\d+(?:x\d+)*):(?P<bw>[^@]+)(?:@(?P<mem>.+))?$")


@dataclass
class Cluster:
    """A hierarchical cluster.

    Attributes:
        name: e.g. ``"A_4x4"``.
        levels: ``(workers, bandwidth_Bps)`` per level, innermost first; ``workers`` is the number of
            lower-level groups (GPUs at the innermost level) joined at that level, ``bandwidth_Bps``
            the bandwidth between them in bytes/s.
        device_memory_bytes: memory of one worker (device), bytes.
        description: free text.
        latency_s: latency of one message between two ranks, seconds (the alpha of the alpha-beta model:
            paid once per transfer and once per step of an allreduce ring, :mod:`pipedream.costmodel`);
            default :data:`pipedream.costmodel.DEFAULT_STEP_LATENCY_S`.
    """

    name: str
    levels: list[tuple[int, float]]
    device_memory_bytes: float = RELEASE_DEFAULT_MEMORY_BYTES
    description: str = ""
    latency_s: float = costmodel.DEFAULT_STEP_LATENCY_S

    def __post_init__(self) -> None:
        self.validate()

    @property
    def workers(self) -> int:
        """Total number of workers: the product of the workers of all levels."""
        return math.prod(w for w, _ in self.levels)

    @property
    def shape(self) -> str:
        """``"4x4"``-style shape, outermost first (servers x GPUs), as the paper writes it."""
        return "x".join(str(w) for w, _ in reversed(self.levels))

    def validate(self) -> None:
        """Raise :class:`PipeDreamError` naming the bad value if a level or the memory is invalid."""
        if not self.levels:
            raise PipeDreamError(f"cluster {self.name!r} has no levels; give at least one {{workers, bandwidth_Bps}}")
        for idx, (workers, bandwidth) in enumerate(self.levels):
            if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
                raise PipeDreamError(f"cluster {self.name!r} level {idx}: workers={workers!r} must be a positive integer")
            if not (isinstance(bandwidth, float | int) and math.isfinite(bandwidth)) or bandwidth <= 0:
                raise PipeDreamError(f"cluster {self.name!r} level {idx}: bandwidth_Bps={bandwidth!r} must be a "
                                     "positive number of bytes/s")
        mem = self.device_memory_bytes
        if not (isinstance(mem, float | int) and math.isfinite(mem)) or mem <= 0:
            raise PipeDreamError(f"cluster {self.name!r}: device_memory_bytes={mem!r} must be a positive number of bytes")
        lat = self.latency_s
        if isinstance(lat, bool) or not (isinstance(lat, float | int) and math.isfinite(lat)) or lat < 0:
            raise PipeDreamError(f"cluster {self.name!r}: latency_s={lat!r} must be a non-negative number of seconds")

    def describe(self) -> str:
        """One line: name, shape, bandwidths, latency and memory."""
        bws = ", ".join(f"{w} x {b / 1e9:g} GB/s" for w, b in self.levels)
        memory = f"{self.device_memory_bytes / 1e9:g} GB/device"
        latency = f"latency {self.latency_s * 1e6:g} us"
        return f"{self.name} ({self.workers} workers; levels innermost first: {bws}; {latency}; {memory})"


def _number(value: Any, what: str) -> float:
    """A float from a YAML value; PyYAML reads ``15.75e9`` (no sign in the exponent) as a string."""
    if isinstance(value, bool):
        raise PipeDreamError(f"{what}={value!r} is not a number")
    if isinstance(value, int | float):
        return float(value)
    try:
        return float(str(value).replace("_", ""))
    except ValueError:
        raise PipeDreamError(f"{what}={value!r} is not a number") from None


def _integer(value: Any, what: str) -> int:
    number = _number(value, what)
    if number != int(number):
        raise PipeDreamError(f"{what}={value!r} must be an integer")
    return int(number)


def cluster_from_dict(name: str, d: Any) -> Cluster:
    """Build a :class:`Cluster` from one ``clusters:`` entry; raises PipeDreamError naming a bad key."""
    if not isinstance(d, dict):
        raise PipeDreamError(f"cluster {name!r}: expected a mapping with 'levels', got {type(d).__name__}")
    unknown = set(d) - {"levels", "device_memory_bytes", "latency_s", "description"}
    if unknown:
        raise PipeDreamError(f"cluster {name!r}: unknown key(s) {sorted(unknown)}; allowed: levels, "
                             "device_memory_bytes, latency_s, description")
    raw_levels = d.get("levels")
    if not isinstance(raw_levels, list) or not raw_levels:
        raise PipeDreamError(f"cluster {name!r}: 'levels' must be a non-empty list of {{workers, bandwidth_Bps}}, "
                             "innermost first")
    levels: list[tuple[int, float]] = []
    for idx, lv in enumerate(raw_levels):
        if not isinstance(lv, dict) or set(lv) != {"workers", "bandwidth_Bps"}:
            raise PipeDreamError(f"cluster {name!r} level {idx}: expected exactly the keys workers and bandwidth_Bps, got {lv!r}")
        levels.append((_integer(lv["workers"], f"cluster {name!r} level {idx}: workers"),
                       _number(lv["bandwidth_Bps"], f"cluster {name!r} level {idx}: bandwidth_Bps")))
    memory = _number(d.get("device_memory_bytes", RELEASE_DEFAULT_MEMORY_BYTES), f"cluster {name!r}: device_memory_bytes")
    latency = _number(d.get("latency_s", costmodel.DEFAULT_STEP_LATENCY_S), f"cluster {name!r}: latency_s")
    return Cluster(name=name, levels=levels, device_memory_bytes=memory, description=str(d.get("description", "")),
                   latency_s=latency)


def load_clusters(path: str | Path = DEFAULT_CLUSTERS_PATH) -> dict[str, Cluster]:
    """Read every cluster of a clusters YAML file (see the module docstring for the format).

    Raises:
        PipeDreamError: if the file is missing or malformed, or a cluster has a bad value (named).
    """
    from pipedream.experiment import load_yaml

    doc = load_yaml(path, "clusters file", "; pass --clusters PATH (e.g. experiments/clusters.yaml)")
    if not isinstance(doc, dict) or not isinstance(doc.get("clusters"), dict):
        raise PipeDreamError(f"clusters file {path}: expected a top-level 'clusters:' mapping of name -> cluster")
    return {str(name): cluster_from_dict(str(name), d) for name, d in doc["clusters"].items()}


def parse_whatif(spec: str) -> Cluster:
    """Parse a what-if cluster string such as ``"8x2:25e9,3.125e9"`` or ``"4:1e9@8e9"``.

    The shape and the bandwidths (bytes/s) are both written innermost level first; ``@M`` sets the
    device memory in bytes (default: the release's 16e9).

    Raises:
        PipeDreamError: on a malformed string, a count mismatch, or a non-positive number (named).
    """
    m = _WHATIF_RE.match(spec.strip())
    if not m:
        raise PipeDreamError(f"cluster string {spec!r} is malformed; expected e.g. '8x2:25e9,3.125e9' (innermost level first)")
    workers = [int(w) for w in m["shape"].split("x")]
    bandwidths = [_number(b, f"cluster {spec!r}: bandwidth") for b in m["bw"].split(",")]
    if len(workers) != len(bandwidths):
        raise PipeDreamError(f"cluster string {spec!r}: {len(workers)} level(s) in the shape but {len(bandwidths)} bandwidth(s)")
    memory = _number(m["mem"], f"cluster {spec!r}: memory") if m["mem"] else RELEASE_DEFAULT_MEMORY_BYTES
    return Cluster(name=spec.strip(), levels=list(zip(workers, bandwidths, strict=True)), device_memory_bytes=memory)


def get_cluster(name: str, path: str | Path = DEFAULT_CLUSTERS_PATH) -> Cluster:
    """The cluster called ``name`` in ``path``, or a what-if string (see :func:`parse_whatif`).

    Raises:
        PipeDreamError: for an unknown name (lists the known ones) or a bad cluster definition.
    """
    if _WHATIF_RE.match(name.strip()):
        return parse_whatif(name)
    clusters = load_clusters(path)
    if name not in clusters:
        raise PipeDreamError(f"unknown cluster {name!r}; known clusters in {path}: {', '.join(sorted(clusters))} "
                             "(or a what-if string like '8x2:25e9,3.125e9')")
    return clusters[name]
