"""Where the worker hands records: the exporter process (default) or a pipeline on its own thread.

- `ProcessSink` (default): the records go over a pipe (`pipe`) to a per-rank exporter process
  (`exporter_process`); span building, OTLP encoding and network I/O never compete with
  training for the GIL. If that process cannot start or dies, the sink falls back to a
  `LocalSink` and says so.
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
from collections.abc import Callable, Mapping
from typing import Any, Protocol

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
        payload = dumps(message)
        try:
            with self._lock:
                stdin = self.proc.stdin
                stdin.write(FRAME.pack(len(payload)))  # type: ignore[union-attr]
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
