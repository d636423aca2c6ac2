"""Where the files shipped with the project live, so that every command finds them from any directory.

The shipped files (clusters, the paper's Table 1, the release's V100 profiles, the config schema) sit
in the checkout beside the package. A command's path option is taken as given when it exists (relative
to the working directory, as usual); a relative path that does not exist there is looked up in the
checkout instead (:func:`shipped`), so ``--cluster A_4x4`` or
``--profile experiments/data/profiles/vgg16/graph.txt`` work from any directory. Generated outputs
stay relative to the working directory, except the MLflow store (:mod:`pipedream.tracking`), which
defaults to one file in the checkout so that every run lands in the same place.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CLUSTERS = "experiments/clusters.yaml"
PAPER_TABLE = "experiments/paper_table1.csv"
CI_CONFIG = "experiments/ci.yaml"
RELEASE_PROFILES = REPO / "experiments" / "data" / "profiles"
SCHEMA = REPO / "workflows" / "schemas" / "config.schema.yaml"
RESULTS = REPO / "results"


def shipped(path: str | Path) -> Path:
    """``path`` if it exists (or is absolute), else the same relative path inside the checkout if that
    exists, else ``path`` unchanged (so that an error message names what the user gave)."""
    p = Path(path)
    if p.is_absolute() or p.exists():
        return p
    in_repo = REPO / p
    return in_repo if in_repo.exists() else p
