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

The closing step's gaps are found where the step closes, in C (`_loops.close`, its `gaps`: the
gaps between the covered intervals, largest first, each at least `MIN_GAP_NS`).

Only what detection records is counted as covering a step: spans the user adds inside a gap
are not subtracted from `uncovered_s` (they overlap the `train.other` there).
"""

from __future__ import annotations

from otel_train.detect.state import OTHER, State
from otel_train.record import direct
from otel_train.record.recorder import Recorder

#: At most this share of a step stays uncovered by spans: larger gaps become `train.other`.
MAX_UNCOVERED = 0.005
#: A gap shorter than this never becomes a span (it is timer noise).
MIN_GAP_NS = 1_000


def cover(s: State, t0: int, t1: int) -> None:
    """A top-level phase of the open step took [t0, t1]."""
    s.cover += (t0, t1)


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
