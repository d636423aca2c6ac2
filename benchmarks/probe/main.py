"""How far a prediction moves with the profile's host probe: its own sampling, and a second profile's probe.

Every run's prediction (:func:`pipedream.sim.predict.predict_run`) stands on the profile's host probe
(``meta.json`` ``host``, :mod:`pipedream.host_timing`): the fresh copies' step alone (``copy_step_s``, the compute's
scale), two copies per core against alone (``oversubscribed``), one per core (``contention``), the copies' layouts
(their spread sets a replicated stage's slowest replica), the copies' optimizer steps (the step rate) and the message
cost. Two questions, answered from a finished ``make run`` without starting a process or timing anything:

1. Sampling. Had the probe's rounds come out otherwise, how far would the prediction move? The rounds are
   resampled with replacement (``--samples`` times) and what the profile derives from them is derived again:
   ``oversubscribed`` and ``contention`` the chosen rounds' median, the layouts and optimizer steps the chosen
   rounds' copies, ``copy_step_s`` their mean alone step (``host.copy_steps_s``; a profile without it, from before
   it was recorded, scales ``copy_step_s`` by the chosen rounds' mean layout over all rounds', which counts the
   profiling process's step as the same in every round). Printed per run: the prediction, the resampled
   predictions' coefficient of variation and their range over the prediction. A probe of more rounds narrows this
   spread by about the square root of their ratio; it does not narrow what the host does between the probe and the
   run.
2. ``--against OTHER``: another profile of the same models (another ``make run``'s, or one taken again). For each
   run, the prediction on this profile and on the other's, then this profile with each of the other's
   measurements put in its place one at a time (``copy_step_s``, ``oversubscribed``, ``contention``, ``layouts``,
   the optimizer step rates, the message cost; then the whole probe): which of them moved it.

Plans are ``--plans`` (``make run``'s, ``results/plans``), the runs' settings ``--config`` (``experiments/ci.yaml``)
on the config's cluster with 1 thread a worker and the host's cores (``--cores``, default this machine's), as
``pipedream train`` predicts them. On the 2-core CI machine 14 runs with 16 samples and ``--against`` (350
predictions) took 5 min 8 s.

    .venv/bin/python benchmarks/probe/main.py [--profiles results/profiles] [--samples 16] [--models gnmt8,s2vt]
    .venv/bin/python benchmarks/probe/main.py --against OTHER/profiles --samples 0
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `pipedream` from this checkout, also in a worktree

from pipedream.host_timing import host_cores  # noqa: E402
from pipedream.plan import Plan  # noqa: E402
from pipedream.runtime.config import TrainConfig  # noqa: E402
from pipedream.sim.predict import predict_run, training_samples  # noqa: E402
from pipedream.sim.run_queues import scheduler_tick_s  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MODES = ("pipedream", "dp")
Meta = dict[str, Any]


def resampled(meta: Meta, chosen: list[int]) -> Meta:
    """``meta`` with what the probe derives from its rounds derived again from rounds ``chosen`` (indices, repeats
    allowed; module docstring). Raises ValueError for a profile without the probe's rounds."""
    host = meta.get("host") or {}
    rounds = len(host.get("oversubscribed_rounds") or ())
    layouts = list(host.get("layouts") or ())
    if not rounds or len(layouts) % rounds:
        raise ValueError("the profile has no host probe rounds (meta.json host.oversubscribed_rounds, host.layouts)")
    copies = len(layouts) // rounds

    def pick(values: list[float]) -> list[float]:
        return [values[r * copies + j] for r in chosen for j in range(copies)]

    out = copy.deepcopy(meta)
    h = out["host"]
    h["oversubscribed"] = statistics.median(host["oversubscribed_rounds"][r] for r in chosen)
    h["contention"] = statistics.median(host["contention_rounds"][r] for r in chosen)
    h["layouts"] = pick(layouts)
    if host.get("copy_steps_s"):
        h["copy_step_s"] = statistics.fmean(pick(host["copy_steps_s"]))
    elif host.get("copy_step_s"):
        h["copy_step_s"] = host["copy_step_s"] * statistics.fmean(h["layouts"]) / statistics.fmean(layouts)
    for name, steps in (host.get("optimizer_steps_s") or {}).items():  # the whole step scales, each of its parts
        factor = statistics.fmean(pick(steps)) / statistics.fmean(steps)
        out["optimizer_step_s_per_param_byte"][name] *= factor
        parts = (out.get("optimizer_step_overheads") or {}).get(name) or {}
        for key in parts:
            parts[key] *= factor
    return out


