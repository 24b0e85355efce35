"""The worker: drains the hot-path buffer off the training thread and hands records on.

It wakes every `flush_interval_ms` (sooner while records arrive fast enough to fill a quarter
of the buffer in less: `next_wait`), drains in slices of `_SLICE` records and gives the GIL
back between slices (`time.sleep(0)`), so the training thread never waits long behind it.
Each slice becomes wire tuples, which go to a sink:

- `ProcessSink` (default): pickled to a per-rank exporter process (`_exporter_process`)
  over a pipe; span building, OTLP encoding and network I/O never compete with training
  for the GIL. If that process cannot start or dies, the sink falls back to a
  `LocalSink` and says so.
- `LocalSink`: the `ExportPipeline` runs right here on the worker thread (needed when the
  user installs their own in-process span processors).

With the exporter process, the recorder packs plain regions into slots (`_hotpath.c`, "the
packed ring") and a drain moves them as they lie (`drain_packed`, `ProcessSink.send_packed`):
one bytes object for a slice of slots, with the few other records (steps, tags, events) beside
it. Measured on the benchmark's small-step records: 106 ns of worker CPU a record, against 413
ns for popping, marshalling and freeing each record's tuple.

Device events (whose polling must stay in the training process) are resolved here before
a record is handed on; once device timing has chosen a device, records go unpacked.

What a sink gets, in recording order: runs of the hot path's plain tuples as they are, and
runs of the few records that are objects (with device events, or force-ended at shutdown)
already as wire tuples, with the perf-to-wall clock offset. Turning raw tuples into spans is
the exporter's work: every microsecond spent here is spent in the training process, twice
over through the GIL.
"""

from __future__ import annotations

import io
import json
import logging
import marshal
import numbers
import os
import pickle
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from otel_train.record.clock import wall_offset
from otel_train.record.recorder import Recorder, _hotpath, to_wire

_log = logging.getLogger("otel_train")
_SLICE = 256
#: Records a slice when they move as slots (`drain_packed`): only the side records among them
#: (a step's record, ~1 in 9 on the benchmark's small step) cost the worker per record.
_PACKED_SLICE = 2048
_MIN_WAIT_S = 0.02
_FIRST_WAIT_S = 0.25
_FRAME = struct.Struct("<I")
_PIPE_BYTES = 1 << 20
ENV_CHILD = "OTEL_TRAIN_EXPORTER_CHILD"


#: Records in order, as runs: `(False, hot-path tuples)` or `(True, wire tuples)`.
Segments = list[tuple[bool, list[tuple[Any, ...]]]]


def segments_count(segments: Segments) -> int:
    return sum(len(records) for _, records in segments)


class Sink(Protocol):
    def send(self, segments: Segments, offset: int, dropped: Mapping[str, int]) -> None:
        """Records (`Segments`) and the perf-to-wall offset of the hot-path tuples among them."""
        ...

    def close(self, deadline: float) -> dict[str, int]: ...

    def abort(self) -> bool:
        """Stop exporting at once (the shutdown bound is reached); True if that unblocks `close`."""
        ...

    def wait_idle(self, timeout_s: float) -> bool:
        """True once everything sent has been exported (False at the timeout)."""
        ...

    def drained(self) -> None:
        """The end of a worker drain, after its last `send` (optional: the worker looks for it)."""
        ...


def unpack(slots: bytes, side: list[Any], wire: list[bool] | None, strings: list[str]) -> Segments:
    """What `RecorderBase.drain_packed` gave (side records made wire where `wire` says so), back
    as `Segments`; `strings` is the recorder's table (or the exporter's copy of it)."""
    return _hotpath.unpack(slots, side, wire, strings)  # type: ignore[union-attr,no-any-return]


class LocalSink:
    """Runs the export pipeline on the worker thread."""

    def __init__(self, pipeline: Any) -> None:
        self.pipeline = pipeline

    def send(self, segments: Segments, offset: int, dropped: Mapping[str, int]) -> None:
        self.pipeline.feed(segments, offset, dropped, export=False)

    def drained(self) -> None:
        """The end of a drain: one export call for all its slices (one per full request)."""
        self.pipeline.export_pending()

    def close(self, deadline: float) -> dict[str, int]:
        return self.pipeline.shutdown(deadline)

    def abort(self) -> bool:
        return False  # an exporter call on this thread cannot be interrupted

    def wait_idle(self, timeout_s: float) -> bool:
        return True  # a drain exports before it returns


