"""The export pipeline: wire records -> spans and metrics -> processors and exporters.

The same object runs in the worker thread (`export_mode=thread`, or when the user installs
their own span processors) or in the per-rank exporter process (`export_mode=process`, the
default), so both paths emit identical spans. It is built from a picklable `setup` dict.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExportResult

from otel_train._config import Config
from otel_train._distributed import RunInfo
from otel_train._metrics import TrainMetrics
from otel_train._sinks import build_metric_exporter, build_span_exporter
from otel_train._spans import AttributeCleaner, SpanAssembler

_log = logging.getLogger("otel_train")


def make_setup(cfg: Config, run: RunInfo, resource: Mapping[str, Any], salt: int, version: str) -> dict[str, Any]:
    return {"config": dict(vars(cfg)), "run": dict(vars(run)), "resource": dict(resource),
            "salt": salt, "version": version}


class ExportPipeline:
    """Builds spans from wire records and exports them; counts what it could not export."""

    def __init__(self, setup: Mapping[str, Any], span_processors: Sequence[SpanProcessor] = (),
                 metric_readers: Sequence[MetricReader] = ()) -> None:
        self.cfg = Config(**setup["config"])
        self.run = RunInfo(**setup["run"])
        self.resource = Resource(setup["resource"])
        self.processors = list(span_processors)
        self.exporter = build_span_exporter(self.cfg, self.run)
        self.metrics = TrainMetrics(self.resource, build_metric_exporter(self.cfg, self.run),
                                    self.cfg.metric_interval_ms, metric_readers, setup["version"])
        self.assembler = SpanAssembler(self.run, setup["salt"], self.resource,
                                       AttributeCleaner(self.cfg.attribute_value_limit), self._emit,
                                       self.cfg.step_sample, self.metrics.observe, setup["version"])
        self.received = 0
        self.exported = 0
        self.failed = 0
        self._pending: list[ReadableSpan] = []
        self._closed = False

    def feed(self, records: Sequence[tuple[Any, ...]], dropped: Mapping[str, int]) -> None:
        self.received += len(records)
        self.assembler.feed(records)
        self.metrics.set_dropped({**dropped, "export_failed": self.failed})
        self._export_pending(None)

    def shutdown(self, deadline: float) -> dict[str, int]:
        """Emit held steps, export what remains before `deadline` (monotonic s), stop."""
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
        return self.stats()

    def stats(self) -> dict[str, int]:
        return {"received": self.received, "built": self.assembler.spans_built, "exported": self.exported,
                "failed": self.failed + len(self._pending)}

    def _emit(self, spans: list[ReadableSpan]) -> None:
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
            result = _guarded(self.exporter.export, chunk)  # type: ignore[union-attr]
            if result == SpanExportResult.SUCCESS:
                self.exported += len(chunk)
            else:
                self.failed += len(chunk)


def _guarded(fn: Any, *args: Any) -> Any:
    """Run an exporter/processor call; a failure is logged, never raised into the caller."""
    try:
        return fn(*args)
    except Exception as err:  # noqa: BLE001 - user processors and exporters may raise anything
        _log.warning("otel_train: %s failed: %s", getattr(fn, "__qualname__", fn), err)
        return None


def iter_chunks(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]
