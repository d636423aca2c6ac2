"""Check an experiment config before any work starts: YAML syntax, the schema, known models and
cluster, and workers that match the cluster. `make run` calls this first,
so a mistake costs one clear line (exit status 2) instead of a half-run workflow."""

from __future__ import annotations

import argparse

from pipedream.paths import CI_CONFIG

HELP = "validate an experiment config (schema, models, cluster, workers) without running anything"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``pipedream check``."""
    p.add_argument("--config", default=CI_CONFIG,
                   help="experiment config (YAML; a relative path not found here is looked up in the checkout)")


def run(args: argparse.Namespace) -> int:
    """Validate; raises PipeDreamError on the first problem, prints a summary and returns 0 otherwise."""
    from pipedream.errors import PipeDreamError
    from pipedream.experiment import load_config
    from pipedream.paths import CLUSTERS, shipped
    from pipedream.topology import get_cluster

    cfg = load_config(args.config)
    from pipedream.models import get_spec  # imports torch: only once the file itself is known to be good

    for name in cfg["models"]:
        get_spec(name)  # raises on an unknown model, listing the known ones
    clusters_file = cfg.get("clusters_file", CLUSTERS)
    cluster = get_cluster(cfg["cluster"], clusters_file)
    if cluster.workers != cfg["workers"]:
        raise PipeDreamError(f"{args.config}: workers: {cfg['workers']} but cluster {cfg['cluster']!r} has "
                             f"{cluster.workers} workers; make them agree")
    if not shipped(cfg["paper_table"]).is_file():
        raise PipeDreamError(f"{args.config}: paper_table {cfg['paper_table']} not found")
    print(f"{args.config}: ok ({len(cfg['models'])} models on {cfg['cluster']}, {cfg['workers']} workers)")
    return 0
