"""The worker: drains the hot-path buffer off the training thread and hands records on.

It wakes every `flush_interval_ms` (sooner while records arrive fast enough to fill a quarter
of the buffer in less: `next_wait`), drains in slices of `_SLICE` records and gives the GIL
back between slices (`time.sleep(0)`), so the training thread never waits long behind it.
Each slice goes to a sink (`sinks`): the per-rank exporter process (default) or the export
pipeline on this thread. How long it sleeps between drains: `pacer`.

With the exporter process, the recorder packs plain regions into slots ("the packed ring" in
`record/_hotpath_recorder.c`) and a drain moves them as they lie (`drain_packed`,
`ProcessSink.send_packed`): one bytes object for a slice of slots, with the few other records
(steps, tags, events) beside it. Measured on the benchmark's small-step records: 106 ns of worker CPU a record, against 413
ns for popping, marshalling and freeing each record's tuple.

Device events (whose polling must stay in the training process) are resolved here before
a record is handed on. On the packed path only the side records that carry events are (the rest
move as slots, as on a CPU), and a drained chunk is held from its first record whose events are
pending (`_resolve_packed`): until 2026-11-28 every record went unpacked once a device was
chosen, per-record Python in the training process on every GPU run. Once a
drain, `sample` reads what only torch knows for the metrics (device memory counters, the
model's size: `samples`), sent with the drain as one more record.

What a sink gets, in recording order: runs of the hot path's plain tuples as they are, and
runs of the few records that are objects (with device events, or force-ended at shutdown)
already as wire tuples, with the perf-to-wall clock offset. Turning raw tuples into spans is
the exporter's work: every microsecond spent here is spent in the training process, twice
over through the GIL.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from otel_train.export.pacer import DrainPacer
from otel_train.export.pipe import Segments
from otel_train.export.sinks import Sink
from otel_train.record import recorder
from otel_train.record.clock import Anchor
from otel_train.record.device_resolver import _FLUSH_WAIT_S
from otel_train.record.recorder import Recorder, to_wire
from otel_train.wire.schema import sample_wire

_log = logging.getLogger("otel_train")
_SLICE = 256
#: Records a slice when they move as slots (`drain_packed`): only the side records among them
#: (a step's record, ~1 in 9 on the benchmark's small step) cost the worker per record.
_PACKED_SLICE = 2048


#: Bytes a slot of the packed ring (`wire/slots.h`); its first byte is its tag, 0 a side record.
SLOT_SIZE: int = recorder._hotpath.SLOT_SIZE if recorder._hotpath is not None else 0


def _side_slot(slots: bytes, k: int) -> int:
    """The index of the `k`-th (from 0) side slot in `slots`."""
    tags = slots[::SLOT_SIZE]
    at = -1
    for _ in range(k + 1):
        at = tags.index(0, at + 1)
    return at


class Worker:
    """The daemon thread between the hot-path buffer and a sink."""

    def __init__(self, recorder: Recorder, sink: Sink, interval_s: float,
                 resolve: Callable[[list[Any]], list[Any]] | None = None,
                 sample: Callable[[], dict[str, Any] | None] | None = None) -> None:
        self.recorder = recorder
        self.sink = sink
        self.interval_s = interval_s
        self.resolve = resolve  # device-event resolution: returns the records ready to go
        self.sample = sample  # readings for the metrics (`samples.Sampler`), once a drain
        # Records move as slots (`drain_packed`) when the recorder packs and the sink takes them.
        self.packed = bool(getattr(recorder, "packing", False)) and hasattr(sink, "send_packed")
        self._wake = threading.Event()
        self._anchor = Anchor()
        self._stop = False
        #: Held while a drain runs (`otel_train.bench.switches.held` holds it to keep drains off).
        self.busy = threading.Lock()
        self._overflow_said = False
        #: Packed chunks (count, slots, side) held for their side records' device events, in order.
        self._held: deque[tuple[int, bytes, list[Any]]] = deque()
        self._held_records = 0
        self._thread = threading.Thread(target=self._run, name="otel_train-worker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def cpu_ns(self) -> int:
        """CPU time this worker thread has used (0 before it started)."""
        ident = self._thread.ident
        if ident is None or not self._thread.is_alive():
            return 0
        try:
            return time.clock_gettime_ns(time.pthread_getcpuclockid(ident))
        except (OSError, AttributeError):
            return 0

    def _run(self) -> None:
        pacer = DrainPacer(self.interval_s, self.recorder.cap, time.monotonic(), self.recorder.dropped)
        while not self._stop:
            self._wake.wait(pacer.wait)
            self._wake.clear()
            if self._stop:
                break
            moved = self.drain()
            pacer.capacity = self.capacity()
            pacer.drained(moved, self.recorder.dropped, time.monotonic())

    def capacity(self) -> int:
        """Records that may wait before the worker must drain: the buffer's, or fewer while a
        device is timed, whose events (two a record, from a pool of 4,096) come back only once
        resolved. At the flush interval (2 s) a launch-bound loop (~8 events a 4.5 ms step) had
        most of the pool out between drains, and a faster one ran it dry (regions skipped)."""
        cap = self.recorder.cap
        events = getattr(self.resolve, "record_capacity", None)
        in_flight = events() if events is not None else 0
        return min(cap, in_flight) if in_flight else cap

    def drain(self, final_deadline: float | None = None) -> int:
        """Move everything in the buffer to the sink; returns how many records went.

        With a `resolve` hook (device timing), records whose device events are still pending
        stay parked in it: the buffer is emptied regardless (the hook bounds what it parks) and
        the hook is asked again on every drain. `final_deadline` (shutdown) releases them all.
        """
        moved = 0
        with self.busy:
            offset = self._anchor(self.recorder.clock)  # one time base for the run (`Anchor`)
            # What is in the buffer now; what the loop records meanwhile waits for the next
            # drain. Chasing it, a drain whose slices each took a while (an export call per
            # slice in thread mode) went on for as long as training did, a few records a slice.
            left = self.recorder.pending() if final_deadline is None else sys.maxsize
            if self.sample is not None:
                self._send_sample()  # first: the steps drained now may need it (6·N·tokens)
            while True:
                count, sent = self._slice(left, offset)
                moved += sent
                left -= count
                if not count:
                    break
                time.sleep(0)  # hand the GIL back to the training thread between slices
            if final_deadline is not None and self._held:
                moved += self._release_held(final_deadline, offset)
            flush = getattr(self.resolve, "flush", None) if final_deadline is not None else None
            if flush is not None:
                rest = flush(final_deadline)
                if rest:
                    moved += self._send(rest, offset)
            drained = getattr(self.sink, "drained", None)
            if drained is not None:
                try:
                    drained()
                except Exception as err:  # noqa: BLE001 - never let the worker die
                    _log.warning("otel_train: exporting failed: %s", err)
        return moved

    def _slice(self, left: int, offset: int) -> tuple[int, int]:
        """One slice of a drain, at most `left` records: (records taken from the buffer,
        records handed to the sink; fewer where device events are still pending)."""
        if self.packed:
            count, slots, side = self.recorder.drain_packed(min(_PACKED_SLICE, left))
            # Asked after the drain: a record with events was recorded after a device was chosen.
            if self.resolve is None or (not self._held and self.resolve.idle()):
                return count, self._send_packed(count, slots, side, offset)
            return count, self._resolve_packed(count, slots, side, offset)
        raw = self.recorder.drain(min(_SLICE, left))
        batch = raw if self.resolve is None else self.resolve(raw)
        return len(raw), self._send(batch, offset) if batch else 0

    def _resolve_packed(self, count: int, slots: bytes, side: list[Any], offset: int, final: bool = False) -> int:
        """Device timing on the packed path: slots move as they lie; only the side records with
        events are resolved (`DeviceResolver.ready`), in place. A chunk is held from its first
        side record whose events are pending, so a step never overtakes its phases. Returns the
        records handed to the sink."""
        held, resolve = self._held, self.resolve
        if count:
            held.append((count, slots, side))
            self._held_records += count
        sent = 0
        while held:
            count, slots, side = held[0]
            ready = resolve.release(side) if final else resolve.ready(side, self._held_records)  # type: ignore[union-attr]
            if ready == len(side):
                held.popleft()
                self._held_records -= count
                sent += self._send_packed(count, slots, side, offset)
                continue
            at = _side_slot(slots, ready)  # the slot of the first record still waiting
            if at:
                size = at * SLOT_SIZE
                sent += self._send_packed(at, slots[:size], side[:ready], offset)
                held[0] = (count - at, slots[size:], side[ready:])
                self._held_records -= at
            break
        resolve.tidy()  # type: ignore[union-attr]
        return sent

    def _release_held(self, deadline: float, offset: int) -> int:
        """Shutdown: wait a little for the held records' events, then send them all."""
        sent = 0
        until = min(time.monotonic() + _FLUSH_WAIT_S, deadline - 0.25)
        while self._held and time.monotonic() < until:
            time.sleep(0.001)
            sent += self._resolve_packed(0, b"", [], offset)
        if self._held:
            sent += self._resolve_packed(0, b"", [], offset, final=True)
        return sent

    def _send_packed(self, count: int, slots: bytes, side: list[Any], offset: int) -> int:
        if not count:
            return 0
        self._say_overflow()
        wire = None
        if any(type(record) is not tuple for record in side):  # force-ended at shutdown
            wire = [type(record) is not tuple for record in side]
            side = [record if type(record) is tuple else to_wire(record, offset) for record in side]
        try:
            self.sink.send_packed(count, slots, side, wire, self.recorder.strings, offset,  # type: ignore[attr-defined]
                                  {"buffer_full": self.recorder.dropped})
        except Exception as err:  # noqa: BLE001 - never let the worker die
            _log.warning("otel_train: exporting %d records failed: %s", count, err)
        return count

    def _send_sample(self) -> None:
        try:
            values = self.sample()  # type: ignore[misc]
            if values:
                self.sink.send([(True, [sample_wire(values, time.time_ns())])], 0,
                               {"buffer_full": self.recorder.dropped})
        except Exception as err:  # noqa: BLE001 - never let the worker die
            _log.warning("otel_train: sending the device readings failed: %s", err)

    def _say_overflow(self) -> None:
        if self.recorder.dropped and not self._overflow_said:
            self._overflow_said = True
            _log.warning("otel_train: the buffer of %d records overflowed; the oldest are being dropped "
                         "(counted in otel_train.spans.dropped and at shutdown). %s", self.recorder.cap,
                         getattr(self.sink, "overflow_hint", lambda: "")())

    def _send(self, batch: list[Any], offset: int) -> int:
        self._say_overflow()
        plain = [type(record) is tuple for record in batch]
        if all(plain):
            segments: Segments = [(False, batch)]
        else:
            segments = []
            for record, is_plain in zip(batch, plain):
                is_wire = not is_plain
                if not segments or segments[-1][0] != is_wire:
                    segments.append((is_wire, []))
                segments[-1][1].append(to_wire(record, offset) if is_wire else record)
        try:
            self.sink.send(segments, offset, {"buffer_full": self.recorder.dropped})
        except Exception as err:  # noqa: BLE001 - never let the worker die
            _log.warning("otel_train: exporting %d records failed: %s", len(batch), err)
        return len(batch)

    def stop(self, deadline: float) -> dict[str, int] | None:
        """Final drain and sink close, bounded by `deadline` (time.monotonic seconds).

        Returns the sink's final counts, or None if an exporter on a thread of this process is
        still blocked at the deadline (then `pending()` records were never sent).
        """
        self._stop = True
        self._wake.set()
        result: dict[str, int] = {}

        def finish() -> None:
            self._thread.join()
            result.update(self._close(deadline))

        closer = threading.Thread(target=finish, name="otel_train-shutdown", daemon=True)
        try:
            closer.start()
        except RuntimeError:
            # Python 3.12+ starts no thread at interpreter exit (`_runtime._at_exit`): close here,
            # the worker's join bounded instead (the drain and the sink's close bound themselves).
            return self._close(deadline) if self._joined(self._thread, deadline) else None
        return result if self._joined(closer, deadline) else None

    def _close(self, deadline: float) -> dict[str, int]:
        """The final drain and the sink's close, once the worker thread has ended."""
        self.drain(final_deadline=deadline)
        return self.sink.close(deadline)

    def _joined(self, thread: threading.Thread, deadline: float) -> bool:
        """Whether `thread` ended by `deadline`, or soon after the sink's abort unblocked it."""
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if thread.is_alive() and self.sink.abort():
            thread.join(timeout=1.0)  # the abort unblocked it: collect the counts
        return not thread.is_alive()

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Drain now and wait until the sink has exported it all (benchmarks and tests only);
        on the main thread, detection's calls that wait run first (`recorder.settle`)."""
        recorder.settle()
        self.drain()
        return self.sink.wait_idle(timeout_s)

    def pending(self) -> int:
        return self.recorder.pending()
