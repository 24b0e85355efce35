"""The export pipeline: wire records -> spans and metrics -> encoded requests -> delivery.

The same object runs in the per-rank exporter process (`export_mode=process`, the default),
in the worker thread (`export_mode=thread`, or when the user installs their own span
processors) and, when the exporter process never became ready, in the training process at
shutdown (`sinks.ProcessSink`), so every path emits identical spans. It is built from an
`ExportSetup` (`destination`): the configuration resolved once, destinations included.

One encoder route: spans are encoded to OTLP protobuf (`otlp.LeanEncoder`; the usual region
and step straight from their records, `fast_path`) for every destination, and handed to the
`delivery.Delivery` of the traces destination. `ReadableSpan`s are made only for span
processors the user installed (`readable_span`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor

from otel_train import _resource, semconv
from otel_train.export import restarts
from otel_train.export.attributes import AttributeCleaner
from otel_train.export.destination import ExportSetup
from otel_train.export.exporters import build_metric_exporter, build_span_delivery
from otel_train.export.goodput import RunAccount
from otel_train.export.metrics import TrainMetrics
from otel_train.export.mfu import Mfu
from otel_train.export.otlp import LeanEncoder
from otel_train.export.pipe import Segments
from otel_train.export.spans import SpanAssembler

_log = logging.getLogger("otel_train")
#: Encoded requests are cut here: a collector's gRPC receiver takes 4 MiB by default.
_MAX_REQUEST_BYTES = 1 << 20


class _FixedResource(Resource):
    """A Resource that hashes once: `Resource.__hash__` serialises all attributes to JSON each
    time, and span processors may hash the resource of every span."""

    def __init__(self, attributes: Mapping[str, Any]) -> None:
        super().__init__(dict(attributes))
        self._hash = super().__hash__()

    def __hash__(self) -> int:
        return self._hash


class ExportPipeline:
    """Builds spans from wire records and hands them, encoded, to delivery; counts what it loses."""

    def __init__(self, setup: ExportSetup, span_processors: Sequence[SpanProcessor] = (),
                 metric_readers: Sequence[MetricReader] = ()) -> None:
        self.setup = setup
        cfg = setup.config
        self.cfg = cfg
        self.run = setup.run
        self.version, sdk_version = versions()
        resource = _resource.build(cfg, self.run, setup.resource)
        self.resource = _FixedResource({**resource, "telemetry.sdk.version": sdk_version} if sdk_version else resource)
        self.processors = list(span_processors)
        self.delivery = build_span_delivery(setup.traces, cfg.buffer_size)
        self.account = RunAccount(setup.init_ns, self.run.restart)
        self.metric_exporter = build_metric_exporter(setup.metrics)
        self.metrics = TrainMetrics(self.resource, self.metric_exporter, cfg.metric_interval_ms,
                                    metric_readers, self.version, account=self.account,
                                    mfu=Mfu(cfg.flops_per_step, cfg.peak_flops),
                                    console_every=cfg.console_every if self.run.rank == 0 else 0)
        self.encoder = LeanEncoder(self.resource.attributes, semconv.SCOPE_NAME, self.version)
        self.assembler = SpanAssembler(self.run, setup.salt, self.resource,
                                       AttributeCleaner(cfg.attribute_value_limit), self._emit, cfg.step_sample,
                                       self.metrics, self.version, self.encoder, self.account,
                                       cfg.ranks, cfg.step_spans, cfg.span_time)
        if self.processors:  # they see every span as a `ReadableSpan`: none may leave as bytes already
            self.assembler.fast = False  # (the assembler turns it off for an inference actor itself)
        if restarts.may_restart(self.run):
            self.assembler.progress = restarts.RestartProgress(self.run, restarts.progress_dir(self.run.run_id))
        self._scope: Any = None
        self.received = 0
        self.cut_off = 0  # encoded too late, at the shutdown deadline
        self._pending: list[Any] = []
        self._strings: list[str] = []  # the trainer's string table, as far as it has been sent
        self._closed = False

    # -- in ----------------------------------------------------------------------------
    def apply(self, message: tuple[Any, ...]) -> None:
        """One `("batch", ...)` or `("packed", ...)` message from the training process (`pipe`),
        without exporting: `export_pending()` does that."""
        kind = message[0]
        if kind == "packed":  # slots as the recorder packed them, and the strings new since
            _, slots, side, wire, new, offset, dropped = message
            self._strings.extend(new)
            self.feed_packed(slots, side, wire, self._strings, offset, dropped)
        elif kind == "batch":
            self.feed(*message[1:], export=False)
        elif kind == "strings":  # strings whose slots were dropped: later slots still use them
            self._strings.extend(message[1])

    def feed(self, segments: Segments, offset: int, dropped: Mapping[str, int], export: bool = True) -> None:
        """Take a slice of records (`pipe.Segments`: runs of hot-path tuples, whose clock
        `offset` this is, and of wire tuples); export what they complete now, or wait
        (`export=False`) until `export_pending()` so several slices share one request."""
        for is_wire, records in segments:
            self.received += len(records)
            if is_wire:
                self.assembler.feed(records)
            else:
                self.assembler.feed_raw(records, offset)
        self.metrics.set_dropped({**dropped, "export_failed": self.failed()})
        self._note_progress()
        if export:
            self.export_pending()

    def feed_packed(self, slots: bytes, side: list[Any], wire: list[bool] | None, strings: list[str],
                    offset: int, dropped: Mapping[str, int]) -> None:
        """`feed` for a packed drain (`RecorderBase.drain_packed`, `strings` the recorder's table
        so far), unpacked into the records the recorder's deque would have held. No export here:
        `export_pending` does that."""
        # The one reader of `wire/slots.h` is the hot path's C module: the exporter imports that
        # module alone of the training side (no torch, no Python of the hot path). Packing is on
        # only where it was built (`_runtime`), and the exporter runs the same installation.
        from otel_train.record import _hotpath

        self.feed(_hotpath.unpack(slots, side, wire, strings), offset, dropped, export=False)

    def _note_progress(self) -> None:
        """The restart marker, where the run may restart (`restarts.py`): once per drain."""
        if self.assembler.progress is not None:
            self.assembler.progress.flush()

    # -- out ---------------------------------------------------------------------------
    def export_pending(self) -> None:
        """Encode the spans built so far into requests and hand them to delivery."""
        self._export_pending(None)

    def pending(self) -> int:
        """Spans built and waiting to be encoded."""
        return len(self._pending)

    def wait_idle(self, timeout_s: float) -> bool:
        """Encode everything and wait until delivery has sent it (benchmarks, tests)."""
        self.export_pending()
        return self.delivery is None or self.delivery.wait_idle(timeout_s)

    def shutdown(self, deadline: float) -> dict[str, Any]:
        """Emit held steps, deliver what remains before `deadline` (monotonic s), stop. The counts
        (`stats`), and with steps seen the run's `goodput` (`RunAccount.summary`)."""
        if not self._closed:
            self._closed = True
            self.assembler.flush()
            self._note_progress()
            self._export_pending(deadline)
            for processor in self.processors:
                _guarded(processor.force_flush, max(1, int((deadline - time.monotonic()) * 1000)))
                _guarded(processor.shutdown)
            if self.delivery is not None:
                # Spans first; metrics get the last quarter, at most 0.5 s (one request to a
                # collector that answers): a collector back late in the bound must find the
                # spans still being retried.
                self.delivery.close(deadline - min(0.5, 0.25 * max(0.0, deadline - time.monotonic())))
            self.metrics.set_dropped({"export_failed": self.failed()})
            end_by = getattr(self.metric_exporter, "end_by", None)
            if end_by is not None:
                end_by(deadline)
            self.metrics.shutdown(max(0.05, deadline - time.monotonic()))
        stats: dict[str, Any] = dict(self.stats())
        if self.account.steps:
            with self.metrics.lock:
                stats["goodput"] = self.account.summary()
        return stats

    def failed(self) -> int:
        """Spans lost so far: refused, dropped while waiting, or cut off at the deadline."""
        unencodable = getattr(self.encoder, "unencodable", 0)
        if self.delivery is None:
            return self.cut_off + unencodable
        delivered = self.delivery.stats()
        return self.cut_off + unencodable + delivered["failed"] + delivered["overflow"]

    def stats(self) -> dict[str, int]:
        """received (records), built, exported, failed (refused, or cut off at the deadline),
        overflow (waited for the collector past the buffer), queued and held (spans)."""
        delivered = (self.delivery.stats() if self.delivery is not None
                     else {"exported": 0, "failed": 0, "overflow": 0, "queued": 0})
        return {"received": self.received, "built": self.assembler.spans_built, "exported": delivered["exported"],
                "failed": self.cut_off + delivered["failed"] + (len(self._pending) if self._closed else 0)
                + getattr(self.encoder, "unencodable", 0),
                "unconfirmed": delivered.get("unconfirmed", 0), "duplicated": delivered.get("duplicated", 0),
                "sending": delivered.get("sending", 0),
                "overflow": delivered["overflow"], "queued": delivered["queued"] + len(self._pending),
                "held": len(self.assembler.timeline.held)}

    def _emit(self, spans: list[Any]) -> None:
        if self.processors:
            for span in spans:
                readable = readable_span(span, self.resource, self._scope_of())
                for processor in self.processors:
                    _guarded(processor.on_end, readable)
        if self.delivery is not None:
            self._pending.extend(spans)

    def _scope_of(self) -> Any:
        if self._scope is None:
            from opentelemetry.sdk.util.instrumentation import InstrumentationScope
            self._scope = InstrumentationScope(semconv.SCOPE_NAME, self.version)
        return self._scope

    def _export_pending(self, deadline: float | None) -> None:
        if not self._pending or self.delivery is None:
            return
        pending, self._pending = self._pending, []
        for batch in self.encoder.batches(pending, self.cfg.export_batch_size, _MAX_REQUEST_BYTES):
            if deadline is not None and time.monotonic() >= deadline:
                self.cut_off += batch.count  # no time left to send it
                continue
            self.delivery.add(batch.payload, batch.count)