def _widen_pipe(pipe: Any) -> None:
    """Give the pipe to the exporter process room for a whole drain (Linux; 1 MiB is what an
    unprivileged process may ask for by default): with the default 64 KiB the worker blocked
    and woke several times a drain, and a drain cost it 0.67-0.71 µs of CPU a record on the
    small benchmark step instead of 0.57-0.65."""
    try:
        import fcntl

        fcntl.fcntl(pipe.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), _PIPE_BYTES)
    except (ImportError, OSError, ValueError):
        pass  # not Linux, or a lower limit: the default size works, a little less cheaply


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env[ENV_CHILD] = "1"
    # `opentelemetry-instrument` injects a sitecustomize through PYTHONPATH; the exporter must
    # not instrument itself (it would trace its own exports).
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
             if p and "auto_instrumentation" not in p]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


class ProcessSink:
    """Feeds a per-rank exporter process through its stdin; reads its progress from stdout."""

    def __init__(self, setup: Mapping[str, Any], fallback: Callable[[], LocalSink]) -> None:
        self._fallback_factory = fallback
        self._priority = setup["config"].get("exporter_priority", "low")
        self._fallback: LocalSink | None = None
        self._aborted = False
        self.sent = 0
        self.lost = 0
        self._strings_sent = 0  # how much of the recorder's string table the process has
        self.progress: dict[str, int] = {}
        self._flushes = 0
        self._lock = threading.Lock()
        self._reported = threading.Condition()  # notified at each progress report and at EOF
        self._eof = False
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "otel_train.export.exporter_process"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_child_env(), close_fds=True)
        _widen_pipe(self.proc.stdin)
        self._reader = threading.Thread(target=self._read_progress, name="otel_train-exporter-reader",
                                        daemon=True)
        self._reader.start()
        self._write(("setup", dict(setup)))

    def send(self, segments: Segments, offset: int, dropped: Mapping[str, int]) -> None:
        if self._fallback is not None:
            self._fallback.send(segments, offset, dropped)
            return
        count = segments_count(segments)
        if self._write(("batch", segments, offset, dict(dropped))):
            self.sent += count
        elif self._fallback is not None:
            self._fallback.send(segments, offset, dropped)
        else:
            self.lost += count  # aborted at the shutdown bound

    def send_packed(self, count: int, slots: bytes, side: list[Any], wire: list[bool] | None,
                    strings: list[str], offset: int, dropped: Mapping[str, int]) -> None:
        """`count` records as `RecorderBase.drain_packed` gave them; `strings` is the recorder's
        table, which only grows: the process gets what it has not had yet with them."""
        if self._fallback is None:
            new = strings[self._strings_sent:]
            if self._write(("packed", slots, side, wire, new, offset, dict(dropped))):
                self.sent += count
                self._strings_sent += len(new)
                return
            if self._fallback is None:
                self.lost += count  # aborted at the shutdown bound
                return
        self._fallback.send(unpack(slots, side, wire, strings), offset, dropped)

    def drained(self) -> None:
        if self._fallback is not None:  # the exporter process coalesces export calls itself
            self._fallback.drained()

    def close(self, deadline: float) -> dict[str, int]:
        if self._fallback is not None:
            stats = self._fallback.close(deadline)
            stats["failed"] = stats.get("failed", 0) + self.unacknowledged()
            return stats
        self._write(("shutdown", max(0.05, deadline - time.monotonic() - 0.2)))
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass
        try:
            self.proc.wait(timeout=max(0.01, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=0.5)
        stats = dict(self.progress)
        if not stats.get("final"):
            # Killed at the bound: whatever it had not exported is lost, and said so.
            stats["failed"] = max(0, self.sent - stats.get("exported", 0)) + self.lost
        else:
            stats["failed"] = stats.get("failed", 0) + self.unacknowledged() + self.lost
        return stats

    def abort(self) -> bool:
        self._aborted = True
        if self._fallback is not None:
            return False
        self.proc.kill()  # any write blocked on the full pipe now fails at once
        return True

    def overflow_hint(self) -> str:
        """Why the buffer may have overflowed, for the worker's one warning."""
        behind = self.unacknowledged()
        if not behind:
            return "Raise OTEL_TRAIN_BUFFER_SIZE, or lower OTEL_TRAIN_FLUSH_INTERVAL_MS, for this span rate."
        hint = f"The exporter process is {behind} records behind"
        if self._priority == "idle":
            hint += (": it runs at idle CPU priority and training leaves it no CPU time; "
                     "OTEL_TRAIN_EXPORTER_PRIORITY=low gives it a share")
        return hint + "."

    def cpu_ns(self) -> int:
        """CPU time the exporter process has used, as of its last progress report."""
        return int(self.progress.get("cpu_ns", 0))

    def wait_idle(self, timeout_s: float) -> bool:
        """Have the exporter process export everything sent to it, and wait until it has
        (benchmarks, tests)."""
        if self._fallback is not None:
            return True
        self._flushes += 1
        token = self._flushes
        if not self._write(("flush", token)):
            return self._fallback is not None
        with self._reported:
            return self._reported.wait_for(
                lambda: self.progress.get("flushed", 0) >= token or self._eof, timeout_s,
            ) and self.progress.get("flushed", 0) >= token

    def unacknowledged(self) -> int:
        return max(0, self.sent - self.progress.get("received", 0))

    def _write(self, message: tuple[Any, ...]) -> bool:
        payload = _dumps(message)
        try:
            with self._lock:
                stdin = self.proc.stdin
                stdin.write(_FRAME.pack(len(payload)))  # type: ignore[union-attr]
                stdin.write(payload)  # type: ignore[union-attr]
                stdin.flush()  # type: ignore[union-attr]
            return True
        except (BrokenPipeError, OSError, ValueError) as err:
            if self._fallback is None and message[0] != "shutdown" and not self._aborted:
                _log.warning("otel_train: the exporter process is gone (%s); exporting from a thread "
                             "in the training process instead.", err)
                self._fallback = self._fallback_factory()
            return False

    def _read_progress(self) -> None:
        try:
            for line in self.proc.stdout:  # type: ignore[union-attr]
                try:
                    progress = json.loads(line)
                except ValueError:
                    continue
                with self._reported:
                    self.progress = progress
                    self._reported.notify_all()
        finally:
            with self._reported:
                self._eof = True  # the process is gone: no flush will come
                self._reported.notify_all()


class _WirePickler(pickle.Pickler):
    """Pickles records as they are, except what the exporter process must not receive.

    The C pickler consults `reducer_override` only for objects that are not plain str, int,
    float, bool, None, bytes, tuple, list, dict or set, so the usual record costs nothing
    extra. What does reach it: a class not in builtins (a span's `exc`: its name goes), a number
    of another type (numpy, IntEnum: as int or float), anything else (a tensor would be copied
    whole, or its `str()` would sync the device) as a short description, which the exporter
    records as a string.
    """

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, type):
            if obj.__module__ == "builtins":
                return NotImplemented  # ValueError, or the `str` of a reduction made here: by reference
            return str, (obj.__name__,)  # a user's exception class: the exporter cannot import it
        if isinstance(obj, numbers.Integral):
            return int, (int(obj),)
        if isinstance(obj, numbers.Real):
            return float, (float(obj),)
        if isinstance(obj, (tuple, list)):  # torch.Size, a namedtuple: the exporter has neither
            return tuple, (tuple(obj),)
        from otel_train.export.spans import _describe  # only when such a value appears
        return str, (_describe(obj),)


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


