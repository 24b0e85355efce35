"""The slow-step rule: a step is slow when it takes longer than median + 3 sigma of recent steps,
sigma estimated robustly as 1.4826 x MAD; its severity is its time over that median (x median).

The rule is the usual robust outlier test (Hampel's identifier: the median absolute deviation
scaled by 1.4826 estimates the standard deviation of normal noise, and a point past 3 of them is
an outlier), chosen so that `slow` means "anomaly": on steady noise it tags about 0.1-1 % of
steps (a plain 5 ms sleep loop: 1 of 300), where the unscaled MAD (ml-goodput-measurement's
`median + 3 * MAD`) tagged ~5 %. Its ideal step time is ml-goodput-measurement's: the mean of
the steps within the bound (`compute_ideal_step_time`). Choices of ours, so one rule can run
inside the exporter process step by step and in `diagnose` afterwards:

- *recent*: each step is judged against the `window` steps before it (default 100), and only
  once `min_history` (default 10) steps have been seen; the first steps of a run are its
  warm-up (`warmup_length`), which goodput accounts as compilation or data wait instead;
- a floor: the bound is at least `floor` (default 5 %) above the median, so a very steady run
  (MAD near zero) does not flag sub-percent jitter as slow.

Pure Python, standard library only, no I/O: this module is the only implementation of the rule
(`otel_train`'s exporter process imports it to tag steps `slow`; `diagnose`, `report` and the
exports read the same verdicts). Its cost a step is a bisect into a sorted window of 100 and,
only for a step over median + 5 %, a selection of the MAD in it (`_bound_sorted`).
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable, Sequence

K_SIGMA = 3.0
#: MAD -> standard deviation of normal noise (1 / Phi^-1(3/4)).
MAD_SCALE = 1.4826
WINDOW = 100
MIN_HISTORY = 10
FLOOR = 0.05
#: How the rule reads in every output (diagnose, report, metric description, docs).
RULE_TEXT = (f"over median + {K_SIGMA:g} x 1.4826 MAD of the {WINDOW} steps before (at least "
             f"+{FLOOR:.0%}), judged from step {MIN_HISTORY + 1} on")


def median(values: Sequence[float]) -> float:
    """The median of a non-empty sequence."""
    return _median_sorted(sorted(values))


def _median_sorted(s: Sequence[float]) -> float:
    n = len(s)
    mid = n // 2
    return float(s[mid]) if n % 2 else (s[mid - 1] + s[mid]) / 2.0


def mad(values: Sequence[float], center: float | None = None) -> float:
    """Median absolute deviation (unscaled, as scipy.stats.median_abs_deviation's default)."""
    c = median(values) if center is None else center
    return median([abs(v - c) for v in values])


def _bound_sorted(ordered: Sequence[float], k: float, floor: float) -> float:
    """The bound of a sorted window. The MAD is selected from the two sorted runs of deviations
    either side of the median (~7 probes) rather than sorting 100 deviations: a step costs the
    exporter ~1.5 us, not ~9 (`m - x` is `abs(x - m)` exactly: IEEE subtraction is symmetric)."""
    n = len(ordered)
    half = n // 2
    m = ordered[half] if n % 2 else (ordered[half - 1] + ordered[half]) / 2.0
    split = bisect.bisect_right(ordered, m)
    spread = _kth_deviation(ordered, m, split, half) if n % 2 else \
        (_kth_deviation(ordered, m, split, half - 1) + _kth_deviation(ordered, m, split, half)) / 2.0
    return m + max(k * MAD_SCALE * spread, floor * m)


def _kth_deviation(ordered: Sequence[float], m: float, split: int, k: int) -> float:
    """The `k`-th smallest (from 0) of `abs(x - m)` over `ordered` (sorted; `ordered[:split]` at
    most `m`): the k-th of two sorted runs, `m - x` walking down from `split` and `x - m` up
    from it, found by bisecting how many come from the first."""
    a, b = split, len(ordered) - split
    lo, hi = max(0, k + 1 - b), min(a, k + 1)
    while True:
        i = (lo + hi) // 2  # taken from below; k + 1 - i from above
        j = k + 1 - i
        if i < a and j > 0 and ordered[split + j - 1] - m > m - ordered[split - 1 - i]:
            lo = i + 1
        elif i > 0 and j < b and m - ordered[split - i] > ordered[split + j] - m:
            hi = i - 1
        else:
            below = m - ordered[split - i] if i > 0 else -1.0
            above = ordered[split + j - 1] - m if j > 0 else -1.0
            return below if below > above else above


def slow_bound(recent: Sequence[float], k: float = K_SIGMA, floor: float = FLOOR) -> float | None:
    """The step time above which a step is slow, from `recent` step times (None if empty)."""
    return _bound_sorted(sorted(recent), k, floor) if recent else None


def ideal_step_time(times: Sequence[float], k: float = K_SIGMA, floor: float = FLOOR) -> float | None:
    """ml-goodput-measurement's ideal step time: the mean of the steps within the slow bound."""
    bound = slow_bound(times, k, floor)
    if bound is None:
        return None
    normal = [t for t in times if t <= bound]
    return sum(normal) / len(normal) if normal else None


def warmup_length(times: Sequence[float], bound: float | None = None) -> int:
    """How many leading steps are the run's warm-up: those over the slow bound of the whole run
    (`bound`, else computed), up to the first that is not. Every verdict leaves them out."""
    if bound is None:
        bound = slow_bound(times)
    n = 0
    while bound is not None and n < len(times) and times[n] > bound:
        n += 1
    return n


class SlowStepRule:
    """The rule applied step by step: `observe(t)` says whether step time `t` is slow, and leaves
    the median it was judged against in `median` (severity: `t / median`).

    Each step is judged against the `window` steps before it, once `min_history` were seen. A
    sorted copy of the window (`bisect`) gives the median at once; a step under median +
    `floor` is not slow whatever the MAD is, so only steps over it pay for the MAD.
    """

    def __init__(self, window: int = WINDOW, min_history: int = MIN_HISTORY, k: float = K_SIGMA,
                 floor: float = FLOOR) -> None:
        if window < 1 or min_history < 1:
            raise ValueError("window and min_history must be positive")
        self.recent: deque[float] = deque(maxlen=window)
        self.ordered: list[float] = []
        self.min_history, self.k, self.floor = min_history, k, floor
        self.median: float | None = None

    def bound(self) -> float | None:
        """The current bound (None until `min_history` steps were seen)."""
        if len(self.recent) < self.min_history:
            return None
        return _bound_sorted(self.ordered, self.k, self.floor)

    def observe(self, step_time: float) -> bool:
        recent, ordered = self.recent, self.ordered
        slow = False
        if len(recent) >= self.min_history:
            m = self.median = _median_sorted(ordered)
            if step_time > m + self.floor * m:
                slow = step_time > _bound_sorted(ordered, self.k, self.floor)
        else:
            self.median = None
        if len(recent) == recent.maxlen:
            del ordered[bisect.bisect_left(ordered, recent[0])]
        recent.append(step_time)
        bisect.insort(ordered, step_time)
        return slow


def judge(times: Iterable[float], window: int = WINDOW, min_history: int = MIN_HISTORY) -> list[float | None]:
    """`SlowStepRule` over a whole run's step times, in step order: each step's severity (its
    time over the median it was judged against) where it is slow, else None."""
    rule = SlowStepRule(window, min_history)
    out: list[float | None] = []
    for t in times:
        slow = rule.observe(t)
        out.append(t / rule.median if slow and rule.median else None)
    return out


def flag_slow(times: Iterable[float], window: int = WINDOW, min_history: int = MIN_HISTORY) -> list[bool]:
    """`judge`'s verdicts as booleans."""
    return [s is not None for s in judge(times, window, min_history)]
