"""The statistics of the overhead benchmark: paired ratios, their medians and confidence intervals."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable


def pair_noise_pct(plain: list[float]) -> float:
    """Spread of one round's plain block against the next one's (IQR of their ratio, %)."""
    ratios = [100 * (b / a - 1) for a, b in zip(plain[0::2], plain[1::2])]
    if len(ratios) < 2:
        return 0.0
    q = statistics.quantiles(ratios, n=4)
    return q[2] - q[0]


def paired_overhead_pct(plain: list[float], other: list[float]) -> float:
    """Median over rounds of (other / plain - 1): each round's blocks ran back to back, so a
    slow patch of the machine hits both sides of a pair instead of one side of the medians."""
    return 100 * statistics.median(o / p - 1 for p, o in zip(plain, other))


def run_alternating(rounds: int, blocks: list[Callable[[], None]]) -> None:
    """Run `rounds` rounds of `blocks`, in forward order on even rounds and reversed on odd
    ones: a machine that slows down or speeds up over a round then favours neither side of a pair."""
    for r in range(rounds):
        for block in blocks if r % 2 == 0 else blocks[::-1]:
            block()


def paired_ci95_pct(plain: list[float], other: list[float]) -> tuple[float, float]:
    """A distribution-free 95 % confidence interval for the median of the rounds' ratios (in %):
    the order statistics that the binomial distribution puts around the median. It assumes
    only that rounds are independent; with fewer than 6 rounds it is the whole range."""
    return ci95_of([100 * (o / p - 1) for p, o in zip(plain, other)])


def ci95_of(values: list[float]) -> tuple[float, float]:
    """`paired_ci95_pct`'s interval for the median of `values` themselves."""
    ratios = sorted(values)
    n = len(ratios)
    j = 0  # the most order statistics to leave out on each side: P(Binomial(n, 1/2) < j) <= 2.5 %
    while j < n // 2 and sum(math.comb(n, i) for i in range(j + 1)) / 2 ** n <= 0.025:
        j += 1
    return (ratios[j - 1], ratios[n - j]) if j else (ratios[0], ratios[-1])


def noise_pct(plain: list[float]) -> float:
    """Spread of the baseline between rounds (interquartile range / median): the machine's noise."""
    q = statistics.quantiles(plain, n=4)
    return 100 * (q[2] - q[0]) / statistics.median(plain)