#: The first byte of a message to the exporter process: how the rest is serialised. Marshal
#: when the message holds only what marshal writes (the usual batch of hot-path tuples: 0.20-0.28
#: against 0.33-0.37 µs a record pickled, in the training process, where the worker pays it);
#: pickle otherwise. (Here, not in `_exporter_process`, which runs as `python -m`: imported by
#: the package first, runpy would warn.)
FORMAT_MARSHAL = b"M"
FORMAT_PICKLE = b"P"


def loads(payload: bytes) -> Any:
    """A message from `_dumps` (read by the exporter process)."""
    body = memoryview(payload)[1:]
    return marshal.loads(body) if payload[:1] == FORMAT_MARSHAL else pickle.loads(body)


def _dumps(message: tuple[Any, ...]) -> bytes:
    """A message for the exporter process (read back by `loads`). Marshal takes the usual
    batch (str, int, float, None, tuples, lists, dicts) and refuses anything else, such as an
    exception class, a tensor or a numpy number; `_WirePickler` converts those."""
    try:
        return FORMAT_MARSHAL + marshal.dumps(message)
    except ValueError:
        out = io.BytesIO()
        out.write(FORMAT_PICKLE)
        _WirePickler(out, pickle.HIGHEST_PROTOCOL).dump(message)
        return out.getvalue()


