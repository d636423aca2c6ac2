"""What-if tables: the predicted rows of every profiled model on a cluster the paper did not use, and the
H100 profiles (``experiments/data/profiles_h100``, measured on one H100 80GB) planned and simulated on
clusters A and B and on a modern cluster (``H100_2x8``: 8 H100 per server on NVLink, 100 Gbps between
servers). Each row is :func:`pipedream.table1.predicted.predict`: the default planner's plan simulated
against data parallelism.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pandas as pd

from pipedream.errors import PipeDreamError
from pipedream.paths import RELEASE_PROFILES
from pipedream.sim import IMAGENET_TRAIN_SAMPLES
from pipedream.table1.predicted import PAPER_MODELS, Profile, find_profile, predict
from pipedream.topology import Cluster, get_cluster


def slug(text: str) -> str:
    """A file-name-safe form of a cluster name or what-if string."""
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")


def whatif_table(cluster: Cluster, profiles_dir: Path, plans_dir: Path | None, models: list[str] | None) -> pd.DataFrame:
    """The predicted rows (no paper columns) of every profiled model on one what-if cluster."""
    rows = []
    for model in models or list(PAPER_MODELS):
        prof = find_profile(model, profiles_dir)
        if prof is None:
            raise PipeDreamError(f"no profile for {model!r} (looked in {RELEASE_PROFILES} and {profiles_dir})")
        rows.append(_row(model, prof, cluster, plans_dir))
    return pd.DataFrame(rows)


def _row(model: str, prof: Profile, cluster: Cluster, plans_dir: Path | None = None, **extra: Any) -> dict[str, Any]:
    """One what-if row: ``model``'s profile ``prof`` planned and simulated on ``cluster`` (:func:`predict`)."""
    return {"row": f"{model} {cluster.name}", "model": model, "hardware": cluster.shape, "cluster": cluster.name,
            "profile": prof.path, **extra, "batch_per_gpu": prof.batch,
            **predict(model, prof, cluster, IMAGENET_TRAIN_SAMPLES, plans_dir=plans_dir)}


H100_PROFILES = Path(__file__).resolve().parents[2] / "experiments" / "data" / "profiles_h100"
H100_MODELS = ("vgg16", "resnet50", "alexnet")
H100_CLUSTERS = ("A_4x4", "B_2x8", "H100_2x8")
H100_MEMORY_BYTES = 80e9  # NVIDIA H100 SXM5 80 GB (datasheet)


def whatif_h100(clusters_path: Path) -> pd.DataFrame:
    """The H100 profiles (``experiments/data/profiles_h100``, one H100 80GB, README there) planned by the default
    planner and simulated against DP on :data:`H100_CLUSTERS`: the V100 clusters of the paper with today's GPU,
    and a modern cluster (8 H100 per server on NVLink, 100 Gbps between servers). Every cluster gets the
    H100's 80 GB per device (the networks of A and B are kept): the V100's 16 GB would reject VGG-16's
    pipelines at the profiled 128 images per GPU."""
    rows = []
    for name in H100_CLUSTERS:
        base = get_cluster(name, clusters_path)
        cluster = Cluster(name=base.name, levels=base.levels, device_memory_bytes=H100_MEMORY_BYTES)
        for model in H100_MODELS:
            prof = find_profile(model, H100_PROFILES, release=False)
            if prof is None:
                raise PipeDreamError(f"no H100 profile {H100_PROFILES / model / 'graph.txt'}")
            rows.append(_row(model, prof, cluster, profile_hardware=prof.hardware))
    return pd.DataFrame(rows)
