"""What checkpoints cost and what a failure loses, for the ``make run`` models (experiments/ci.yaml).

For each model and mode, three runs of ``--epochs`` epochs under ``pipedream train``'s launcher (torchrun, the
config's workers, link throttle and training settings), each figure from the last epoch (the first has the probes of
the auto interval):

1. without checkpoints;
2. with ``--checkpoint-every auto`` (bound 3.5%): the interval chosen, the snapshot, persist and flush seconds it
   was chosen from, the overhead they predict and the one measured in the run (the epoch's stalls and flushes over
   the rest of its training time), and the epoch time over run 1's;
3. as 2 with ``--max-restarts 1`` and rank 1 SIGKILLed after ``--kill-at`` of the last epoch's minibatches: the
   seconds from the kill to the restore (torchrun noticing, stopping the others and starting new workers, their
   start-up: imports, model, data), of the restore, and from the kill to the end of the first minibatch after it,
   and the work lost (minibatches since the checkpoint resumed from, and their seconds at the epoch's rate).

    .venv/bin/python benchmarks/checkpoint/main.py [--models vgg16 gnmt8] [--modes pipedream dp] [--epochs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # `pipedream` from this checkout, also in a worktree


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="See benchmarks/checkpoint/README.md for what is measured.")
    p.add_argument("--config", default=str(ROOT / "experiments" / "ci.yaml"), help="the experiment config")
    p.add_argument("--models", nargs="*", help="models of the config (default: all)")
    p.add_argument("--modes", nargs="*", default=["pipedream", "dp"], choices=("pipedream", "dp"))
    p.add_argument("--plans", default=str(ROOT / "results" / "plans"),
                   help="<model>/<cluster>.json plans (make run's); a model without one runs a straight split")
    p.add_argument("--samples", type=int, help="training samples of an epoch (default: the config's train_subset)")
    p.add_argument("--epochs", type=int, default=2, help="epochs of each run (default 2)")
    p.add_argument("--kill-at", type=float, default=0.75, help="the kill, as a fraction of the epoch (default 0.75)")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ["PIPEDREAM_TRACKING"] = "off"

    import yaml

    config = yaml.safe_load(Path(args.config).read_text())
    print("model     mode       every  snap_s  persist_s  flush_s  overhead(pred/meas)  epoch/plain  "
          "kill->restore_s  restore_s  kill->first_mb_s  lost_mb  lost_s", flush=True)
    for model in args.models or list(config["models"]):
        for mode in args.modes:
            r = measure(model, mode, config, args)
            print(f"{model:<9} {mode:<9} {r['every']:>6.0f}  {r['snapshot_s']:6.3f}  {r['persist_s']:9.3f}  "
                  f"{r['flush_s']:7.3f}  {r['predicted']:8.1%} / {r['measured']:6.1%}    {r['ratio']:10.3f}  "
                  f"{r['to_restore_s']:15.1f}  {r['restore_s']:9.2f}  {r['to_first_s']:16.1f}  "
                  f"{r['lost_mb']:7.0f}  "
                  f"{r['lost_s']:6.2f}",
                  flush=True)
    return 0


def measure(model: str, mode: str, config: dict[str, Any], args: argparse.Namespace) -> dict[str, float]:
    """The three runs of one model and mode (module docstring); their figures."""
    import pipedream
    from pipedream.runtime.config import TrainConfig
    from pipedream.runtime.distributed import FAULT_ENV

    train = {k: v for k, v in config["models"][model].get("train", {}).items() if k != "epochs"}
    train.update(val_subset=64, epochs=args.epochs, progress=False)
    if args.samples:
        train["train_subset"] = args.samples
    plan_path = Path(args.plans) / model / f"{config['cluster']}.json"
    plan = str(plan_path) if plan_path.is_file() else None

    def run(tmp: Path, name: str, max_restarts: int = 0, **extra: Any) -> tuple[list[dict[str, Any]], Path]:
        cfg = TrainConfig(model=model, preset=config["models"][model].get("preset", "reduced"),
                          emulate_bandwidth_Bps=config.get("emulate_bandwidth_Bps"), out_dir=str(tmp / name),
                          **train, **extra)
        rows = pipedream.train(model, plan, None, cfg, mode=mode, launcher="torchrun", workers=config["workers"],
                               max_restarts=max_restarts)
        return rows, tmp / name

    with tempfile.TemporaryDirectory() as tmp:
        plain, _ = run(Path(tmp), "plain")
        auto, _ = run(Path(tmp), "auto", checkpoint_every="auto")
        minibatches = _minibatches(mode, int(plain[-1]["train_samples"]), train["batch_size"], config["workers"])
        kill = (args.epochs - 1) * minibatches + max(1, int(args.kill_at * minibatches))  # of the run
        os.environ[FAULT_ENV] = f"1:{kill}"
        try:
            _, out = run(Path(tmp), "killed", max_restarts=1, checkpoint_every="auto")
        finally:
            del os.environ[FAULT_ENV]
        fault = json.loads((out / "fault.json").read_text())
        (restart,) = json.loads((out / "restarts.json").read_text())
    a = auto[-1]
    minibatch_s = a["epoch_time_s"] / minibatches
    lost = (fault["epoch"] - restart["resumed_epoch"]) * minibatches + fault["minibatch"] - restart["resumed_minibatch"]
    return {"every": a.get("checkpoint_every", float("nan")), "snapshot_s": a.get("checkpoint_snapshot_s", float("nan")),
            "persist_s": a.get("checkpoint_persist_s", float("nan")), "flush_s": a.get("checkpoint_flush_s", float("nan")),
            "predicted": a.get("checkpoint_overhead_predicted", float("nan")),
            "measured": a.get("checkpoint_overhead", float("nan")),
            "ratio": a["epoch_time_s"] / plain[-1]["epoch_time_s"],
            "to_restore_s": restart["restore_at_unix_s"] - fault["unix_s"],
            "restore_s": restart["resumed_at_unix_s"] - restart["restore_at_unix_s"],
            "to_first_s": restart.get("first_minibatch_unix_s", float("nan")) - fault["unix_s"],
            "lost_mb": lost, "lost_s": lost * minibatch_s}


def _minibatches(mode: str, samples: int, batch_size: int, workers: int) -> int:
    """Minibatches of the epoch as the kill counts them: the pipeline's, or DP's optimizer steps."""
    return samples // batch_size // (workers if mode == "dp" else 1)


if __name__ == "__main__":
    sys.exit(main())
