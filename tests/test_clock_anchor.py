"""One time base on the wire (issue 54 #6): the worker converts every drain's records from the
monotonic clock to wall time with one offset, moved only when the wall clock is stepped.

Re-reading the offset on every drain gave records of one step drained apart offsets a reading's
jitter apart: `train.other` spans ~1 µs off the phases beside them, consecutive steps
overlapping by microseconds."""

from __future__ import annotations

from typing import Any

from otel_train.record.clock import FakeClock


class JitteryClock(FakeClock):
    """Wall time read with a different error each call (±2 µs), as a real pair of clocks does;
    `step_ns` steps the wall clock (a `date -s`, NTP at start)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.step_ns = 0

    def wall_ns(self) -> int:
        self.reads += 1
        return super().wall_ns() + self.step_ns + (2_000 if self.reads % 2 else -2_000)


class OffsetSink:
    def __init__(self) -> None:
        self.offsets: list[int] = []

    def send(self, segments: Any, offset: int, dropped: Any) -> None:
        self.offsets.append(offset)

    def close(self, deadline: float) -> dict[str, int]:
        return {}


def _drains(clock: JitteryClock, sink: OffsetSink, n: int, worker: Any) -> None:
    from otel_train.record import recorder as _recorder
    for _ in range(n):
        clock.advance(1_000_000)
        worker.recorder.append((0, "train.forward", next(_recorder.seq), None, (0, None), clock.now_ns,
                                clock.now_ns + 10, None, None, None))
        worker.drain()


def test_every_drain_converts_with_the_same_offset_until_the_wall_clock_steps() -> None:
    from otel_train.export.worker import Worker
    from otel_train.record.recorder import Recorder
    clock = JitteryClock()
    sink = OffsetSink()
    worker = Worker(Recorder(64, clock), sink, 1e9)
    _drains(clock, sink, 4, worker)
    assert len(sink.offsets) == 4 and len(set(sink.offsets)) == 1, sink.offsets  # jitter does not move it
    clock.step_ns = 5_000_000_000  # the wall clock stepped by 5 s: the next drain follows it
    _drains(clock, sink, 2, worker)
    assert sink.offsets[4] == sink.offsets[5] and abs(sink.offsets[4] - sink.offsets[0] - 5_000_000_000) <= 2_000
