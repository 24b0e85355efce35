"""A run's goodput from its `RunData`: the intervals each rank's spans give `goodput.paint`.

Every rank is painted over the same job window (skew-corrected: from the first
`otel_train.init` of any rank to the last span end of any rank), so each rank's categories add
up to the job's wall time and their mean is the job's breakdown. Before a rank's own start the
job is starting up; after its last span, the time is `other`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from otel_train import semconv
from otel_train.analyze import goodput as gp
from otel_train.analyze.model import PHASES, RankStep, RunData
from otel_train.analyze.skew import Skew
from otel_train.analyze.slow import ideal_step_time, slow_bound, warmup_length

_SIBLING_CATEGORY = {semconv.SPAN_CHECKPOINT: gp.CHECKPOINT, semconv.SPAN_EVAL: gp.EVAL, semconv.SPAN_GC: gp.GC}
_DATA_CODES = frozenset(PHASES.index(p) for p in (semconv.SPAN_DATA, semconv.SPAN_DISPATCH_WAIT))
COMPILE_TAG = "compile"


@dataclass
class Goodput:
    """The job's breakdown (mean over ranks, ns) and each rank's goodput."""

    start_ns: int = 0
    end_ns: int = 0
    totals: dict[str, float] = field(default_factory=dict)
    per_rank: dict[int, float] = field(default_factory=dict)
    redone_steps: int = 0  # step attempts lost to restarts (all ranks)
    restarts: int = 0  # highest ml.restart seen
    startup_from: str = "init"  # "init" (metrics' start time) or "first span"
    series: list[tuple[int, float]] = field(default_factory=list)  # (time ns, goodput so far), when asked

    @property
    def wall_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def goodput(self) -> float:
        wall = sum(self.totals.values())
        return self.totals.get(gp.PRODUCTIVE, 0.0) / wall if wall else 0.0


def job_window(data: RunData, skew: Skew) -> tuple[int, int, str]:
    """(start, end, what the start is) of the job on the reference clock."""
    start, end, source = sys.maxsize, 0, "init"
    for key, first in data.first_ns.items():
        off = skew.of(key[0])
        init = data.init_ns.get(key)
        if init is None:
            source = "first span"
        start = min(start, (init if init is not None and init < first else first) - off)
        end = max(end, data.last_ns[key] - off)
    return (start, end, source) if end else (0, 0, source)


def account(data: RunData, skew: Skew, job_step_ns: Sequence[int], marks: int = 0) -> Goodput:
    """The run's goodput; `job_step_ns` is the job's step times (for the warm-up's ideal). With
    `marks`, also the goodput so far at that many evenly spaced times (`Goodput.series`: what
    `train.goodput` read then, mean over ranks; the last is the run's)."""
    start, end, source = job_window(data, skew)
    out = Goodput(start, end, startup_from=source)
    if end <= start:
        out.totals = dict.fromkeys(gp.CATEGORIES, 0.0)
        return out
    times = [start + (end - start) * (i + 1) // marks for i in range(marks)] if marks else [end]
    bound = slow_bound(job_step_ns) or 0.0
    ideal = ideal_step_time(job_step_ns) or 0.0
    by_rank: dict[int, list[tuple[int, int]]] = {}
    for rank, restart in data.steps:
        by_rank.setdefault(rank, []).append((rank, restart))
    for rank, restart in data.processes:
        if (rank, restart) not in data.steps and data.processes[(rank, restart)].role == semconv.ROLE_TRAINER:
            by_rank.setdefault(rank, []).append((rank, restart))
    siblings: dict[int, list[tuple[int, int, str]]] = {}
    for s in data.siblings:
        category = _SIBLING_CATEGORY.get(s.name)  # train.other: the script's own time, no category of its own
        if category is not None:
            siblings.setdefault(s.rank, []).append((s.start, s.end, category))
    per_rank_totals = []
    so_far = [0.0] * len(times)
    for rank, keys in sorted(by_rank.items()):
        off = skew.of(rank)
        intervals = [(a - off, b - off, c) for a, b, c in siblings.get(rank, ())]
        compile_ns, redone = _rank_intervals(data, sorted(keys, key=lambda k: k[1]), off, start, bound, ideal,
                                             intervals)
        out.redone_steps += redone
        snaps = [gp.take_compile(t, compile_ns) for t in gp.paint_marks(start, times, intervals)]
        totals = snaps[-1]
        per_rank_totals.append(totals)
        out.per_rank[rank] = gp.goodput(totals)
        for i, snap in enumerate(snaps):
            so_far[i] += gp.goodput(snap)
    out.totals = gp.mean_totals(per_rank_totals)
    out.restarts = max((r for _, r in data.processes), default=0)
    if marks and per_rank_totals:
        out.series = [(t, v / len(per_rank_totals)) for t, v in zip(times, so_far)]
    return out


def _rank_intervals(data: RunData, keys: list[tuple[int, int]], off: int, job_start: int, bound: float,
                    ideal: float, intervals: list[tuple[int, int, str]]) -> tuple[int, int]:
    """Append one rank's intervals (all its attempts); return (compile ns, redone step count)."""
    later_steps: set[int] = set()
    redone = compile_ns = 0
    prev_last: int | None = None
    # Walk attempts newest first, so "seen again later" is known for each earlier attempt.
    spans_of = []
    for key in reversed(keys):
        steps = data.steps.get(key, {})
        spans_of.append((key, steps, set(later_steps)))
        later_steps |= set(steps)
    for i, (key, steps, seen_later) in enumerate(reversed(spans_of)):
        first = data.first_ns.get(key, 0) - off
        init = data.init_ns.get(key)
        begin = min(first, init - off) if init is not None else first
        ordered: list[RankStep] = [steps[n] for n in sorted(steps)]
        last = data.last_ns.get(key, first + off) - off
        first_step = min(rs.start for rs in ordered) - off if ordered else last
        if i == 0:
            intervals.append((job_start, first_step, gp.STARTUP))
        else:
            intervals.append((begin, first_step, gp.RESTART))
            if prev_last is not None and begin > prev_last:
                intervals.append((prev_last, begin, gp.RESTART))
        prev_last = last
        kept: list[RankStep] = []
        for rs in ordered:
            a, b = rs.start - off, rs.end - off
            if rs.step in seen_later:
                intervals.append((a, b, gp.RESTART))
                redone += 1
                continue
            kept.append(rs)
            intervals.append((a, b, gp.PRODUCTIVE))
            t = rs.times
            for i, code in enumerate(rs.codes):
                if code in _DATA_CODES:
                    intervals.append((t[2 * i] - off, t[2 * i + 1] - off, gp.DATA))
        compile_ns += _compile_ns(kept, bound, ideal)
    return compile_ns, redone


def _data_ns(rs: RankStep) -> int:
    return sum(ns for code, ns in enumerate(rs.totals) if code in _DATA_CODES)


def _compile_ns(steps: list[RankStep], bound: float, ideal: float) -> int:
    """An attempt's warm-up excess, plus the excess of later steps tagged `compile` (each less
    the step's data wait, which is `data` already)."""
    if not ideal:
        return 0
    timed = [(rs.duration, _data_ns(rs)) for rs in steps]
    warm = gp.warmup_excess(timed, bound, ideal)
    leading = warmup_length([t for t, _ in timed], bound)
    tagged = sum(gp.excess(t, data, ideal) for rs, (t, data) in zip(steps[leading:], timed[leading:])
                 if COMPILE_TAG in rs.tags)
    return warm + tagged
