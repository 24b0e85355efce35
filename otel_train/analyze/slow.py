"""The slow-step rule: a step is slow when it takes longer than median + 3·MAD of recent steps.

This is ml-goodput-measurement's rule for anomalous steps (`get_anomalous_and_normal_step_times`:
a step time above `median + 3 * median_abs_deviation`, MAD unscaled), and its ideal step time is
the mean of the steps within that bound (`compute_ideal_step_time`). Two choices of ours, both
so the same rule can run inside the exporter process step by step:

- *recent*: each step is judged against the `window` steps before it (default 100), and only
  once `min_history` (default 10) steps have been seen; the first steps of a run are its
  warm-up, which goodput accounts as compilation instead;
- a floor: the bound is at least `floor` (default 5 %) above the median, so a very steady run
  (MAD near zero) does not flag sub-percent jitter as slow.

Pure functions, standard library only, no I/O: `otel_train`'s exporter process can import this
module to tag steps `slow` at run time with exactly the rule `diagnose` and `report` use.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

K_MAD = 3.0
WINDOW = 100
MIN_HISTORY = 10
FLOOR = 0.05


def median(values: Sequence[float]) -> float:
    """The median of a non-empty sequence."""
    s = sorted(values)
    n = len(s)
    mid = n // 2
    return float(s[mid]) if n % 2 else (s[mid - 1] + s[mid]) / 2.0


def mad(values: Sequence[float], center: float | None = None) -> float:
    """Median absolute deviation (unscaled, as scipy.stats.median_abs_deviation's default)."""
    c = median(values) if center is None else center
    return median([abs(v - c) for v in values])


def slow_bound(recent: Sequence[float], k: float = K_MAD, floor: float = FLOOR) -> float | None:
    """The step time above which a step is slow, from `recent` step times (None if empty)."""
    if not recent:
        return None
    m = median(recent)
    return m + max(k * mad(recent, m), floor * m)


def ideal_step_time(times: Sequence[float], k: float = K_MAD, floor: float = FLOOR) -> float | None:
    """ml-goodput-measurement's ideal step time: the mean of the steps within the slow bound."""
    bound = slow_bound(times, k, floor)
    if bound is None:
        return None
    normal = [t for t in times if t <= bound]
    return sum(normal) / len(normal) if normal else None


class SlowStepRule:
    """The rule applied step by step: `observe(t)` says whether step time `t` is slow.

    Each step is judged against the `window` steps before it, once `min_history` were seen.
    """

    def __init__(self, window: int = WINDOW, min_history: int = MIN_HISTORY, k: float = K_MAD,
                 floor: float = FLOOR) -> None:
        if window < 1 or min_history < 1:
            raise ValueError("window and min_history must be positive")
        self.recent: deque[float] = deque(maxlen=window)
        self.min_history, self.k, self.floor = min_history, k, floor

    def bound(self) -> float | None:
        """The current bound (None until `min_history` steps were seen)."""
        if len(self.recent) < self.min_history:
            return None
        return slow_bound(self.recent, self.k, self.floor)

    def observe(self, step_time: float) -> bool:
        bound = self.bound()
        self.recent.append(step_time)
        return bound is not None and step_time > bound


def flag_slow(times: Iterable[float], window: int = WINDOW, min_history: int = MIN_HISTORY) -> list[bool]:
    """`SlowStepRule` over a whole run's step times, in step order."""
    rule = SlowStepRule(window, min_history)
    return [rule.observe(t) for t in times]
