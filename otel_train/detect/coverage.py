"""Where a step's time went, adding up: `train.other` for the script's own code, and what is left.

A detected step spans from the previous boundary to the end of its update, and its phases
(`train.data`, `train.forward`, `train.backward`, `train.optimizer`, `train.zero_grad`,
top-level `train.collective`) leave gaps: the script's own host code (a `get_batch()` with no
DataLoader, the loss function, logging, a manual SGD update, plotting). When the step closes,
its largest gaps become `train.other` spans, children of the step, until what stays uncovered is
at most `MAX_UNCOVERED` of the step; the step says how much that is in `train.step.uncovered_s`
(seconds of it that no span below it covers). So a step's children add up to it, less
`uncovered_s`, and a Gantt shows where the rest went.

Between steps, the time from a step's end to the evaluation or checkpoint that follows it, and
between those siblings, is the script's own code too: a `train.other` span there (a sibling,
joining the trace of the step before it, untagged). The next step starts where the last
sibling ended, as before.

Only what detection records is counted as covering a step: spans the user adds inside a gap
are not subtracted from `uncovered_s` (they overlap the `train.other` there).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from otel_train import semconv
from otel_train.detect.state import OTHER, State
from otel_train.record import direct, recorder
from otel_train.record.recorder import Recorder, Step
from otel_train.wire.schema import KIND_SPAN, region_record

try:  # the loops in C (`_loops.c`); `gaps_python` is the fallback
    from otel_train.detect import _loops
except ImportError:
    _loops = None  # type: ignore[assignment]

#: At most this share of a step stays uncovered by spans: larger gaps become `train.other`.
MAX_UNCOVERED = 0.005
#: A gap shorter than this never becomes a span (it is timer noise).
MIN_GAP_NS = 1_000


def cover(s: State, t0: int, t1: int) -> None:
    """A top-level phase of the open step took [t0, t1]."""
    s.cover += (t0, t1)


def close(r: Recorder, s: State, step: Step, t1: int) -> None:
    """The step closes at `t1`: its largest gaps become `train.other` spans, and the rest of
    its uncovered time goes on it as `train.step.uncovered_s`."""
    spans = s.cover
    s.cover = []
    total = gaps(spans, step.t0, t1, MAX_UNCOVERED, MIN_GAP_NS, r.append, recorder.seq, KIND_SPAN, OTHER, step.ref)
    attrs = step.attrs
    if attrs is None:
        step.attrs = {semconv.TRAIN_STEP_UNCOVERED_S: total / 1e9}
    else:
        attrs[semconv.TRAIN_STEP_UNCOVERED_S] = total / 1e9


def gaps_python(cover: list[int], t0: int, t1: int, max_uncovered: float, min_gap_ns: int,
                append: Callable[[tuple[Any, ...]], Any], seq: Iterator[int], kind: int, name: str,
                ref: tuple[Any, Any]) -> int:
    """The step [t0, t1]'s largest gaps between the intervals in `cover` ([a, b, a, b, ...]),
    appended as `name` records (`direct.record`, written out) until what stays uncovered is at
    most `max_uncovered` of the step; returns the uncovered ns left. `_loops.gaps` in C."""
    gaps = []
    total = 0
    cursor = t0
    if cover:
        intervals = sorted(zip(cover[::2], cover[1::2])) if len(cover) > 2 else [(cover[0], cover[1])]
        for a, b in intervals:
            if a > cursor:
                end = a if a < t1 else t1
                if end > cursor:
                    gaps.append((end - cursor, cursor, end))
                    total += end - cursor
            if b > cursor:
                cursor = b
    if t1 > cursor:
        gaps.append((t1 - cursor, cursor, t1))
        total += t1 - cursor
    allowed = (t1 - t0) * max_uncovered
    if total > allowed:
        gaps.sort(reverse=True)
        for length, a, b in gaps:
            if total <= allowed or length < min_gap_ns:
                break
            append(region_record(name, next(seq), None, ref, a, b, None))  # `kind` is KIND_SPAN, the C's
            total -= length
    return total


gaps = _loops.gaps if _loops is not None else gaps_python


def between(r: Recorder, s: State, t0: int) -> None:
    """A sibling (evaluation, checkpoint) starts at `t0` between steps: the script's code since
    the last step or sibling ended is a `train.other` sibling."""
    after = s.after
    if after is not None and t0 - after >= MIN_GAP_NS and s.step is None:
        direct.record(r, OTHER, None, after, t0, ref=direct.before(r))


def sibling_end(s: State, t1: int) -> None:
    """A sibling ended at `t1` (or a step did): what follows is covered from there."""
    if s.after is None or t1 > s.after:
        s.after = t1
