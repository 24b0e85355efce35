"""Steps held until the next one: what a step's own time is, and the notes that join it late.

A step span is held until the next step's record arrives, for three reasons: tags and events
recorded after it ended (`otel_train.tag("checkpoint")` after the loop body) still reach it;
the checkpoint, eval, GC and benchmark spans that follow it (its siblings) are known by then; and its own
time (`train.step.time_s`) runs from the previous step's boundary to its own, less its
siblings' time. Records arrive in recording order, so a note whose step is not held yet (an
orphan) waits for it, bounded (`_MAX_ORPHANS`); so does the tag of a sibling recorded before the
first step (an evaluation before training), for the step it joins.

An event recorded after its step ended (`otel_train.event(...)` between steps) is shown at the
step's end, where a trace viewer shows it (inside the span), with `otel_train.event.late_s`
saying how much later it really was (`late_events`).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from otel_train import semconv
from otel_train.wire.schema import KIND_EVENT, KIND_TAG, W_ATTRS, W_EVENTS, W_SEQ, W_STEP, W_T0, W_T1

_MAX_ORPHANS = 1024  # tags/events waiting for a step record that may never come

#: The spans that are siblings of steps, never inside one, and the tag each puts on its step.
SIBLING_TAGS = {semconv.SPAN_CHECKPOINT: semconv.TAG_CHECKPOINT, semconv.SPAN_EVAL: semconv.TAG_EVAL,
                semconv.SPAN_GC: semconv.TAG_GC, semconv.SPAN_BENCH_LATENCY: semconv.TAG_BENCH}


class HeldStep:
    """A step waiting for the next one. `lean`: the encoded `train.epoch` / `train.micro_batches`
    fields of a usual step (`FastPath.lean_step`), which is emitted without cleaning or
    re-encoding those while nothing is added to it."""

    __slots__ = ("wire", "tags", "events", "time_s", "lean", "end")

    def __init__(self, wire: tuple[Any, ...], time_s: float, lean: bytes | None = None,
                 end: int | None = None) -> None:
        self.wire = wire
        self.end = end  # its boundary (wall ns) where that is not its host end: its device end
        self.tags: list[str] = list(wire[W_ATTRS].pop(semconv.TRAIN_STEP_TAGS, ()))
        self.events: list[tuple[str, int, Any]] = list(wire[W_EVENTS] or ())
        self.time_s = time_s
        self.lean = lean


class StepTimeline:
    """The held steps, the siblings' time, and the notes still waiting for their step."""

    def __init__(self) -> None:
        self.held: dict[int, HeldStep] = {}
        self.orphans: dict[int, list[tuple[int, Any]]] = {}
        self.siblings: deque[tuple[int, int]] = deque(maxlen=256)
        self.prev_step_end: int | None = None
        self.early: dict[int, list[str]] = {}  # tags for step numbers not held yet (before the first step)
        self.last_n: int | None = None  # the highest step number held so far
        self.work_ends: dict[int, int] = {}  # step seq -> where its device-timed regions ended (host ns)

    def hold(self, wire: tuple[Any, ...], end: int, lean: bytes | None = None) -> tuple[HeldStep, list[HeldStep]]:
        """Hold step `wire`, whose boundary is `end`, until the next step: its own time runs from
        the previous step's boundary, less its siblings' time; the notes that came before it
        join it. Returns it as held, and the steps held before it, now complete, oldest first.
        (Once a step for every step of a run: the usual step, with no sibling or note waiting
        and the one before it held, takes no call or list it does not need.)"""
        prev = self.prev_step_end
        start = prev if prev is not None and prev < end else wire[W_T0]
        own_ns = end - start
        if self.siblings:
            own_ns -= self.sibling_ns(start, end)
        self.prev_step_end = end
        held = HeldStep(wire, max(own_ns, 0) / 1e9, lean, end if end != wire[W_T1] else None)
        seq = wire[W_SEQ]
        if self.orphans:
            for kind, payload in self.orphans.pop(seq, ()):
                (held.tags if kind == KIND_TAG else held.events).append(payload)
        n = wire[W_STEP]
        if self.early:
            held.tags.extend(self.early.pop(n, ()))
        if type(n) is int and (self.last_n is None or n > self.last_n):
            self.last_n = n
        steps = self.held
        if not steps:
            done = []
        elif len(steps) == 1:
            earlier = next(iter(steps))
            done = [steps.pop(earlier)] if earlier < seq else []
        else:
            done = [steps.pop(earlier) for earlier in [s for s in steps if s < seq]]
        steps[seq] = held
        return held, done

    def device_work(self, step_seq: int, end: int) -> None:
        """A device-timed region of step `step_seq` (not a sibling) ended on the device at `end`."""
        ends = self.work_ends
        if ends.get(step_seq, end - 1) < end:
            ends[step_seq] = end
        if len(ends) > _MAX_ORPHANS:  # steps whose record never came
            ends.pop(next(iter(ends)))

    def device_end(self, step_seq: int, t1: int, event_end: int, late: bool) -> int:
        """Step `step_seq`'s boundary: when its end event completed (`event_end`); for a step
        closed after it ended (`late`: automatic detection closes one with `t1`, its last phase's
        end, at the next step's start or at shutdown, and its end event is recorded then), no
        later than the end of its own device work (its last device-timed region) or `t1`,
        whichever is later: the event would add the idle device since, or the next step's work
        launched meanwhile (its batch's copy). A step closed at its end keeps the device work
        launched after its last region (an EMA update, a metric) as its own."""
        work = self.work_ends.pop(step_seq, None)
        if work is None or not late:
            return event_end
        return min(event_end, max(work, t1))

    def release_all(self) -> list[HeldStep]:
        """Every held step, oldest first (at shutdown, or when a caller must see everything now)."""
        return [self.held.pop(seq) for seq in sorted(self.held)]

    def sibling(self, start: int, end: int) -> None:
        """A checkpoint, eval or GC span took [start, end]: no step's own time."""
        self.siblings.append((start, end))

    def tag(self, step_n: int, step_seq: int | None, tag: str) -> None:
        """Tag step `step_n` (`step_seq`, when known, names it exactly)."""
        held = self.held.get(step_seq) if step_seq is not None else None
        if held is None:
            held = next((h for h in self.held.values() if h.wire[W_STEP] == step_n), None)
        if held is not None:
            held.tags.append(tag)
        elif step_seq is not None:
            self._orphan(step_seq, KIND_TAG, tag)
        elif type(step_n) is int and (self.last_n is None or step_n > self.last_n) and len(self.early) < _MAX_ORPHANS:
            self.early.setdefault(step_n, []).append(tag)  # a sibling before its step (the first)

    def event(self, step_seq: int, payload: Any) -> None:
        """An event (`payload`: name, wall ns, attributes) for the step with seq `step_seq`."""
        held = self.held.get(step_seq)
        if held is not None:
            held.events.append(payload)
        else:
            self._orphan(step_seq, KIND_EVENT, payload)

    def _orphan(self, step_seq: int, kind: int, payload: Any) -> None:
        if len(self.orphans) >= _MAX_ORPHANS and step_seq not in self.orphans:
            self.orphans.pop(next(iter(self.orphans)))
        self.orphans.setdefault(step_seq, []).append((kind, payload))

    def sibling_ns(self, start: int, end: int) -> int:
        """The time within [start, end] that checkpoint, eval and GC spans took. A sibling that
        ended by `start` is forgotten: steps arrive in order, so no later step can overlap it
        (kept, a long run's 256 of them were summed again at every step)."""
        siblings = self.siblings
        if not siblings:
            return 0
        if siblings[0][1] <= start:
            live = [(s0, s1) for s0, s1 in siblings if s1 > start]
            siblings.clear()
            siblings.extend(live)
        return sum(max(0, min(s1, end) - max(s0, start)) for s0, s1 in siblings)


def late_events(events: list[tuple[str, int, Any]], end: int) -> list[tuple[str, int, Any]]:
    """`events` with those after `end` (wall ns) moved to it, each saying how late it was."""
    out = []
    for name, t, attrs in events:
        if t > end:
            attrs = {**(attrs or {}), semconv.EVENT_LATE_S: (t - end) / 1e9}
            t = end
        out.append((name, t, attrs))
    return out
