"""Each rank's copy of the model is a draw of where its tensors land in memory (:mod:`pipedream.host_timing`): the
profile records how fast fresh copies run (``meta.json`` ``host.layouts``, each copy's step over the profiling
process's), and a prediction draws one copy per rank from them.

The mean of the draws scales every layer (the typical copy, not the profiling process's); the spread matters
because ranks wait for each other: the replicas of a stage exchange gradients every minibatch, and a pipeline's
stages pass activations. :func:`rank_factor_samples` draws, for each of a fixed set of samples, every rank's copy
from the recorded draws (with replacement); the simulator runs each rank's forwards and backwards at its own
factor (:func:`pipedream.sim.engine.run` ``rank_scale``) and the prediction averages the simulated epoch over the
samples (Monte Carlo with a fixed seed: the same profile always gives the same prediction).

Per rank, not per stage: where every rank has a core of its own, a stage's replicas wait at each allreduce for
the slowest, and the simulation gives exactly that. Where ranks share cores (4 workers on 2 cores), a replica
that is done and waits in the allreduce leaves its core's share to the others, so the slow copy catches up on
cores that would otherwise idle. Giving every replica its slowest's factor, as a first version did, charged
that work as if every copy were the slow one: the reduced S2VT's four replicas on 2 cores came out at
0.75-0.97 of their predictions in 11 of 12 runs of ``make run`` (sessions 17-19), and for one of its profiles
(draws 0.68-1.25 of their mean) the slowest of four draws averages 1.16x the mean draw.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
from collections.abc import Sequence

from pipedream.sim.costs import StageCost

SAMPLES = 64  # simulated epochs per prediction: across six seeds the CI profiles' epochs moved by at most 2.7% (16: 5.8%)


def spread(layouts: Sequence[float]) -> tuple[float, tuple[float, ...]]:
    """``(mean, draws over their mean)`` of the recorded layout ratios (dimensionless); ``(1.0, ())`` for none
    or non-positive values (a profile without the measurement: no layout effect)."""
    values = [float(p) for p in layouts if p > 0]
    if not values:
        return 1.0, ()
    mean = statistics.fmean(values)
    return mean, tuple(v / mean for v in values)


def rank_factor_samples(draws: Sequence[float], ranks: Sequence[int], samples: int = SAMPLES,
                        seed: int = 0) -> list[dict[int, float]]:
    """``samples`` maps of one factor per rank of ``ranks``, each a draw (with replacement) from ``draws``
    (dimensionless: a copy's step over the mean copy's). No draws: one sample of ones.

    Example: draws ``(0.9, 1.1)`` and ranks ``[0, 1]``: each sample gives each rank 0.9 or 1.1, each with
    probability 1/2, independently.
    """
    if not draws:
        return [dict.fromkeys(ranks, 1.0)]
    rng = random.Random(seed)
    return [{r: rng.choice(draws) for r in ranks} for _ in range(samples)]


def scaled(costs: Sequence[StageCost], factors: Sequence[float]) -> list[StageCost]:
    """``costs`` with each stage's forward, backward and gradient-bucket compute times times its factor."""
    return [dataclasses.replace(c, fwd_s=c.fwd_s * f, bwd_s=c.bwd_s * f, buckets=[(t * f, b) for t, b in c.buckets])
            for c, f in zip(costs, factors, strict=True)]
