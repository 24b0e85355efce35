"""The per-rank exporter process: reads wire records from stdin, exports spans and metrics.

Started by the training process (`sinks.ProcessSink`); never imports torch, nor the training
hot path (`otel_train.record`) but its C module's `unpack`. Messages are length-prefixed, a format byte then a marshal or
pickle of a tuple (`pipe`): `("setup", ExportSetup)`, then `("batch", segments, offset, dropped
totals)` or `("packed", slots, side records, wire flags, new strings, offset, dropped totals)`…,
then `("shutdown", seconds)`. End of input (the trainer died) is a shutdown too. Once its
pipeline is built it says it is ready; after that, whenever it has caught up with its input and
after every flush, it writes one JSON line of progress to stdout, which the trainer reads to
report exactly what was lost if it has to kill this process at the shutdown bound.

It lowers its CPU priority before anything else, ignores SIGINT, and survives SIGTERM (a
`torchrun` stop signals the whole process group): the trainer's shutdown, or the end of its
input, ends it. A SIGTERM makes it export everything at once instead of on its schedule.
"""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import sys
import threading
import time
from typing import Any

from otel_train.export.pipe import FRAME, loads, segments_count

_NICE = 10
#: Full requests held back while more input is waiting (a drain's later slices), at most.
_HELD_REQUESTS = 8
#: sizeof(Slot) (`wire/slots.h`): a packed message's records, when it cannot be read otherwise.
_SLOT_BYTES = 72


def _read_exact(fd: int, size: int) -> bytes | None:
    chunks = []
    while size:
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _read(fd: int) -> Any:
    # Unbuffered reads: `_more_input` can then trust select() to see everything still waiting.
    header = _read_exact(fd, FRAME.size)
    if header is None:
        return None
    payload = _read_exact(fd, FRAME.unpack(header)[0])
    return None if payload is None else loads(payload)


def _more_input(fd: int, wait_s: float = 0.0) -> bool:
    return bool(select.select([fd], [], [], wait_s)[0])


_report_lock = threading.Lock()


def _report(stats: dict[str, Any], unless: threading.Event | None = None) -> None:
    with _report_lock:
        if unless is not None and unless.is_set():
            return  # the final report is being written: no older one after it
        try:
            sys.stdout.write(json.dumps(stats) + "\n")
            sys.stdout.flush()
        except (BrokenPipeError, OSError):
            os._exit(0)  # the trainer is gone and nobody reads: nothing left to report to


def _report_while(pipeline: Any, done: threading.Event, every_s: float = 0.05) -> None:
    """Report progress whenever it changes until `done` (the shutdown's delivery)."""
    last: dict[str, Any] = {}
    while not done.wait(every_s):
        try:
            stats = pipeline.stats()
        except Exception:  # noqa: BLE001 - read while delivery changes it: the next try
            continue
        if stats != last:
            last = stats
            _report({**stats, "ready": 1}, unless=done)


def _watch_parent(timeout_s: float) -> None:
    """If the trainer dies, finish within its shutdown bound instead of lingering in an export
    (the end of input starts that shutdown; this bounds it)."""
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.5)
    time.sleep(timeout_s + 1.0)
    os._exit(0)


