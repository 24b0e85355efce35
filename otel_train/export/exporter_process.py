"""The per-rank exporter process: reads wire records from stdin, exports spans and metrics.

Started by the training process (`sinks.ProcessSink`); never imports torch, nor the training
hot path (`otel_train.record`). Messages are length-prefixed, a format byte then a marshal or
pickle of a tuple (`pipe`): `("setup", dict)`, then `("batch", segments, offset, dropped
totals)` or `("packed", slots, side records, wire flags, new strings, offset, dropped totals)`…,
then `("shutdown", seconds)`. End of input (the trainer died) is a shutdown too. Whenever it has
caught up with its input, and after every flush, it writes one JSON line of progress to
stdout, which the trainer reads to report exactly what was lost if it has to kill this
process at the shutdown bound.
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

from otel_train.export.pipe import FRAME, loads

_NICE = 10
#: Full requests held back while more input is waiting (a drain's later slices), at most.
_HELD_REQUESTS = 8


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


def _report(stats: dict[str, int]) -> None:
    try:
        sys.stdout.write(json.dumps(stats) + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, OSError):
        os._exit(0)  # the trainer is gone and nobody reads: nothing left to report to


def _watch_parent(timeout_s: float) -> None:
    """If the trainer dies, finish within its shutdown bound instead of lingering in an export."""
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.5)
    time.sleep(timeout_s)
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


def main() -> int:
    # Ctrl-C reaches the whole process group; the trainer decides when we stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stdin = sys.stdin.fileno()
    first = _read(stdin)
    if first is None or first[0] != "setup":
        return 1
    setup = first[1]
    lower_priority(setup["config"].get("exporter_priority", "low"))
    from otel_train.export.pipeline import ExportPipeline

    timeout_s = float(setup["config"]["shutdown_timeout_s"])
    threading.Thread(target=_watch_parent, args=(timeout_s,), daemon=True).start()
    pipeline = ExportPipeline(setup)
    # Everything imported and built so far lives as long as this process: keep the garbage
    # collector from scanning it again on every collection (gRPC and protobuf are large).
    gc.freeze()
    # Spans are exported every `export_delay_ms` (OTEL_BSP_SCHEDULE_DELAY), when a full request
    # is ready, on a flush and at shutdown: an export call has a fixed cost of 0.4-1.4 ms of
    # CPU here, which at one call per trainer drain was most of what the exporter cost a slow
    # step rate.
    delay_s = setup["config"]["export_delay_ms"] / 1000.0
    full = setup["config"]["export_batch_size"]
    next_export = time.monotonic() + delay_s
    flushed = 0
    strings: list[str] = []  # the trainer's string table, as far as it has sent it

    def export() -> float:
        """Export what is pending; returns when the next export is due."""
        pipeline.export_pending()
        return time.monotonic() + delay_s

    def report() -> None:
        _report({**pipeline.stats(), "flushed": flushed, "cpu_ns": time.process_time_ns()})

    while True:
        if pipeline.pending() and not _more_input(stdin, max(0.0, next_export - time.monotonic())):
            next_export = export()
            report()
            continue
        message = _read(stdin)
        if message is None or message[0] == "shutdown":
            budget = timeout_s if message is None else float(message[1])
            stats = pipeline.shutdown(time.monotonic() + budget)
            _report({**stats, "final": 1})
            return 0
        if message[0] == "packed":  # slots as the recorder packed them, and the strings new since
            _, slots, side, wire, new, offset, dropped = message
            strings.extend(new)
            pipeline.feed_packed(slots, side, wire, strings, offset, dropped)
        elif message[0] == "batch":
            pipeline.feed(*message[1:], export=False)
        if message[0] in ("packed", "batch"):
            more = _more_input(stdin)
            # Full requests wait for the rest of a drain (one call for several), up to a bound.
            if pipeline.pending() >= (full * _HELD_REQUESTS if more else full):
                next_export = export()
            if more:
                continue  # a drain comes as several slices: report once, when caught up
        elif message[0] == "flush":
            next_export = export()
            flushed = message[1]
        report()


if __name__ == "__main__":
    sys.exit(main())
