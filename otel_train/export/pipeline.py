"""The export pipeline: wire records -> spans and metrics -> processors and exporters.

The same object runs in the worker thread (`export_mode=thread`, or when the user installs
their own span processors) or in the per-rank exporter process (`export_mode=process`, the
default), so both paths emit identical spans. It is built from a picklable `setup` dict.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.sdk.trace.export import SpanExportResult

from otel_train import semconv
from otel_train._config import Config
from otel_train._distributed import RunInfo
from otel_train.export import fast_path
from otel_train.export.attributes import AttributeCleaner
from otel_train.export.exporters import build_metric_exporter, build_span_exporter
from otel_train.export.goodput import RunAccount
from otel_train.export.metrics import TrainMetrics
from otel_train.export.mfu import Mfu
from otel_train.export.otlp import LeanEncoder
from otel_train.export.pipe import Segments
from otel_train.export.spans import SpanAssembler

_log = logging.getLogger("otel_train")
#: Pre-encoded OTLP/gRPC requests are cut here: a collector's gRPC receiver takes 4 MiB by default.
_MAX_REQUEST_BYTES = 1 << 20


def make_setup(cfg: Config, run: RunInfo, resource: Mapping[str, Any], salt: int, version: str,
               init_ns: int | None = None) -> dict[str, Any]:
    """`init_ns`: when `otel_train.init` ran (the recorder's wall clock; default now), where the
    run's goodput window opens."""
    return {"config": dict(vars(cfg)), "run": dict(vars(run)), "resource": dict(resource),
            "salt": salt, "version": version, "init_ns": time.time_ns() if init_ns is None else init_ns}


class _FixedResource(Resource):
    """A Resource that hashes once: the OTLP encoder hashes the resource of every span it
    encodes, and `Resource.__hash__` serialises all attributes to JSON each time."""

    def __init__(self, attributes: Mapping[str, Any]) -> None:
        super().__init__(dict(attributes))
        self._hash = super().__hash__()

    def __hash__(self) -> int:
        return self._hash


class ExportPipeline:
    """Builds spans from wire records and exports them; counts what it could not export."""

    def __init__(self, setup: Mapping[str, Any], span_processors: Sequence[SpanProcessor] = (),
                 metric_readers: Sequence[MetricReader] = ()) -> None:
        self.cfg = Config(**setup["config"])
        self.run = RunInfo(**setup["run"])
        self.resource = _FixedResource(setup["resource"])
        self.processors = list(span_processors)
        self.exporter = build_span_exporter(self.cfg, self.run)
        self.account = RunAccount(setup.get("init_ns") or time.time_ns(), self.run.restart)
        self.metrics = TrainMetrics(self.resource, build_metric_exporter(self.cfg, self.run),
                                    self.cfg.metric_interval_ms, metric_readers, setup["version"],
                                    account=self.account, mfu=Mfu(self.cfg.flops_per_step, self.cfg.peak_flops),
                                    console_every=self.cfg.console_every if self.run.rank == 0 else 0)
        # Lean path: no in-process processor needs SDK span objects and the exporter takes
        # pre-encoded protobuf, so records go straight to OTLP bytes (`otlp`).
        self.encoder: LeanEncoder | None = None
        if not self.processors and getattr(self.exporter, "accepts_lean", False):
            self.encoder = LeanEncoder(self.resource.attributes, semconv.SCOPE_NAME, setup["version"])
        self.assembler = SpanAssembler(self.run, setup["salt"], self.resource,
                                       AttributeCleaner(self.cfg.attribute_value_limit), self._emit,
                                       self.cfg.step_sample, self.metrics, setup["version"], self.encoder,
                                       self.account)
        self.received = 0
        self.exported = 0
        self.failed = 0
        self._pending: list[Any] = []
        self._closed = False

    def feed(self, segments: Segments, offset: int, dropped: Mapping[str, int], export: bool = True) -> None:
        """Take a slice of records (`pipe.Segments`: runs of hot-path tuples, whose clock
        `offset` this is, and of wire tuples); export what they complete now, or wait
        (`export=False`) until `export_pending()` so several slices share one export call."""
        for is_wire, records in segments:
            self.received += len(records)
            if is_wire:
                self.assembler.feed(records)
            else:
                self.assembler.feed_raw(records, offset)
        self.metrics.set_dropped({**dropped, "export_failed": self.failed})
        if export:
            self._export_pending(None)

    def feed_packed(self, slots: bytes, side: list[Any], wire: list[bool] | None, strings: list[str],
                    offset: int, dropped: Mapping[str, int]) -> None:
        """`feed` for a packed drain (`RecorderBase.drain_packed`, `strings` the recorder's table
        so far), encoded where the slots lie; unpacked into records where some side records are
        wire tuples already (device time) or the assembler has no C fast path. No export here:
        `export_pending` does that."""
        if wire is not None or not self.assembler.can_feed_packed():
            self.feed(fast_path.unpack(slots, side, wire, strings), offset, dropped, export=False)
            return
        self.received += self.assembler.feed_packed(slots, side, strings, offset)
        self.metrics.set_dropped({**dropped, "export_failed": self.failed})

    def export_pending(self) -> None:
        self._export_pending(None)

    def pending(self) -> int:
        """Spans built and waiting for an export call."""
        return len(self._pending)

    def shutdown(self, deadline: float) -> dict[str, Any]:
        """Emit held steps, export what remains before `deadline` (monotonic s), stop. The counts
        (`stats`), and with steps seen the run's `goodput` (`RunAccount.summary`)."""
        if not self._closed:
            self._closed = True
            self.assembler.flush()
            self._export_pending(deadline)
            for processor in self.processors:
                _guarded(processor.force_flush, max(1, int((deadline - time.monotonic()) * 1000)))
                _guarded(processor.shutdown)
            self.metrics.set_dropped({"export_failed": self.failed})
            self.metrics.shutdown(max(0.05, deadline - time.monotonic()))
            if self.exporter is not None:
                _guarded(self.exporter.shutdown)
        stats: dict[str, Any] = dict(self.stats())
        if self.account.steps:
            with self.metrics.lock:
                stats["goodput"] = self.account.summary()
        return stats

    def stats(self) -> dict[str, int]:
        return {"received": self.received, "built": self.assembler.spans_built, "exported": self.exported,
                "failed": self.failed + len(self._pending)}

    def _emit(self, spans: list[Any]) -> None:
        for processor in self.processors:
            for span in spans:
                _guarded(processor.on_end, span)
        if self.exporter is not None:
            self._pending.extend(spans)

    def _export_pending(self, deadline: float | None) -> None:
        size = self.cfg.export_batch_size
        while self._pending:
            if deadline is not None and time.monotonic() >= deadline:
                return  # what is left is reported as failed by stats()
            chunk, self._pending = self._pending[:size], self._pending[size:]
            if self.encoder is None:
                self._export(chunk, len(chunk))
                continue
            for batch in self.encoder.batches(chunk, size, _MAX_REQUEST_BYTES):
                if deadline is not None and time.monotonic() >= deadline:
                    self.failed += batch.count  # cut off at shutdown
                    continue
                self._export(batch, batch.count)

    def _export(self, batch: Any, count: int) -> None:
        result = _guarded(self.exporter.export, batch)  # type: ignore[union-attr]
        if result == SpanExportResult.SUCCESS:
            self.exported += count
        else:
            self.failed += count


def _guarded(fn: Any, *args: Any) -> Any:
    """Run an exporter/processor call; a failure is logged, never raised into the caller."""
    try:
        return fn(*args)
    except Exception as err:  # noqa: BLE001 - user processors and exporters may raise anything
        _log.warning("otel_train: %s failed: %s", getattr(fn, "__qualname__", fn), err)
        return None
