"""OTLP JSON files: the embedded default's exporters, and reading their lines back.

One export request per line (`ExportTraceServiceRequest` / `ExportMetricsServiceRequest` as
OTLP/JSON: ids in hex, 64-bit integers as strings), the format of the OpenTelemetry
Collector's file exporter. `read_spans` reads ours and the Collector's alike.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

_log = logging.getLogger("otel_train")


def _any_value(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, (list, tuple)):
        return {"arrayValue": {"values": [_any_value(v) for v in value]}}
    return {"stringValue": str(value)}


def _kv(attrs: Any) -> list[dict[str, Any]]:
    return [{"key": k, "value": _any_value(v)} for k, v in (attrs or {}).items()]


def _span_json(span: ReadableSpan) -> dict[str, Any]:
    ctx = span.context
    out: dict[str, Any] = {
        "traceId": f"{ctx.trace_id:032x}",
        "spanId": f"{ctx.span_id:016x}",
        "name": span.name,
        "kind": span.kind.value + 1,  # OTLP numbers SPAN_KIND_INTERNAL as 1
        "startTimeUnixNano": str(span.start_time),
        "endTimeUnixNano": str(span.end_time),
        "attributes": _kv(span.attributes),
        "status": {"code": span.status.status_code.value} if span.status.status_code.value else {},
    }
    if span.status.description:
        out["status"]["message"] = span.status.description
    if span.parent is not None:
        out["parentSpanId"] = f"{span.parent.span_id:016x}"
    if span.events:
        out["events"] = [{"timeUnixNano": str(e.timestamp), "name": e.name, "attributes": _kv(e.attributes)}
                         for e in span.events]
    if span.links:
        out["links"] = [{"traceId": f"{link.context.trace_id:032x}", "spanId": f"{link.context.span_id:016x}",
                         "attributes": _kv(link.attributes)} for link in span.links]
    return out


def spans_to_otlp_json(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """An OTLP/JSON `ExportTraceServiceRequest` (ids in hex, 64-bit integers as strings)."""
    grouped: dict[Any, dict[Any, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for span in spans:
        grouped[span.resource][span.instrumentation_scope].append(_span_json(span))
    return {"resourceSpans": [
        {"resource": {"attributes": _kv(resource.attributes)},
         "scopeSpans": [{"scope": {"name": scope.name, "version": scope.version or ""}, "spans": items}
                        for scope, items in scopes.items()]}
        for resource, scopes in grouped.items()]}


class _JsonLinesFile:
    """Appends one JSON document per line; opened lazily so an unused sink creates no file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._file: Any = None

    def write(self, doc: dict[str, Any]) -> bool:
        line = json.dumps(doc, separators=(",", ":")) + "\n"
        with self._lock:
            try:
                if self._file is None:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    self._file = open(self.path, "a", encoding="utf-8")
                self._file.write(line)
                self._file.flush()
                return True
            except OSError as err:
                _log.warning("otel_train: cannot write %s: %s", self.path, err)
                return False

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


class FileSpanExporter(SpanExporter):
    """Writes OTLP JSON lines (the embedded default)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._out = _JsonLinesFile(self.path)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        ok = self._out.write(spans_to_otlp_json(spans))
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self._out.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class FileMetricExporter(MetricExporter):
    """Writes OTLP JSON lines of `ExportMetricsServiceRequest`s."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = Path(path)
        self._out = _JsonLinesFile(self.path)

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        from google.protobuf.json_format import MessageToDict
        from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
        doc = MessageToDict(encode_metrics(metrics_data), use_integers_for_enums=True)
        ok = self._out.write(doc)
        return MetricExportResult.SUCCESS if ok else MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._out.close()


# --- reading OTLP JSON back -----------------------------------------------------------
def _value(any_value: dict[str, Any]) -> Any:
    if "stringValue" in any_value:
        return any_value["stringValue"]
    if "intValue" in any_value:
        return int(any_value["intValue"])
    if "doubleValue" in any_value:
        return float(any_value["doubleValue"])
    if "boolValue" in any_value:
        return bool(any_value["boolValue"])
    if "arrayValue" in any_value:
        return [_value(v) for v in any_value["arrayValue"].get("values", [])]
    return None


def _attrs(items: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {item["key"]: _value(item.get("value", {})) for item in items or ()}


def read_spans(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Flattened spans from an OTLP JSON lines file (ours or the Collector's file exporter)."""
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            if not line.strip():
                continue
            for resource_spans in json.loads(line).get("resourceSpans", []):
                resource = _attrs(resource_spans.get("resource", {}).get("attributes"))
                for scope_spans in resource_spans.get("scopeSpans", []):
                    for span in scope_spans.get("spans", []):
                        yield {
                            "name": span["name"],
                            "trace_id": span["traceId"].lower(),
                            "span_id": span["spanId"].lower(),
                            "parent_span_id": (span.get("parentSpanId") or "").lower() or None,
                            "start_ns": int(span["startTimeUnixNano"]),
                            "end_ns": int(span["endTimeUnixNano"]),
                            "attributes": _attrs(span.get("attributes")),
                            "resource": resource,
                            "events": [{"name": e["name"], "time_ns": int(e["timeUnixNano"]),
                                        "attributes": _attrs(e.get("attributes"))} for e in span.get("events", [])],
                            "links": [{"trace_id": link["traceId"].lower(), "span_id": link["spanId"].lower()}
                                      for link in span.get("links", [])],
                            "status_code": int(span.get("status", {}).get("code", 0)),
                        }
