"""How long the worker sleeps between drains: the flush interval, or sooner when records pour in."""

from __future__ import annotations

_MIN_WAIT_S = 0.02
_FIRST_WAIT_S = 0.25


def next_wait(interval_s: float, arrived: int, elapsed_s: float, capacity: int) -> float:
    """How long the worker sleeps before its next drain, `arrived` records having come in over
    the last `elapsed_s`: the flush interval, or the time this rate takes to fill a quarter of
    the buffer if that is sooner, so a burst is drained long before the buffer would drop the
    oldest (never under `_MIN_WAIT_S`, unless the interval itself is)."""
    if arrived <= 0 or elapsed_s <= 0:
        return interval_s
    return max(min(_MIN_WAIT_S, interval_s), min(interval_s, capacity / 4 * elapsed_s / arrived))


class DrainPacer:
    """The worker's waits between drains (`next_wait`), from what each drain found.

    What arrived since the last drain is what the drain moved plus what a full buffer dropped
    meanwhile (the recorder's running `dropped` count): a drain of a full buffer moves only
    its capacity, and a rate read from that alone would never wake the worker sooner. The
    first wait is short (`_FIRST_WAIT_S`), to learn the rate before a whole interval passes.
    """

    def __init__(self, interval_s: float, capacity: int, now: float, dropped: int) -> None:
        self.interval_s = interval_s
        self.capacity = capacity
        self.wait = min(interval_s, _FIRST_WAIT_S)
        self._last, self._dropped = now, dropped

    def drained(self, moved: int, dropped: int, now: float) -> float:
        """A drain moved `moved` records at `now`, the recorder having dropped `dropped` in all;
        returns the next wait."""
        arrived = moved + dropped - self._dropped
        self.wait = next_wait(self.interval_s, arrived, now - self._last, self.capacity)
        self._last, self._dropped = now, dropped
        return self.wait
