"""The statistics the benches' readings rest on: an exact sign test for "improved against regressed", Holm's
correction when one base evaluation is tested against many arms, and a bootstrap interval for pass@1 over
problems. The standard library only."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from math import comb


def sign_test(improved: int, regressed: int) -> float:
    """The exact two-sided sign test's p-value: were improving and regressing equally likely, the chance of a
    split at least this uneven. Unchanged problems carry no sign and are left out by the caller."""
    n = improved + regressed
    tail = sum(comb(n, i) for i in range(min(improved, regressed) + 1)) / 2**n
    return min(1.0, 2 * tail)


def holm(pvalues: Mapping[str, float]) -> dict[str, float]:
    """Holm's step-down adjusted p-values: the tests whose adjusted p is under alpha keep the chance of any
    false finding among them all under alpha."""
    adjusted, running = {}, 0.0
    for rank, name in enumerate(sorted(pvalues, key=pvalues.__getitem__)):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[name]))
        adjusted[name] = running
    return adjusted


def bootstrap_interval(
    per_problem: Sequence[float], level: float = 0.95, resamples: int = 10_000, seed: int = 0
) -> tuple[float, float]:
    """The percentile bootstrap interval of the mean over problems (for pass@1, each problem's share of
    passing samples), resampling the problems: the problems drawn, not the samples, are what varies most."""
    rng = random.Random(seed)
    n = len(per_problem)
    means = sorted(sum(rng.choices(per_problem, k=n)) / n for _ in range(resamples))
    return means[int((1 - level) / 2 * resamples)], means[int((1 + level) / 2 * resamples) - 1]
