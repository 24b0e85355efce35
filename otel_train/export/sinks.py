"""Where the worker hands records: the exporter process (default) or a pipeline on its own thread.

- `ProcessSink` (default): the records go over a pipe (`pipe`) to a per-rank exporter process
  (`exporter_process`); span building, OTLP encoding and network I/O never compete with
  training for the GIL. Until that process says it is ready, records wait here (bounded by the
  buffer size), so a process slow to start (a loaded node, where it runs at low priority)
  costs nothing: at shutdown it gets most of the bound to become ready; if it still is not, it
  is stopped and this process exports what waited itself. If it dies, the sink falls back to
  a `LocalSink`, says so, and counts what the process held as lost.
- `LocalSink`: the `ExportPipeline` runs right here on the worker thread (needed when the
  user installs their own in-process span processors).

(The exporters the pipeline ends in, OTLP or files, are `exporters`.)
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from otel_train.export.destination import ExportSetup
from otel_train.export.pipe import FRAME, Segments, dumps, segments_count
from otel_train.record.recorder import unpack

_log = logging.getLogger("otel_train")
_PIPE_BYTES = 1 << 20
#: Set in the exporter process's environment: it must never instrument itself.
ENV_CHILD = "OTEL_TRAIN_EXPORTER_CHILD"


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


class LocalSink:
    """Runs the export pipeline on the worker thread."""

    def __init__(self, pipeline: Any) -> None:
        self.pipeline = pipeline

    def send(self, segments: Segments, offset: int, dropped: Mapping[str, int]) -> None:
        self.pipeline.feed(segments, offset, dropped, export=False)

    def apply(self, message: tuple[Any, ...]) -> None:
        """A message meant for the exporter process (`pipe`), taken here instead."""
        self.pipeline.apply(message)

    def drained(self) -> None:
        """The end of a drain: its spans are encoded and handed to delivery (its own thread)."""
        self.pipeline.export_pending()

    def close(self, deadline: float) -> dict[str, int]:
        return self.pipeline.shutdown(deadline)

    def partial_stats(self) -> dict[str, int]:
        """At a shutdown cut short: what is confirmed exported, the rest of what was built as failed."""
        stats = self.pipeline.stats()
        return {"exported": stats["exported"], "overflow": stats["overflow"],
                "failed": max(0, stats["built"] - stats["exported"] - stats["overflow"]),
                "unconfirmed": stats.get("unconfirmed", 0) + stats.get("sending", 0)}

    def abort(self) -> bool:
        return False  # work on this thread cannot be interrupted (delivery's own calls are bounded)

    def wait_idle(self, timeout_s: float) -> bool:
        return self.pipeline.wait_idle(timeout_s)


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
    # gRPC's own log lines (one per failed TLS handshake, per reconnect, even at ERROR) would
    # repeat what our one message says; this process's gRPC is ours alone, so the user's
    # GRPC_VERBOSITY (meant for their own gRPC) does not apply here.
    env["GRPC_VERBOSITY"] = "NONE"
    # `opentelemetry-instrument` injects a sitecustomize through PYTHONPATH; the exporter must
    # not instrument itself (it would trace its own exports).
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
             if p and "auto_instrumentation" not in p]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


#: The share of the shutdown bound a still-starting exporter process gets to become ready.
_START_SHARE = 0.6


class ProcessSink:
    """Feeds a per-rank exporter process through its stdin; reads its progress from stdout.

    Counts, for the closing line: `sent` records written to the process; what it reports back
    (`progress`: received, built, exported, failed, overflow, held); `lost` records that could
    not be written (aborted at the shutdown bound); `overflowed` records that waited past the
    capacity before it was ready."""

    def __init__(self, setup: ExportSetup, fallback: Callable[[], LocalSink]) -> None:
        self._fallback_factory = fallback
        self._priority = setup.config.exporter_priority
        self._capacity = setup.config.buffer_size
        self._fallback: LocalSink | None = None
        self._aborted = False
        self.killed = False  # at the shutdown bound, still exporting (stopped, starved of CPU)
        self.took_over = False  # exported from this process: the exporter process was never ready
        self.sent = 0
        self.given = 0  # records handed to this sink, whatever became of them
        self.lost = 0
        self.overflowed = 0
        self._strings_sent = 0  # how much of the recorder's string table went into messages
        self._strings_written = 0  # ... into messages the process got
        self._strings: list[str] = []  # the recorder's table (it only grows)
        self.progress: dict[str, int] = {}
        self._at_death: dict[str, int] | None = None  # its last progress, when it died mid-run
        self._flushes = 0
        self._lock = threading.Lock()  # one writer at a time; guards the waiting messages
        self._waiting: deque[tuple[tuple[Any, ...], int]] = deque()  # (message, records) before ready
        self._waiting_records = 0
        self.ready = threading.Event()
        self._reported = threading.Condition()  # notified at each progress report and at EOF
        self._eof = False
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "otel_train.export.exporter_process", self._priority],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_child_env(), close_fds=True)
        _widen_pipe(self.proc.stdin)
        self._reader = threading.Thread(target=self._read_progress, name="otel_train-exporter-reader",
                                        daemon=True)
        self._reader.start()
        self._write(("setup", setup))

    # -- records in ----------------------------------------------------------------------
    def send(self, segments: Segments, offset: int, dropped: Mapping[str, int]) -> None:
        if self._fallback is not None:
            self.given += segments_count(segments)
            self._fallback.send(segments, offset, dropped)
            return
        self._deliver(("batch", segments, offset, dict(dropped)), segments_count(segments))

    def send_packed(self, count: int, slots: bytes, side: list[Any], wire: list[bool] | None,
                    strings: list[str], offset: int, dropped: Mapping[str, int]) -> None:
        """`count` records as `RecorderBase.drain_packed` gave them; `strings` is the recorder's
        table, which only grows: the process gets what it has not had yet with them."""
        self._strings = strings
        if self._fallback is not None:
            self.given += count
            self._fallback.send(unpack(slots, side, wire, strings), offset, dropped)
            return
        new = strings[self._strings_sent:]
        self._strings_sent += len(new)
        self._deliver(("packed", slots, side, wire, new, offset, dict(dropped)), count)

    def drained(self) -> None:
        if self._fallback is not None:  # the exporter process coalesces requests itself
            self._fallback.drained()
        elif self._waiting and self.ready.is_set():
            self._deliver(None, 0)

    def _deliver(self, message: tuple[Any, ...] | None, count: int) -> None:
        """Write `message` (None: only what waits) to the process, in order after what waits for
        it to be ready; before it is, keep it, dropping the oldest past the capacity."""
        with self._lock:
            if message is not None:
                self.given += count
                self._waiting.append((message, count))
                self._waiting_records += count
                self._trim()
            if not self.ready.is_set():
                return
            while self._waiting and self._fallback is None:
                message, count = self._waiting[0]
                if not self._write_locked(message):
                    if self._fallback is None:  # aborted at the shutdown bound
                        self.lost += self._waiting_records
                        self._waiting.clear()
                        self._waiting_records = 0
                    break
                self._waiting.popleft()
                self._waiting_records -= count
                self.sent += count
                if message[0] == "packed":
                    self._strings_written += len(message[4])
            if self._fallback is not None:
                self._replay_into_fallback()

    def _trim(self) -> None:
        """Past the capacity, drop the oldest waiting messages, counted; the strings they brought
        stay (the slots after them refer to them), in one `("strings", ...)` message at the head."""
        carried: list[str] = []
        while self._waiting_records > self._capacity and len(self._waiting) > 1:
            message, count = self._waiting.popleft()
            self._waiting_records -= count
            self.overflowed += count
            if message[0] == "packed":
                carried.extend(message[4])
            elif message[0] == "strings":
                carried.extend(message[1])
        if carried:
            self._waiting.appendleft((("strings", carried), 0))

    # -- the end -------------------------------------------------------------------------
    def close(self, deadline: float) -> dict[str, int]:
        # Still starting: it has done part of the imports taking over would redo here, so it
        # gets most of the bound first; only past that does this process take over.
        if self._fallback is None and not self.ready.wait(max(0.0, (deadline - time.monotonic()) * _START_SHARE)):
            self._take_over()
        if self._fallback is not None:
            with self._lock:
                self._replay_into_fallback()
            stats = self._fallback.close(deadline)
            self._add_losses(stats)
            stats["overflow"] = stats.get("overflow", 0) + self.overflowed
            return stats
        self._deliver(None, 0)
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
            self.killed = True  # said in the closing line
        self._reader.join(timeout=0.5)
        stats = dict(self.progress)
        if stats.get("final"):
            stats["failed"] = stats.get("failed", 0) + self.unacknowledged() + self.lost
        else:  # killed at the bound: whatever it had not exported is lost, and said so
            stats["failed"] = stats.get("failed", 0) + self._lost_in_process(stats) + self.lost
            stats["killed"] = 1
            # Whatever it held past its last report it may have sent meanwhile: the collector
            # may have any of it (a bound, not a guess: the receiver holds at most exported +
            # unconfirmed).
            stats["unconfirmed"] = stats.get("unconfirmed", 0) + self._lost_in_process(stats)
        stats["failed"] += self._waiting_records  # never written: it was not ready in time
        stats["overflow"] = stats.get("overflow", 0) + self.overflowed
        return stats

    def _take_over(self) -> None:
        """The process never became ready (a loaded node starves it at low priority): it has
        nothing but its setup, so stop it and export what waited from here, where training
        no longer runs. No record is sent twice."""
        self.proc.kill()
        self.proc.wait()
        self._reader.join(timeout=0.5)
        self.took_over = True
        _log.info("otel_train: the exporter process was not ready by shutdown; exporting from the training "
                  "process instead.")
        self._fallback = self._fallback_factory()

    def _replay_into_fallback(self) -> None:
        """What waited for the process, into the fallback, in order (the lock is held)."""
        assert self._fallback is not None
        while self._waiting:
            message, count = self._waiting.popleft()
            self._waiting_records -= count
            try:
                self._fallback.apply(message)
            except Exception as err:  # noqa: BLE001 - never let shutdown fail
                self.lost += count
                _log.warning("otel_train: exporting %d records failed: %s", count, err)

    def _add_losses(self, stats: dict[str, int]) -> None:
        """A fallback's counts, plus what the dead process held and what never reached it."""
        stats["failed"] = stats.get("failed", 0) + self.lost
        if self._at_death is not None:
            stats["exported"] = stats.get("exported", 0) + self._at_death.get("exported", 0)
            stats["failed"] += self._lost_in_process(self._at_death) + self._at_death.get("failed", 0)
            stats["overflow"] = stats.get("overflow", 0) + self._at_death.get("overflow", 0)

    def _lost_in_process(self, progress: Mapping[str, int]) -> int:
        """What the process got and did not export, by its last report: records sent that it had
        not read, spans built and not exported, steps still held."""
        accounted = progress.get("exported", 0) + progress.get("failed", 0) + progress.get("overflow", 0)
        return (max(0, self.sent - progress.get("received", 0)) + max(0, progress.get("built", 0) - accounted)
                + progress.get("held", 0))

    def partial_stats(self) -> dict[str, int]:
        """At a shutdown cut short (the closer still busy): what is confirmed exported by the last
        report (its fallback's too), and everything else this sink was given as failed."""
        with self._reported:
            progress = dict(self._at_death or self.progress)
        exported = progress.get("exported", 0)
        overflow = progress.get("overflow", 0) + self.overflowed
        if self._fallback is not None:
            local = self._fallback.partial_stats()
            exported += local["exported"]
            overflow += local["overflow"]
        failed = max(0, self.given - exported - overflow)
        # What the process held past its last report it may have sent meanwhile (see `close`).
        held = max(0, failed - self._waiting_records - self.lost)
        return {"exported": exported, "overflow": overflow, "failed": failed,
                "unconfirmed": progress.get("unconfirmed", 0) + (held if self._fallback is None else 0)}

    def abort(self) -> bool:
        self._aborted = True
        if self._fallback is not None:
            return False
        self.proc.kill()  # any write blocked on the full pipe now fails at once
        self.killed = True
        return True

    # -- what it says --------------------------------------------------------------------
    def overflow_hint(self) -> str:
        """Why the buffer may have overflowed, for the worker's one warning."""
        if not self.ready.is_set():
            return "The exporter process is still starting (a busy node?)."
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
        end = time.monotonic() + timeout_s
        if not self.ready.wait(timeout_s):
            return False
        self._deliver(None, 0)
        if self._fallback is not None:
            return self._fallback.wait_idle(max(0.0, end - time.monotonic()))
        self._flushes += 1
        token = self._flushes
        if not self._write(("flush", token, max(0.0, end - time.monotonic()))):
            return self._fallback is not None
        with self._reported:
            return self._reported.wait_for(
                lambda: self.progress.get("flushed", 0) >= token or self._eof, max(0.0, end - time.monotonic()),
            ) and self.progress.get("flushed", 0) >= token

    def unacknowledged(self) -> int:
        return max(0, self.sent - self.progress.get("received", 0))

    # -- the pipe ------------------------------------------------------------------------
    def _write(self, message: tuple[Any, ...]) -> bool:
        with self._lock:
            return self._write_locked(message)

    def _write_locked(self, message: tuple[Any, ...]) -> bool:
        payload = dumps(message)
        try:
            stdin = self.proc.stdin
            stdin.write(FRAME.pack(len(payload)))  # type: ignore[union-attr]
            stdin.write(payload)  # type: ignore[union-attr]
            stdin.flush()  # type: ignore[union-attr]
            return True
        except (BrokenPipeError, OSError, ValueError) as err:
            if self._fallback is None and message[0] not in ("shutdown", "setup") and not self._aborted:
                _log.warning("otel_train: the exporter process is gone (%s); exporting from a thread "
                             "in the training process instead (what it held is counted as lost).", err)
                self._at_death = dict(self.progress)
                self._fallback = self._fallback_factory()
                # The fallback reads packed slots with the whole string table, not message by message.
                self._fallback.apply(("strings", list(self._strings[:self._strings_written])))
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
                    if progress.get("ready"):
                        self.ready.set()
                    self._reported.notify_all()
        finally:
            with self._reported:
                self._eof = True  # the process is gone: no flush will come
                self._reported.notify_all()
