"""The senders at the end of the pipeline, built from the resolved destinations (`destination`).

Spans: one route for every destination. The pipeline encodes spans to OTLP protobuf bytes
(`otlp.LeanEncoder`, the usual ones in C); a `delivery.Delivery` sends each request through
a transport: OTLP/gRPC or OTLP/HTTP (`transport`), or the local file / console writer, which
turns the same bytes into an OTLP JSON line (`otlp_json.FileTransport`). Metrics: the SDK's
`MetricsData` encoded by the SDK's own OTLP encoder and sent through the same transports.

Retries, what is kept while a collector is away, and every count live in `Delivery`; the
OTLP specification's retry rules in `transport`.
"""

from __future__ import annotations

import logging
import random
import sys
import time
from pathlib import Path
from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

from otel_train.export.delivery import Delivery, first_time
from otel_train.export.destination import Destination
from otel_train.export.otlp_json import FileTransport
from otel_train.export.transport import GrpcTransport, HttpTransport, Transport

_log = logging.getLogger("otel_train")


def build_transport(dest: Destination) -> Transport | None:
    """The transport for `dest`, or None for `none`."""
    if dest.kind == "file":
        return FileTransport(Path(dest.path), dest.signal)
    if dest.kind == "console":
        return FileTransport(Path("-"), dest.signal, stream=sys.stdout)
    if dest.kind != "otlp":
        return None
    if dest.protocol == "grpc":
        return GrpcTransport(dest)
    return HttpTransport(dest)


def build_span_delivery(dest: Destination, capacity: int) -> Delivery | None:
    """Where encoded span requests go (None: nowhere), keeping up to `capacity` spans while the
    destination does not take them."""
    transport = build_transport(dest)
    if transport is None:
        return None
    return Delivery(transport, capacity, dest.timeout_s, dest.describe())


def build_metric_exporter(dest: Destination) -> MetricExporter | None:
    transport = build_transport(dest)
    return None if transport is None else TransportMetricExporter(transport, dest)


class TransportMetricExporter(MetricExporter):  # type: ignore[misc]
    """An SDK `MetricExporter` on one of our transports: the SDK's OTLP encoding, our sending.

    A retryable failure is retried with backoff within the export's timeout, then the export
    fails (the next collection carries cumulative values again); nothing is kept."""

    def __init__(self, transport: Transport, dest: Destination) -> None:
        super().__init__()
        self.transport = transport
        self.dest = dest
        #: No export goes on past this (monotonic s; `end_by`): the SDK reader's last export at
        #: its shutdown takes its own 30 s timeout, which outlived the shutdown bound.
        self.end: float | None = None

    def end_by(self, deadline: float) -> None:
        self.end = deadline

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics

        payload = encode_metrics(metrics_data).SerializeToString()
        deadline = time.monotonic() + min(timeout_millis / 1000.0, self.dest.timeout_s)
        if self.end is not None:
            deadline = min(deadline, self.end)
            if deadline <= time.monotonic():
                return MetricExportResult.FAILURE
        attempt = 0
        while True:
            outcome = self.transport.send(payload, max(0.001, deadline - time.monotonic()))
            if outcome.ok:
                return MetricExportResult.SUCCESS
            delay = outcome.delay_s if outcome.delay_s is not None else 0.5 * 2 ** attempt * random.uniform(0.8, 1.2)
            attempt += 1
            if not outcome.retry or time.monotonic() + delay >= deadline:
                if first_time(self.dest.describe(), outcome.reason):  # once, spans' delivery included
                    _log.warning("otel_train: exporting metrics to %s failed (%s: %s).", self.dest.describe(),
                                 outcome.reason, outcome.hint)
                return MetricExportResult.FAILURE
            time.sleep(delay)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.transport.close()
