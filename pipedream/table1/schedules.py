"""What-if: every schedule of the field at paper scale. For Table 1's models (the release's V100 profiles) and
PipeDream-2BW's GPT models (costed from FLOP counts, :func:`pipedream.table2bw.paper.transformer_graph`) on clusters A
and B and one 8-GPU H100 server, each schedule's best shape (:func:`pipedream.planner.schedule_search.search`:
depth, chunks, microbatches and cut points), its predicted throughput and peak memory per GPU, the best marked.

On the H100 server the Table 1 models use the H100 profiles where they exist (``experiments/data/profiles_h100``)
and the GPTs a FLOP rate of :data:`H100_ACHIEVED_FLOPS`; everything else is the V100's. An iteration is the
paper's minibatch per GPU times the GPUs for Table 1's models (:data:`pipedream.table1.predicted.PAPER_MODELS`) and
:data:`GPT_BATCH` sequences for the GPTs; the optimizer is SGD with momentum for Table 1's models and Adam for the
GPTs (their papers'), without activation recomputation. PipeDream's own 1F1B-RR with replicated stages is Table 1's
predicted column; these rows are the flush schedules on straight pipelines, replicated ``w`` times.
"""

from __future__ import annotations

import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pandas as pd

from pipedream import costmodel
from pipedream.errors import PipeDreamError
from pipedream.graph import LayerGraph, profiled_batch
from pipedream.io import atomic_write_text
from pipedream.models.transformer import config_of
from pipedream.paths import RELEASE_PROFILES
from pipedream.planner.schedule_search import SearchSettings, search
from pipedream.table1.predicted import PAPER_MODELS
from pipedream.table1.schedules_html import CSV_NAME
from pipedream.table1.whatif import H100_PROFILES
from pipedream.table2bw.paper import ACHIEVED_FRACTION, V100_PEAK_FLOPS, transformer_graph
from pipedream.topology import get_cluster

TABLE1_MODELS = tuple(PAPER_MODELS)  # vgg16, resnet50, alexnet, gnmt8, gnmt16
GPT_MODELS = ("gpt", "gpt_2.2b")
CLUSTERS = ("A_4x4", "B_2x8", "H100_1x8")
GPT_BATCH = 512  # sequences an iteration: PipeDream-2BW's smaller batch (pipedream.table2bw.paper.PAPER_BATCHES)
H100_ACHIEVED_FLOPS = 0.30 * 989e12  # ASSUMED 30% of the H100 SXM's 989 TFLOP/s dense fp16 (NVIDIA datasheet)
COLUMNS = ["model", "cluster", "schedule", "best", "samples_per_s", "iteration_s", "depth", "width", "chunks",
           "microbatches", "microbatch_size", "bubble", "peak_gb_per_gpu", "fits", "profile"]


def _graph(model: str, h100: bool) -> tuple[LayerGraph, str, str]:
    """The profile of ``model`` (H100 where there is one), its origin and its optimizer."""
    if model in GPT_MODELS:
        rate = H100_ACHIEVED_FLOPS if h100 else V100_PEAK_FLOPS * ACHIEVED_FRACTION
        return transformer_graph(config_of(model, "full"), flops_per_s=rate), f"FLOP model ({'H100' if h100 else 'V100'})", \
            "adam"
    folder, batch = PAPER_MODELS[model]
    path = H100_PROFILES / folder / "graph.txt"
    if not (h100 and path.is_file()):
        path = RELEASE_PROFILES / folder / "graph.txt"
    if not path.is_file():
        raise PipeDreamError(f"no profile {path}")
    return LayerGraph.read(path, profiled_batch(path)).scaled(batch), str(path.parent.relative_to(path.parents[2])), "sgd"


def schedule_rows(clusters_path: Path, models: tuple[str, ...] = TABLE1_MODELS + GPT_MODELS,
                  clusters: tuple[str, ...] = CLUSTERS, jobs: int = 1) -> pd.DataFrame:
    """One row per model, cluster and schedule (:data:`COLUMNS`), ``best`` True on the fastest that fits; ``jobs``
    processes search the model and cluster pairs (forked from this one; the table is the same either way).

    Raises:
        PipeDreamError: an unknown cluster or a missing profile.
    """
    for name in clusters:
        get_cluster(name, clusters_path)  # an unknown one fails here, before any search
    pairs = [(clusters_path, name, model) for name in clusters for model in models]
    if jobs > 1 and len(pairs) > 1:
        with ProcessPoolExecutor(min(jobs, len(pairs)), mp_context=mp.get_context("fork")) as pool:
            rows = list(pool.map(_rows, pairs))
    else:
        rows = [_rows(pair) for pair in pairs]
    return pd.DataFrame([r for part in rows for r in part], columns=COLUMNS)


def _rows(pair: tuple[Path, str, str]) -> list[dict[str, Any]]:
    """The rows of one cluster (by name in the clusters file) and model."""
    clusters_path, name, model = pair
    cluster = get_cluster(name, clusters_path)
    graph, origin, optimizer = _graph(model, name.startswith("H100"))
    batch = GPT_BATCH if model in GPT_MODELS else graph.minibatch_size * cluster.workers
    options = search(graph, cluster, SearchSettings(batch_size=batch, step=costmodel.StepRates(optimizer)))
    return [{"model": model, "cluster": name, "schedule": o.schedule, "best": k == 0 and o.fits,
             "samples_per_s": batch / o.iteration_s, "iteration_s": o.iteration_s, "depth": o.depth, "width": o.width,
             "chunks": o.chunks, "microbatches": o.microbatches, "microbatch_size": o.microbatch_size,
             "bubble": o.bubble, "peak_gb_per_gpu": max(o.peak_bytes) / 1e9, "fits": o.fits, "profile": origin}
            for k, o in enumerate(options)]


def write(out_dir: Path, clusters_path: Path, models: tuple[str, ...] = TABLE1_MODELS + GPT_MODELS,
          clusters: tuple[str, ...] = CLUSTERS, jobs: int = 1) -> pd.DataFrame:
    """``schedules_whatif.csv`` and ``.md`` under ``out_dir`` (:func:`schedule_rows`); returns the table."""
    df = schedule_rows(clusters_path, models, clusters, jobs)
    atomic_write_text(out_dir / CSV_NAME, df.to_csv(index=False))
    lines = ["# What-if: every schedule at paper scale", "", __doc__.split("\n\n")[1].replace("\n", " "), "",
             "| model | cluster | schedule | depth x width | chunks | microbatches | samples/s | bubble | peak GB/GPU |",
             "|---|---|---|---|---|---|---|---|---|"]
    for _, r in df.iterrows():
        mark = "**" if bool(r["best"]) else ""
        lines.append(f"| {r['model']} | {r['cluster']} | {mark}{r['schedule']}{mark} | {r['depth']} x {r['width']} | "
                     f"{r['chunks']} | {r['microbatches']} of {r['microbatch_size']} | {r['samples_per_s']:.1f} | "
                     f"{r['bubble']:.1%} | {r['peak_gb_per_gpu']:.1f}{'' if bool(r['fits']) else ' (over)'} |")
    atomic_write_text(out_dir / "schedules_whatif.md", "\n".join(lines) + "\n")
    return df