class Worker:
    """The daemon thread between the hot-path buffer and a sink."""

    def __init__(self, recorder: Recorder, sink: Sink, interval_s: float,
                 resolve: Callable[[list[Any]], list[Any]] | None = None) -> None:
        self.recorder = recorder
        self.sink = sink
        self.interval_s = interval_s
        self.resolve = resolve  # device-event resolution: returns the records ready to go
        # Records move as slots (`drain_packed`) when the recorder packs and the sink takes them.
        self.packed = bool(getattr(recorder, "packing", False)) and hasattr(sink, "send_packed")
        self._wake = threading.Event()
        self._stop = False
        self._busy = threading.Lock()
        self._overflow_said = False
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
            pacer.drained(moved, self.recorder.dropped, time.monotonic())

    def drain(self, final_deadline: float | None = None) -> int:
        """Move everything in the buffer to the sink; returns how many records went.

        With a `resolve` hook (device timing), records whose device events are still pending
        stay parked in it: the buffer is emptied regardless (the hook bounds what it parks) and
        the hook is asked again on every drain. `final_deadline` (shutdown) releases them all.
        """
        moved = 0
        with self._busy:
            offset = wall_offset(self.recorder.clock)
            # What is in the buffer now; what the loop records meanwhile waits for the next
            # drain. Chasing it, a drain whose slices each took a while (an export call per
            # slice in thread mode) went on for as long as training did, a few records a slice.
            left = self.recorder.pending() if final_deadline is None else sys.maxsize
            while True:
                count, sent = self._slice(left, offset)
                moved += sent
                left -= count
                if not count:
                    break
                time.sleep(0)  # hand the GIL back to the training thread between slices
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
        if self._packs():
            count, slots, side = self.recorder.drain_packed(min(_PACKED_SLICE, left))
            if self._packs():
                return count, self._send_packed(count, slots, side, offset)
            # A device was chosen meanwhile: what was drained goes through its resolver.
            raw = [record for _, records in unpack(slots, side, None, self.recorder.strings) for record in records]
        else:
            raw = self.recorder.drain(min(_SLICE, left))
        batch = raw if self.resolve is None else self.resolve(raw)
        return len(raw), self._send(batch, offset) if batch else 0

    def _packs(self) -> bool:
        """Whether records move as slots now: packing, and no device events to wait for (a CPU
        run, or device timing has not chosen a device yet)."""
        return self.packed and (self.resolve is None or self.resolve.idle())

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
            self.drain(final_deadline=deadline)
            result.update(self.sink.close(deadline))

        closer = threading.Thread(target=finish, name="otel_train-shutdown", daemon=True)
        closer.start()
        closer.join(timeout=max(0.0, deadline - time.monotonic()))
        if closer.is_alive() and self.sink.abort():
            closer.join(timeout=1.0)  # the abort unblocked it: collect the counts
        if closer.is_alive():
            return None
        return result

    def held(self) -> Any:
        """Keep this worker from draining while the block runs: records wait in the buffer
        (benchmarks only: `otel-train bench overhead` times the hot path alone with it)."""
        return self._busy

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Drain now and wait until the sink has exported it all (benchmarks and tests only)."""
        self.drain()
        return self.sink.wait_idle(timeout_s)

    def pending(self) -> int:
        return self.recorder.pending()