def swaps(other: Meta) -> dict[str, Callable[[Meta], None]]:
    """Name -> an edit that puts ``other``'s measurement of that name into a profile's meta (module docstring)."""
    def host_keys(*keys: str) -> Callable[[Meta], None]:
        def edit(meta: Meta) -> None:
            for k in keys:
                if k in other.get("host", {}):
                    meta["host"][k] = other["host"][k]
        return edit

    def rates(meta: Meta) -> None:
        meta["optimizer_step_s_per_param_byte"] = dict(other["optimizer_step_s_per_param_byte"])
        meta["optimizer_step_overheads"] = copy.deepcopy(other.get("optimizer_step_overheads") or {})

    def probe(meta: Meta) -> None:
        meta["host"] = copy.deepcopy(other["host"])
        rates(meta)

    return {"copy_step_s": host_keys("copy_step_s", "copy_steps_s"), "oversubscribed": host_keys("oversubscribed"),
            "contention": host_keys("contention"), "layouts": host_keys("layouts"), "optimizer rates": rates,
            "messages": host_keys("message_s", "message_s_per_byte"), "the whole probe": probe}


class Predictor:
    """Predicts one run of the config on a profile directory with its ``meta.json`` replaced (in a scratch copy)."""

    def __init__(self, config: dict[str, Any], plans: Path, cores: int, scratch: Path) -> None:
        self.config, self.plans, self.cores, self.scratch = config, plans, cores, scratch
        self.runs: dict[str, tuple[TrainConfig, Plan, int]] = {}
        clusters = Path(config.get("clusters_file", "experiments/clusters.yaml"))
        self.clusters = clusters if clusters.is_absolute() else ROOT / clusters

    def run(self, model: str) -> tuple[TrainConfig, Plan, int]:
        """``model``'s training config, plan and training samples (its data set's length), read once."""
        if model not in self.runs:
            m = self.config["models"][model]
            cfg = TrainConfig(model=model, preset=m["preset"],
                              emulate_bandwidth_Bps=self.config.get("emulate_bandwidth_Bps"), **m["train"])
            self.runs[model] = cfg, Plan.load(self.plans / model / f"{self.config['cluster']}.json"), training_samples(cfg)
        return self.runs[model]

    def __call__(self, model: str, mode: str, profile_dir: Path, meta: Meta | None = None) -> float:
        """Predicted epoch seconds of ``model``'s ``mode`` run on ``profile_dir`` (with ``meta`` if given)."""
        prof = profile_dir
        if meta is not None:
            prof = self.scratch / model
            shutil.rmtree(prof, ignore_errors=True)
            shutil.copytree(profile_dir, prof)
            (prof / "meta.json").write_text(json.dumps(meta))
        cfg, plan, samples = self.run(model)
        return predict_run(cfg, mode, plan, prof / "graph.txt", self.clusters, num_samples=samples,
                           cores=self.cores, threads=1, tick_s=scheduler_tick_s()).epoch_s


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--profiles", type=Path, default=ROOT / "results" / "profiles",
                   help="profiles to predict from, <dir>/<model>/graph.txt and meta.json (default results/profiles)")
    p.add_argument("--plans", type=Path, default=ROOT / "results" / "plans",
                   help="plans, <dir>/<model>/<cluster>.json (default results/plans)")
    p.add_argument("--config", type=Path, default=ROOT / "experiments" / "ci.yaml", help="the runs' settings")
    p.add_argument("--models", default="", help="comma-separated models (default: the config's)")
    p.add_argument("--samples", type=int, default=16, help="resampled probes per run (0: none)")
    p.add_argument("--against", type=Path, default=None, help="another profiles directory of the same models")
    p.add_argument("--cores", type=int, default=host_cores(), help="the host's cores (default: this machine's)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    config = yaml.safe_load(args.config.read_text())
    models = [m for m in args.models.split(",") if m] or list(config["models"])
    unknown = [m for m in models if m not in config["models"]]
    if unknown:
        print(f"error: {', '.join(unknown)} not in {args.config}; pick from {', '.join(config['models'])}", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as scratch:
        predict = Predictor(config, args.plans, args.cores, Path(scratch))
        for model in models:
            meta = json.loads((args.profiles / model / "meta.json").read_text())
            other = json.loads((args.against / model / "meta.json").read_text()) if args.against else None
            rounds = len((meta.get("host") or {}).get("oversubscribed_rounds") or ())
            for mode in MODES:
                base = predict(model, mode, args.profiles / model)
                line = f"{model:9s} {mode:9s} predicted {base:7.2f} s"
                if args.samples and rounds:
                    values = [predict(model, mode, args.profiles / model,
                                      resampled(meta, [rng.randrange(rounds) for _ in range(rounds)]))
                              for _ in range(args.samples)]
                    line += (f" | {args.samples} resampled probes: cv {statistics.pstdev(values) / statistics.fmean(values):.3f},"
                             f" {min(values) / base:.2f}-{max(values) / base:.2f}x")
                if other is not None:
                    theirs = predict(model, mode, args.against / model)
                    line += f" | the other profile {theirs:7.2f} s ({theirs / base:.2f}x); with its"
                    for name, edit in swaps(other).items():
                        edited = copy.deepcopy(meta)
                        edit(edited)
                        line += f" {name} {predict(model, mode, args.profiles / model, edited) / base:.2f}x,"
                    line = line.rstrip(",")
                print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
