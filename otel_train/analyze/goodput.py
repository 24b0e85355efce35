"""Goodput: a run's wall time split into productive step time and badput by category.

The categories follow ml-goodput-measurement (MaxText's goodput library: program start-up,
data loading, checkpoint save/restore, wasted progress from disruptions, other), made from our
own spans:

| category     | time                                                                      |
|--------------|---------------------------------------------------------------------------|
| `startup`    | from `otel_train.init` (or the first span) until the first step starts     |
| `compile`    | the warm-up steps' excess over the ideal step time (graph capture,         |
|              | torch.compile, autotuning) less their data wait, and the same excess of    |
|              | steps tagged `compile`                                                     |
| `data`       | `train.data` (and `pipeline.dispatch_wait`) inside steps                  |
| `checkpoint` | `train.checkpoint` spans (save and load)                                   |
| `eval`       | `train.eval` spans                                                         |
| `gc`         | `train.gc` spans (Python collector pauses)                                 |
| `restart`    | time lost to restarts: steps redone after resuming (the earlier attempt's  |
|              | spans of a step number seen again with a higher `ml.restart`), the gap     |
|              | between attempts, and the new attempt's start-up                          |
| `productive` | the rest of the step time                                                  |
| `other`      | wall time no span covers (between steps, after the last one)               |

Every instant of the window goes to exactly one category (the first in `PRIORITY` whose
intervals cover it), so the categories add up to the wall time by construction.

Pure functions, standard library only, no I/O: the exporter process can reuse them on its own
spans to export `train.goodput` at run time.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence

from otel_train.analyze.slow import warmup_length

STARTUP, COMPILE, DATA, CHECKPOINT, EVAL, GC, RESTART, PRODUCTIVE, OTHER = (
    "startup", "compile", "data", "checkpoint", "eval", "gc", "restart", "productive", "other")
#: Report order: productive first, then badput roughly in the order a run meets it.
CATEGORIES: tuple[str, ...] = (PRODUCTIVE, STARTUP, COMPILE, DATA, CHECKPOINT, EVAL, GC, RESTART, OTHER)
#: Which category wins where intervals overlap (a checkpoint load inside a resumed attempt's
#: start-up is checkpoint time; a data wait inside a redone step is lost to the restart).
PRIORITY: tuple[str, ...] = (CHECKPOINT, EVAL, GC, RESTART, DATA, PRODUCTIVE, STARTUP)
_RANK = {c: i for i, c in enumerate(PRIORITY)}


def paint(start: int, end: int, intervals: Iterable[tuple[int, int, str]]) -> dict[str, int]:
    """Split [start, end) among categories: each instant to the highest-priority interval over
    it (`PRIORITY`), `other` where none is. Intervals are (start, end, category), clipped to the
    window; their order does not matter. Returns ns per category (all of `CATEGORIES`)."""
    return paint_marks(start, [end], intervals)[-1] if end > start else dict.fromkeys(CATEGORIES, 0)


def paint_marks(start: int, marks: Sequence[int], intervals: Iterable[tuple[int, int, str]]
                ) -> list[dict[str, int]]:
    """`paint` from `start` to each of `marks` (ascending), in one sweep: the categories so far
    at each mark (a run's goodput over time; the last mark's is `paint`'s)."""
    end = marks[-1] if marks else start
    out = dict.fromkeys(CATEGORIES, 0)
    snaps: list[dict[str, int]] = []
    events: list[tuple[int, int, int]] = []  # (time, +1 open / -1 close, priority index)
    for a, b, cat in intervals:
        a, b = max(a, start), min(b, end)
        if b > a:
            events.append((a, 1, _RANK[cat]))
            events.append((b, -1, _RANK[cat]))
    events.sort()
    active = [0] * len(PRIORITY)
    heap: list[int] = []  # priority indexes open (lazily cleaned)
    t = start
    m = 0

    def advance(to: int) -> None:
        nonlocal t
        while heap and active[heap[0]] == 0:
            heapq.heappop(heap)
        out[PRIORITY[heap[0]] if heap else OTHER] += to - t
        t = to

    for when, delta, idx in events:
        while m < len(marks) and marks[m] <= when:
            if marks[m] > t:
                advance(marks[m])
            snaps.append(dict(out))
            m += 1
        if when > t:
            advance(when)
        if delta > 0:
            if active[idx] == 0:
                heapq.heappush(heap, idx)
            active[idx] += 1
        else:
            active[idx] -= 1
    while m < len(marks):
        if marks[m] > t:
            advance(marks[m])
        snaps.append(dict(out))
        m += 1
    return snaps


def excess(step_ns: int, data_ns: int, ideal_ns: float) -> int:
    """A step's time over `ideal_ns` that is not its data wait: the data wait is `data` badput
    already, so a first step that waited 2 s for its batch is not also 2 s of compilation."""
    return max(0, int(step_ns - ideal_ns) - data_ns)


def warmup_excess(steps: Sequence[tuple[int, int]], bound_ns: float, ideal_ns: float) -> int:
    """The warm-up's compilation: over the leading steps (step ns, data wait ns in it) that are
    over `bound_ns` (`slow.warmup_length`: the run's first steps pay for compilation and
    autotuning), their `excess` over `ideal_ns`."""
    n = warmup_length([t for t, _ in steps], bound_ns)
    return sum(excess(t, data, ideal_ns) for t, data in steps[:n])


def take_compile(totals: Mapping[str, int], compile_ns: int) -> dict[str, int]:
    """Move `compile_ns` of productive time to `compile` (no more than there is)."""
    out = dict(totals)
    moved = max(0, min(compile_ns, out[PRODUCTIVE]))
    out[PRODUCTIVE] -= moved
    out[COMPILE] += moved
    return out


def goodput(totals: Mapping[str, int]) -> float:
    """Productive share of the wall time (0 for an empty window)."""
    wall = sum(totals.values())
    return totals.get(PRODUCTIVE, 0) / wall if wall else 0.0


def mean_totals(per_rank: Sequence[Mapping[str, int]]) -> dict[str, float]:
    """The job's categories: each rank's, painted over the same window, averaged."""
    if not per_rank:
        return dict.fromkeys(CATEGORIES, 0.0)
    return {c: sum(t[c] for t in per_rank) / len(per_rank) for c in CATEGORIES}
