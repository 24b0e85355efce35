"""Exporters: where finished spans and metrics go, chosen from the configuration.

- `otlp`: the OpenTelemetry OTLP exporters (gRPC or HTTP/protobuf) to a collector, Jaeger or Tempo.
- `file` (the embedded default when no endpoint is set): OTLP JSON, one export request per
  line, one file per rank under `<output dir>/<run id>/` — `traces-rank<R>.jsonl` and
  `metrics-rank<R>.jsonl` (an inference actor's: `traces-inference-<id>.jsonl`, `process_label`;
  `otlp_json`), the format of the OpenTelemetry Collector's file exporter, which
  `otlp_json.read_spans` (and the CLI) read back.
- `console`, `none`.

Which one (`exporter_kinds`) is decided here once, for traces and metrics alike.
"""

from __future__ import annotations

import logging
import urllib.parse
from pathlib import Path
from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter
from opentelemetry.sdk.trace.export import SpanExporter

from otel_train import semconv
from otel_train._config import Config
from otel_train._distributed import RunInfo
from otel_train.export.otlp_json import FileMetricExporter, FileSpanExporter

_log = logging.getLogger("otel_train")


def run_dir(cfg: Config, run: RunInfo) -> Path:
    return Path(cfg.output_dir) / run.run_id


def process_label(run: RunInfo) -> str:
    """What names a process's files: `rank<R>` for a trainer; `<role>-<instance>` for another
    role (an inference actor has no rank of its own, and several may share a run directory)."""
    if run.role == semconv.ROLE_TRAINER:
        return f"rank{run.rank}"
    return f"{run.role}-{run.instance_id.replace('-', '')[:12]}"


def traces_path(cfg: Config, run: RunInfo) -> Path:
    return run_dir(cfg, run) / f"traces-{process_label(run)}.jsonl"


def metrics_path(cfg: Config, run: RunInfo) -> Path:
    return run_dir(cfg, run) / f"metrics-{process_label(run)}.jsonl"


def effective_exporter(choice: str, endpoint: str | None) -> str:
    """`auto` means OTLP when an endpoint is configured, else the embedded file default."""
    if choice == "auto":
        return "otlp" if endpoint else "file"
    return choice


def metrics_endpoint(cfg: Config) -> str | None:
    """The metrics endpoint: its own, else the one for everything."""
    return cfg.metrics_endpoint or cfg.endpoint


def exporter_kinds(cfg: Config) -> tuple[str, str]:
    """(traces, metrics): each `otlp`, `file`, `console` or `none`."""
    return (effective_exporter(cfg.traces_exporter, cfg.endpoint),
            effective_exporter(cfg.metrics_exporter, metrics_endpoint(cfg)))


def parse_headers(text: str | None) -> dict[str, str] | None:
    if not text:
        return None
    headers = {}
    for item in text.split(","):
        if "=" not in item:
            _log.warning("otel_train: OTEL_EXPORTER_OTLP_HEADERS item %r is not key=value; it is ignored.", item)
            continue
        key, value = item.split("=", 1)
        headers[urllib.parse.unquote(key.strip()).lower()] = urllib.parse.unquote(value.strip())
    return headers


def _http_url(endpoint: str, signal: str) -> str:
    if endpoint.rstrip("/").endswith(f"/v1/{signal}"):
        return endpoint
    return endpoint.rstrip("/") + f"/v1/{signal}"


def _default_endpoint(protocol: str) -> str:
    """The OTLP specification's default receiver for `protocol`."""
    return "http://localhost:4317" if protocol == "grpc" else "http://localhost:4318"


def describe_destination(cfg: Config, run: RunInfo) -> str:
    kind = exporter_kinds(cfg)[0]
    if kind == "file":
        return str(traces_path(cfg, run))
    if kind == "otlp":
        return f"{cfg.endpoint or _default_endpoint(cfg.protocol)} (OTLP {cfg.protocol})"
    return kind


def build_span_exporter(cfg: Config, run: RunInfo) -> SpanExporter | None:
    kind = exporter_kinds(cfg)[0]
    if kind == "none":
        return None
    if kind == "file":
        return FileSpanExporter(traces_path(cfg, run))
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter
        return ConsoleSpanExporter()
    endpoint = cfg.endpoint or _default_endpoint(cfg.protocol)
    headers = parse_headers(cfg.headers)
    if cfg.protocol == "grpc":
        return _lean_grpc_exporter_class()(endpoint=endpoint, insecure=endpoint.startswith("http://"),
                                           headers=headers, timeout=cfg.export_timeout_s)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
    return HttpExporter(endpoint=_http_url(endpoint, "traces"), headers=headers, timeout=cfg.export_timeout_s)


def _lean_grpc_exporter_class() -> type[SpanExporter]:
    """The official OTLP/gRPC span exporter, also accepting spans pre-encoded by `otlp`.

    Pre-encoded bytes go onto the wire as they are: the exporter's stub gets a request
    serializer that passes bytes through (and serializes a message as the generated stub
    does), so they are not parsed into a message only to be serialized again. Retries,
    reconnection, headers, TLS and compression stay the official exporter's.
    """
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    from otel_train.export.otlp import LeanSpanBatch

    def serialize(request: Any) -> bytes:
        return request if isinstance(request, bytes) else request.SerializeToString()

    class BytesTraceStub(trace_service_pb2_grpc.TraceServiceStub):  # type: ignore[misc]
        def __init__(self, channel: Any) -> None:
            self.Export = channel.unary_unary(
                "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                request_serializer=serialize, response_deserializer=ExportTraceServiceResponse.FromString,
                _registered_method=True)

    class LeanGrpcSpanExporter(OTLPSpanExporter):  # type: ignore[misc]
        accepts_lean = True

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            # The stub the mixin made in __init__, and makes again on every reconnect.
            self._stub = BytesTraceStub
            self._client = BytesTraceStub(self._channel)

        def _translate_data(self, data: Any) -> Any:
            if isinstance(data, LeanSpanBatch):
                return data.payload
            return super()._translate_data(data)

    return LeanGrpcSpanExporter


def build_metric_exporter(cfg: Config, run: RunInfo) -> MetricExporter | None:
    endpoint = metrics_endpoint(cfg)
    kind = exporter_kinds(cfg)[1]
    if kind == "none":
        return None
    if kind == "file":
        return FileMetricExporter(metrics_path(cfg, run))
    if kind == "console":
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter
        return ConsoleMetricExporter()
    endpoint = endpoint or _default_endpoint(cfg.protocol)
    headers = parse_headers(cfg.headers)
    if cfg.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter
        return GrpcExporter(endpoint=endpoint, insecure=endpoint.startswith("http://"), headers=headers,
                            timeout=cfg.export_timeout_s)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpExporter
    return HttpExporter(endpoint=_http_url(endpoint, "metrics"), headers=headers, timeout=cfg.export_timeout_s)
