"""Recording from hooks: what automatic detection does where a `with` block cannot be used.

A hook often learns what a region was only once it is over (a batch fetch turns out to feed
an evaluation; a GC pause is measured by two callbacks), opens a step in one hook and closes it
in another, or finds that a region it entered was not what it seemed. These functions do that
with the recorder's own records: not the public API (`otel_train.span` / `step` are).
"""

from __future__ import annotations

from typing import Any

from otel_train.record import device, recorder
from otel_train.record.recorder import Recorder, Region, Step, close_step
from otel_train.wire.schema import NO_STEP, region_record


def begin_step(n: int | None = None, epoch: int | None = None, attrs: dict[str, Any] | None = None,
               t0: int | None = None) -> Step | None:
    """Open a step without a `with` block; `t0` (perf ns) backdates it to the previous boundary."""
    step = Step(n, epoch, attrs)
    step.__enter__()
    if step.rec is None:
        return None
    if t0 is not None:
        step.t0 = t0
    return step


def end_step(t1: int | None = None) -> Step | None:
    """Close the open step (if any) and return it; `t1` (perf ns) sets its end, default now."""
    r = recorder._rec
    if r is None or not isinstance(r.step, Step):
        return None
    step = r.step
    close_step(r, step, r.now() if t1 is None else t1, None)
    return step


def record(r: Recorder, name: str, attrs: dict[str, Any] | None, t0: int, t1: int,
           parent: Region | None = None, ref: tuple[int | None, int | None] | None = None) -> None:
    """Append a region that already happened (`t0`..`t1`, perf ns) to recorder `r` (the one in
    force: the caller has it at hand), in the open step or the one just ended (`ref`, when
    given: the (step number, step seq) it belongs to instead, `before(r)` before the first)."""
    # `_parent_seq` and `_step_ref` written out: automatic detection calls this for every batch
    # fetch, and two calls fewer are ~4 a step.
    if ref is None:
        step = r.step
        ref = step.ref if step is not None else NO_STEP
    r.append(region_record(name, next(recorder.seq), parent.seq if parent is not None and parent.rec is r else None,
                           ref, t0, t1, attrs or None))


class Before:
    """Stands for the step of a region recorded before the first step (an evaluation or a
    checkpoint before training starts): it joins the first step's trace (`ref`), as a region
    between steps joins the trace of the step before it."""

    __slots__ = ("ref",)

    def __init__(self, n: int) -> None:
        self.ref = (n, None)


def before(r: Recorder) -> tuple[int | None, int | None]:
    """The step reference of a region between steps: the step just ended, or, before the first
    step, the step to come."""
    step = r.step
    return step.ref if step is not None else (r.next_step, None)


def place_before_first(region: Region) -> None:
    """An entered region with no step (entered before the first one) joins the first step's trace."""
    r = getattr(region, "rec", None)
    if r is not None and getattr(region, "step", None) is None:
        region.step = Before(r.next_step)


def leave(region: Region) -> None:
    """Take an entered region off the current-region pointer, unrecorded, to be `finish`ed later."""
    if getattr(region, "rec", None) is None or hasattr(region, "t1"):
        return
    hotpath = recorder._hotpath
    if hotpath is not None and isinstance(region, hotpath.Region):
        hotpath.leave(region)
        return
    try:
        recorder._current.reset(region.token)
    except ValueError:  # left in another context
        recorder._current.set(region.parent)


def make_current(region: Region) -> None:
    """Put an entered region that was `leave`-d back on the current-region pointer, as entering
    would, until the next `leave`."""
    if getattr(region, "rec", None) is None or hasattr(region, "t1"):
        return
    hotpath = recorder._hotpath
    if hotpath is not None and isinstance(region, hotpath.Region):
        hotpath.make_current(region)
        return
    region.token = recorder._current.set(region)


def finish(r: Recorder, region: Region, t1: int, attrs: dict[str, Any] | None) -> None:
    """Record a region that was entered and `leave`-d as ending at `t1`, with `attrs`: what its
    exit would have appended had it ended then (the object itself while it holds device events)."""
    if getattr(region, "dev", None) is not None:
        region.t1 = t1
        region.attrs = attrs
        region.exc = None
        r.append(region)
        return
    parent, step = region.parent, region.step
    r.append(region_record(region.name, region.seq, parent.seq if parent is not None and parent.rec is r else None,
                           step.ref if step is not None else NO_STEP, region.t0, t1, attrs or None, None,
                           region.events or None))


def abandon(region: Region) -> None:
    """Leave an entered region without recording it (detection found it was not what it seemed)."""
    if getattr(region, "rec", None) is None or hasattr(region, "t1"):
        return
    device.drop_events(region)  # a device region hands its events back
    leave(region)
