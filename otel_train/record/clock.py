"""Clocks: the hot path reads a monotonic nanosecond counter; the worker maps it to wall time.

Reading `time.time_ns()` beside every `perf_counter_ns()` would double the hot-path cost,
so the recorder stores monotonic times only and the worker converts them with an anchor
(`Anchor`: one `wall - perf` offset for every record of the run, moved only when the wall clock
is stepped). NTP's slewing moves the monotonic and the wall clock alike; re-reading the pair on
every drain only added its own jitter, so records of one step drained apart sat ~1 µs off each
other (issue 54 #6).
Tests inject `FakeClock` instead of sleeping.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Where the recorder gets its time from."""

    def perf_ns(self) -> int: ...

    def wall_ns(self) -> int: ...


class SystemClock:
    """The real clocks; `perf_ns` is the function the hot path calls."""

    perf_ns = staticmethod(time.perf_counter_ns)
    wall_ns = staticmethod(time.time_ns)


class FakeClock:
    """A clock a test moves by hand: `advance(ns)`; wall time = perf time + `wall_offset_ns`."""

    def __init__(self, start_ns: int = 1_000_000_000, wall_offset_ns: int = 1_700_000_000_000_000_000) -> None:
        self.now_ns = start_ns
        self.wall_offset_ns = wall_offset_ns

    def perf_ns(self) -> int:
        return self.now_ns

    def wall_ns(self) -> int:
        return self.now_ns + self.wall_offset_ns

    def advance(self, ns: int) -> int:
        self.now_ns += ns
        return self.now_ns


def wall_offset(clock: Clock) -> int:
    """`wall - perf` for `clock`, taken as the midpoint of two perf readings around one wall reading."""
    before = clock.perf_ns()
    wall = clock.wall_ns()
    after = clock.perf_ns()
    return wall - (before + after) // 2


class Anchor:
    """The one `wall - perf` offset the worker converts with (`wall_offset` on the first drain).

    A reading differs from the last by its own jitter (the wall clock's call between two perf
    readings: ~1 µs, more when preempted), so a new reading moves the offset only when the
    difference is past what the jitter can be (`STEP_NS`: the wall clock was stepped, by hand or
    by NTP at start), and never on a reading whose two perf readings lie far apart. All spans of
    a step then share one time base: consecutive spans abut exactly, and coverage computed from
    the spans equals `train.step.uncovered_s`."""

    STEP_NS = 1_000_000
    #: A reading whose perf readings lie further apart than this is too uncertain to move it.
    NOISY_NS = 100_000

    def __init__(self) -> None:
        self.offset: int | None = None

    def __call__(self, clock: Clock) -> int:
        before = clock.perf_ns()
        wall = clock.wall_ns()
        after = clock.perf_ns()
        reading = wall - (before + after) // 2
        if self.offset is None or (after - before <= self.NOISY_NS and abs(reading - self.offset) > self.STEP_NS):
            self.offset = reading
        return self.offset
