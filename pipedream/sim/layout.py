"""Each rank's copy of the model is a draw of where its tensors land in memory (:mod:`pipedream.host_timing`): the
profile records how fast fresh copies run (``meta.json`` ``host.layouts``, each copy's step over the profiling
process's), and a prediction draws one copy per rank from them.

The mean of the draws scales every layer (the typical copy, not the profiling process's); the spread matters
because ranks wait for each other: the replicas of a stage exchange gradients every minibatch, so a replicated
stage (and data parallelism, one stage on every rank) runs at its slowest replica's pace, and a pipeline runs at
its slowest stage's. :func:`stage_factor_samples` draws, for each of a fixed set of samples, every rank's copy
from the recorded draws (with replacement) and gives each stage its slowest replica's factor; the prediction
averages the simulated epoch over the samples (Monte Carlo with a fixed seed: the same profile always gives the
same prediction).

What the draws stand for is not settled. On the 2-core CI VM (session 30, ``benchmarks/layout``) one long-lived
process's windows of 15 steps spread as much as fresh processes' (coefficient of variation 0.09-0.15 against
0.05-0.15 for GNMT-8, S2VT, VGG-16 and AlexNet): there the spread is mostly the host's speed from moment to
moment, not a process's own draw. Taken as independent per rank it still predicts better than the mean alone:
session 29's third ``make run`` with every rank at the mean copy (one draw) had 9 of 14 runs within 15% and a
median ``|ratio - 1|`` of 13.6%, against 12 of 14 and 5.1% with the draws.
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


def stage_factor_samples(draws: Sequence[float], replicas: Sequence[int], samples: int = SAMPLES,
                         seed: int = 0) -> list[list[float]]:
    """``samples`` lists of one factor per stage: the largest of ``replicas[s]`` draws (with replacement) from
    ``draws``, the stage's slowest replica. No draws: one sample of ones.

    Example: draws ``(0.9, 1.1)`` and one stage of 2 replicas: a factor of 1.1 unless both replicas draw 0.9
    (probability 1/4), so the factors average 1.05 over many samples, where one replica averages 1.0.
    """
    if not draws:
        return [[1.0] * len(replicas)]
    rng = random.Random(seed)
    return [[max(rng.choice(draws) for _ in range(k)) for k in replicas] for _ in range(samples)]


def scaled(costs: Sequence[StageCost], factors: Sequence[float]) -> list[StageCost]:
    """``costs`` with each stage's forward, backward and gradient-bucket compute times times its factor."""
    return [dataclasses.replace(c, fwd_s=c.fwd_s * f, bwd_s=c.bwd_s * f, buckets=[(t * f, b) for t, b in c.buckets])
            for c, f in zip(costs, factors, strict=True)]
