"""Measured peak memory per stage of each schedule, as multiples of the stage's weight bytes.

Each schedule is one short training run of the PipeDream worker on ``--workers`` gloo processes on the
CPU (:func:`pipedream.runtime.launch.spawn_local`, the even straight split of the model's layers, the
model's synthetic data), with ``measure_memory`` on: after every training action each stage counts the
bytes of the storages it holds (:mod:`pipedream.runtime.memory_meter`: weights, weight versions, gradient
buckets, optimizer state, in-flight buffers, activations saved for backward), and the run logs every
stage's peak. Schedules:

* gpipe: GPipe, ``--microbatches`` per minibatch, flush before every step;
* 1f1b-stash: 1F1B with weight stashing;
* 1f1b-vertical: 1F1B with weight stashing and vertical sync;
* 2bw: PipeDream-2BW, ``--microbatches`` per minibatch;
* pipedream_flush: PipeDream-Flush, 1F1B over each minibatch's ``--microbatches``, then a flush;
* flush-recompute: the same with activation recomputation (``--recompute``);
* dp: the whole model as one stage on one worker (what each data-parallel replica holds).

Printed per stage: peak bytes / the stage's weight bytes, and in parentheses the copies of the weights
held at that peak (live weights plus stored versions, in the same unit; the newest version is the live
weights, so a stage that holds no older version shows 1). Usage (from the repository root)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/memory/main.py --model vgg16 --workers 4
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from pipedream.runtime.config import TrainConfig
from pipedream.runtime.launch import spawn_local

RUNS = {  # name: (TrainConfig fields, one worker?)
    "gpipe": ({"schedule": "gpipe"}, False),
    "1f1b-stash": ({"schedule": "1f1b", "weight_sync": "stash"}, False),
    "1f1b-vertical": ({"schedule": "1f1b", "weight_sync": "vertical"}, False),
    "2bw": ({"schedule": "2bw"}, False),
    "pipedream_flush": ({"schedule": "pipedream_flush"}, False),
    "flush-recompute": ({"schedule": "pipedream_flush", "recompute": True}, False),
    "dp": ({"schedule": "1f1b"}, True),
}


def measure(args: argparse.Namespace, name: str, out: Path) -> list[dict[str, float]]:
    """One run of ``name``; returns per stage ``{"peak": bytes, "weights": bytes, "versions": bytes}`` at
    the peak (of the run's last epoch)."""
    fields, single = RUNS[name]
    workers = 1 if single else args.workers
    micro = args.microbatches if fields["schedule"] in ("gpipe", "2bw", "pipedream_flush") else 1
    cfg = TrainConfig(model=args.model, preset="reduced", data="synthetic", epochs=1, batch_size=args.batch_size,
                      microbatches=micro, max_minibatches=args.minibatches,
                      train_subset=args.batch_size * args.minibatches, val_subset=args.batch_size,
                      optimizer=args.optimizer, momentum=0.9, out_dir=str(out / name), progress=False,
                      measure_memory=True, comm_timeout_s=120, seed=0, **{k: v for k, v in fields.items()})
    spawn_local(cfg, workers, timeout_s=args.timeout_s)
    row = json.loads((out / name / "metrics.json").read_text())[-1]
    stages = sum(1 for k in row if k.startswith("peak_memory_bytes_stage"))
    return [{"peak": row[f"peak_memory_bytes_stage{s}"], "weights": row[f"peak_weights_bytes_stage{s}"],
             "versions": row[f"peak_versions_bytes_stage{s}"]} for s in range(stages)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vgg16", help="registered model, at the reduced preset (default vgg16)")
    parser.add_argument("--workers", type=int, default=4, help="pipeline stages (one worker each; default 4)")
    parser.add_argument("--batch-size", type=int, default=16, help="samples per minibatch (default 16)")
    parser.add_argument("--microbatches", type=int, default=4,
                        help="microbatches per minibatch of gpipe, 2bw and pipedream_flush")
    parser.add_argument("--minibatches", type=int, default=8, help="minibatches trained per run (default 8)")
    parser.add_argument("--optimizer", default="sgd", choices=("sgd", "adam"), help="sgd (momentum 0.9) or adam")
    parser.add_argument("--schedules", default=",".join(RUNS), help=f"comma-separated subset of {', '.join(RUNS)}")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="limit for one run, s")
    parser.add_argument("--out", help="also write the measured bytes to this JSON file")
    args = parser.parse_args(argv)
    # every run here is on the CPU, GPUs or not: on the H200 machine 4 workers on its one GPU failed ("local rank 1
    # needs GPU 1 but this node has 1"); the workers inherit this
    os.environ["PIPEDREAM_FORCE_GLOO"] = "1"
    results: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.schedules.split(","):
            results[name] = measure(args, name, Path(tmp))
    print(f"{args.model} (reduced), {args.workers} stages, batch {args.batch_size}, {args.optimizer}: "
          "peak / weight bytes per stage (copies of the weights at the peak)")
    width = max(len(n) for n in results)
    for name, stages in results.items():
        cells = [f"{s['peak'] / s['weights']:6.2f} ({(s['weights'] + s['versions']) / s['weights']:.0f})" for s in stages]
        print(f"{name:<{width}}  " + "  ".join(f"{c:>12}" for c in cells))
    first = next((v for k, v in results.items() if k != "dp"), None)
    if first is not None:
        print("weight bytes per stage: " + ", ".join(f"{s['weights']:,.0f}" for s in first))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
