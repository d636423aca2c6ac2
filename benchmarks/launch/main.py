"""How long a run takes to start and end under each launcher: torchrun against the fork server.

``pipedream train`` starts its workers under torchrun (:func:`pipedream.runtime.launch.run_torchrun`): every
worker is a fresh interpreter that imports torch, torch._dynamo, the runtime and the model's libraries (fairseq
and, through it, scikit-learn for GNMT) and loads its data, 4 workers on 2 cores.
``pipedream.train(..., launcher="local")`` forks the workers from a fork server that imported torch, torch._dynamo
and the worker module once (:data:`pipedream.runtime.launch.PRELOAD`). This times one short run (one epoch of
``--samples`` training samples) of a model under each, alternating ``--repeats`` times so that the host's drift
falls on both alike, each run in a Python process of its own (as every ``pipedream train`` is: its own fork
server), and prints each run's wall seconds (start to end of :func:`pipedream.train`: start-up, the epoch,
validation, the workers' exit) and the ratio of the medians.

    .venv/bin/python benchmarks/launch/main.py --model gnmt8 --mode dp --plan results/plans/gnmt8/cpu4_1gbps.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `pipedream` from this checkout, also in a worktree

LAUNCHERS = ("torchrun", "local")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="See benchmarks/launch/README.md for what is timed.")
    p.add_argument("--model", default="gnmt8", help="a registered model (reduced preset, real data)")
    p.add_argument("--mode", default="dp", choices=("dp", "pipedream"), help="DP (DDP) or the plan's pipeline")
    p.add_argument("--plan", required=True, help="the model's plan for 4 workers (pipedream plan --out)")
    p.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    p.add_argument("--samples", type=int, default=256, help="training samples of the one epoch (default 256)")
    p.add_argument("--repeats", type=int, default=2, help="runs per launcher, alternating (default 2)")
    p.add_argument("--one", choices=LAUNCHERS, help=argparse.SUPPRESS)  # one run in this process (internal)
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

    if args.one:
        print(f"{_one(args, args.one):.3f}")
        return 0
    walls: dict[str, list[float]] = {name: [] for name in LAUNCHERS}
    for _ in range(args.repeats):
        for launcher in LAUNCHERS:  # each run in a process of its own, as `pipedream train` is (its own fork server)
            out = subprocess.run([sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]),
                                  "--one", launcher], capture_output=True, text=True, check=False)
            if out.returncode != 0:
                print(f"error: the {launcher} run failed: {out.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                return 1
            walls[launcher].append(float(out.stdout.split()[-1]))
            print(f"{launcher:>8}: {walls[launcher][-1]:6.1f} s", flush=True)
    med = {name: statistics.median(v) for name, v in walls.items()}
    print(f"median: torchrun {med['torchrun']:.1f} s, fork server {med['local']:.1f} s "
          f"(fork server / torchrun {med['local'] / med['torchrun']:.2f})")
    return 0


def _one(args: argparse.Namespace, launcher: str) -> float:
    """Wall seconds of one :func:`pipedream.train` under ``launcher``, in this process."""
    import pipedream
    from pipedream.runtime.config import TrainConfig

    with tempfile.TemporaryDirectory() as tmp:
        cfg = TrainConfig(model=args.model, preset="reduced", data="real", batch_size=32, epochs=1, seed=0,
                          train_subset=args.samples, val_subset=64, out_dir=tmp)
        t0 = time.perf_counter()
        pipedream.train(args.model, args.plan, None, cfg, mode=args.mode, launcher=launcher, workers=args.workers)
        return time.perf_counter() - t0


if __name__ == "__main__":
    sys.exit(main())
