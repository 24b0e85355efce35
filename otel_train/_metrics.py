"""Metrics derived from the same records as the spans (CONVENTIONS.md §5).

The span assembler calls `TrainMetrics.observe(span name, duration, attributes)` for every
record, sampled out or not, so metrics always see every step. Instruments are OTel SDK
instruments on a `MeterProvider` whose reader exports periodically over OTLP or to a file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from otel_train import semconv

#: Bucket bounds in seconds: sub-millisecond phases up to minute-long checkpoints.
SECONDS_BUCKETS: Sequence[float] = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class TrainMetrics:
    """The package's instruments, fed from span records."""

    def __init__(self, resource: Resource, exporter: MetricExporter | None, interval_ms: int,
                 extra_readers: Sequence[MetricReader] = (), version: str = "") -> None:
        readers = list(extra_readers)
        if exporter is not None:
            readers.append(PeriodicExportingMetricReader(exporter, export_interval_millis=interval_ms))
        # shutdown_on_exit=False: our own bounded shutdown stops it; the SDK's atexit hook
        # would export again with the exporter's full timeout to a collector that may be dead.
        self.provider = MeterProvider(resource=resource, metric_readers=readers, shutdown_on_exit=False)
        meter = self.provider.get_meter(semconv.SCOPE_NAME, version)

        def seconds(name: str, description: str) -> Any:
            return meter.create_histogram(name, unit="s", description=description,
                                          explicit_bucket_boundaries_advisory=SECONDS_BUCKETS)

        self.step_duration = seconds(semconv.METRIC_STEP_DURATION, "Step time between step boundaries")
        self.phase_duration = seconds(semconv.METRIC_PHASE_DURATION, "Host duration of a step phase")
        self.device_duration = seconds(semconv.METRIC_DEVICE_DURATION, "Device duration of a step phase")
        self.gc_pause = seconds(semconv.METRIC_GC_PAUSE, "Python garbage-collection pause")
        self.infer_batch = seconds(semconv.METRIC_INFER_BATCH_DURATION, "One inference generate call")
        self.dispatch_wait = seconds(semconv.METRIC_DISPATCH_WAIT, "Trainer waiting for samples")
        self.tokens_per_s = meter.create_gauge(semconv.METRIC_THROUGHPUT_TOKENS, unit="{token}/s")
        self.samples_per_s = meter.create_gauge(semconv.METRIC_THROUGHPUT_SAMPLES, unit="{sample}/s")
        self.dropped = meter.create_counter(semconv.METRIC_SPANS_DROPPED, unit="{span}",
                                            description="Records otel_train had to drop")
        self._dropped_seen: dict[str, int] = {}

    def observe(self, name: str, duration_s: float, attrs: Mapping[str, Any]) -> None:
        if name == semconv.SPAN_STEP:
            self.step_duration.record(duration_s)
            if duration_s > 0:
                for key, gauge in ((semconv.TRAIN_TOKENS, self.tokens_per_s),
                                   (semconv.TRAIN_SAMPLES, self.samples_per_s)):
                    count = attrs.get(key)
                    if isinstance(count, (int, float)) and not isinstance(count, bool):
                        gauge.set(count / duration_s)
        elif name in semconv.PHASE_SPANS:
            self.phase_duration.record(duration_s, {semconv.METRIC_ATTR_PHASE: name})
        elif name == semconv.SPAN_GC:
            self.gc_pause.record(duration_s)
        elif name == semconv.SPAN_INFER_GENERATE:
            self.infer_batch.record(duration_s)
        elif name == semconv.SPAN_DISPATCH_WAIT:
            self.dispatch_wait.record(duration_s)
        device_s = attrs.get(semconv.DEVICE_DURATION_S)
        if isinstance(device_s, float):
            self.device_duration.record(device_s, {semconv.METRIC_ATTR_PHASE: name})

    def set_dropped(self, totals: Mapping[str, int]) -> None:
        """Advance the dropped counter to the cumulative `totals` per reason."""
        for reason, total in totals.items():
            delta = total - self._dropped_seen.get(reason, 0)
            if delta > 0:
                self.dropped.add(delta, {semconv.METRIC_ATTR_REASON: reason})
                self._dropped_seen[reason] = total

    def shutdown(self, timeout_s: float) -> None:
        millis = max(1, int(timeout_s * 1000))
        self.provider.force_flush(timeout_millis=millis)
        self.provider.shutdown(timeout_millis=millis)
