"""Clocks: the hot path reads a monotonic nanosecond counter; the worker maps it to wall time.

Reading `time.time_ns()` beside every `perf_counter_ns()` would double the hot-path cost,
so the recorder stores monotonic times only and the worker converts them with an anchor
(one `(perf, wall)` pair, re-taken on every drain so NTP slewing cannot accumulate).
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