def lower_priority(priority: str) -> None:
    """Yield the CPU to training: export can wait, a step cannot.

    `low` is nice +10. `idle` is Linux's SCHED_IDLE: the scheduler runs this process only on
    CPU time nothing else wants, and a training thread that wakes up preempts it at once.
    Measured here against a background load of 8 % of a core on the 2.5 ms benchmark step:
    +6.4 % step time at nice +10, +4.9 % at nice +19, -0.9 % (noise) at SCHED_IDLE. It is
    not the default because it can starve: with every core busy (other ranks, data-loading
    workers) it barely runs, before and during shutdown too, and what it could not export
    in the shutdown bound is lost (counted and reported). An unprivileged process cannot
    leave SCHED_IDLE again, so it cannot raise itself when it falls behind.
    """
    if priority == "normal":
        return
    try:
        os.nice(_NICE)
        if priority == "idle" and hasattr(os, "SCHED_IDLE"):
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except OSError:
        pass  # left at what could be set: still correct, only less polite


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    # First of all: the imports below are most of what starting costs, and training must not pay
    # for it (`lower_priority`). The trainer passes the priority on the command line for this.
    lower_priority(args[0] if args else "low")
    # Ctrl-C reaches the whole process group, and so does torchrun's SIGTERM (os.killpg): the
    # trainer decides when we stop (its shutdown message, or the end of our input if it dies), and
    # until then we must not die with what we hold. SIGTERM only makes us export at once.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    wake = _wake_on_sigterm()
    stdin = sys.stdin.fileno()
    first = _read(stdin)
    if first is None or first[0] != "setup":
        return 1
    setup = first[1]
    from otel_train.export.pipeline import ExportPipeline  # the SDK and gRPC, once the setup has come

    cfg = setup.config
    timeout_s = float(cfg.shutdown_timeout_s)
    threading.Thread(target=_watch_parent, args=(timeout_s,), daemon=True).start()
    pipeline = ExportPipeline(setup)
    # Everything imported and built so far lives as long as this process: keep the garbage
    # collector from scanning it again on every collection (gRPC and protobuf are large).
    gc.freeze()
    # Spans are encoded and handed to delivery every `export_delay_ms` (OTEL_BSP_SCHEDULE_DELAY),
    # when a full request is ready, on a flush, at a SIGTERM and at shutdown: a request has a
    # fixed cost of 0.4-1.4 ms of CPU here, which at one per trainer drain was most of what the
    # exporter cost a slow step rate.
    delay_s = cfg.export_delay_ms / 1000.0
    full = cfg.export_batch_size
    next_export = time.monotonic() + delay_s
    flushed = 0

    def export() -> float:
        """Hand what is pending to delivery; returns when the next export is due."""
        try:
            pipeline.export_pending()
        except Exception as err:  # noqa: BLE001 - this process must outlive any input
            _unreadable(pipeline, len(getattr(pipeline, "_pending", ())), "building a request", err)
            getattr(pipeline, "_pending", []).clear()
        return time.monotonic() + delay_s

    def report() -> None:
        _report({**pipeline.stats(), "ready": 1, "flushed": flushed, "cpu_ns": time.process_time_ns()})

    report()  # ready: the trainer sends records from now on
    while True:
        wait = max(0.0, next_export - time.monotonic()) if pipeline.pending() else None
        ready = _wait_input(stdin, wake, wait)
        if wake in ready:
            _drain_wake(wake)
            delay_s = 0.0  # stopping: everything goes out as soon as it comes in
            next_export = export()
            report()
        if stdin not in ready:
            if pipeline.pending() and time.monotonic() >= next_export:
                next_export = export()
                report()
            continue
        message = _read(stdin)
        if message is None or message[0] == "shutdown":
            budget = timeout_s if message is None else float(message[1])
            # Progress while delivery retries to the end: if this process is killed at the
            # bound (starved of CPU, stopped), the trainer counts from its last report, and each
            # request the collector took must be in it.
            done = threading.Event()
            threading.Thread(target=_report_while, args=(pipeline, done), daemon=True).start()
            try:
                stats = pipeline.shutdown(time.monotonic() + budget)
            except Exception as err:  # noqa: BLE001 - the final report must still go out
                _unreadable(pipeline, 0, "shutting down", err)
                stats = pipeline.stats()
            finally:
                done.set()
            _report({**stats, "ready": 1, "final": 1})
            return 0
        if message[0] in ("packed", "batch", "strings"):
            _apply(pipeline, message)
            more = _more_input(stdin)
            # Full requests wait for the rest of a drain (one call for several), up to a bound.
            if pipeline.pending() >= (full * _HELD_REQUESTS if more else full) or not delay_s:
                next_export = export()
            if more:
                continue  # a drain comes as several slices: report once, when caught up
        elif message[0] == "flush":
            pipeline.wait_idle(float(message[2]) if len(message) > 2 else 30.0)
            next_export = time.monotonic() + delay_s
            flushed = message[1]
        report()


def _records_in(message: tuple[Any, ...]) -> int:
    """How many records a `packed` or `batch` message holds (`pipe`)."""
    if message[0] == "packed":
        return len(message[1]) // _SLOT_BYTES
    if message[0] == "batch":
        return segments_count(message[1])
    return 0


def _apply(pipeline: Any, message: tuple[Any, ...]) -> None:
    """One message into the pipeline. Whatever it holds, this process goes on: a message it
    cannot read costs its own records, counted as failed and said once, never the run's."""
    try:
        pipeline.apply(message)
    except Exception as err:  # noqa: BLE001 - this process must outlive any input
        _unreadable(pipeline, _records_in(message), "reading records", err)


_said: set[str] = set()


def _unreadable(pipeline: Any, records: int, doing: str, err: BaseException) -> None:
    pipeline.received += records
    pipeline.cut_off += records  # counted with what failed (`ExportPipeline.stats`)
    if doing not in _said:
        _said.add(doing)
        # The error's type only: its text may quote a user's value.
        import logging
        logging.getLogger("otel_train").warning(
            "otel_train: the exporter failed %s (%s, a bug in otel_train: please report it); %d records are "
            "counted as failed, and the run goes on.", doing, type(err).__name__, records)


def _wake_on_sigterm() -> int:
    """A pipe that becomes readable when SIGTERM arrives (the main loop waits on it beside stdin)."""
    read, write = os.pipe()
    os.set_blocking(read, False)
    os.set_blocking(write, False)
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    signal.signal(signal.SIGTERM, lambda signum, frame: None)  # handled: the wakeup fd carries it
    return read


def _drain_wake(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def _wait_input(stdin: int, wake: int, timeout_s: float | None) -> list[int]:
    try:
        return select.select([stdin, wake], [], [], timeout_s)[0]
    except InterruptedError:  # pragma: no cover - PEP 475 retries; kept for other platforms
        return [wake]


if __name__ == "__main__":
    sys.exit(main())