def versions() -> tuple[str, str]:
    """(otel-train's version, the OpenTelemetry SDK's): the scope's version and the resource's
    `telemetry.sdk.version`, looked up here, off the training thread."""
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for name in ("otel-train", "opentelemetry-sdk"):
        try:
            found.append(version(name))
        except PackageNotFoundError:
            found.append("0" if name == "otel-train" else "")
    return found[0], found[1]


def readable_span(span: tuple[Any, ...], resource: Resource, scope: Any) -> Any:
    """An SDK `ReadableSpan` from the assembler's span tuple, for user span processors."""
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

    (name, trace_id, span_id, parent_id, parent_remote, start, end, attrs, events, links, status_code,
     status_message) = span
    sampled = TraceFlags(TraceFlags.SAMPLED)
    return ReadableSpan(
        name=name, context=SpanContext(trace_id, span_id, False, sampled),
        parent=SpanContext(trace_id, parent_id, parent_remote, sampled) if parent_id else None,
        resource=resource, attributes=attrs,
        events=[Event(n, a, t) for n, t, a in events] if events else (),
        links=[Link(SpanContext(t, s, True, sampled)) for t, s in links or ()], kind=SpanKind.INTERNAL,
        status=Status(StatusCode.ERROR, status_message) if status_code else Status(StatusCode.UNSET),
        start_time=start, end_time=end, instrumentation_scope=scope)


def _guarded(fn: Any, *args: Any) -> Any:
    """Run a processor call; a failure is logged, never raised into the caller."""
    try:
        return fn(*args)
    except Exception as err:  # noqa: BLE001 - user processors may raise anything
        _log.warning("otel_train: %s failed: %s", getattr(fn, "__qualname__", fn), err)
        return None
