"""OTLP JSON files: the embedded default's writer, and reading its lines back.

One export request per line (`ExportTraceServiceRequest` / `ExportMetricsServiceRequest` as
OTLP/JSON: ids in hex, 64-bit integers as strings), the format of the OpenTelemetry
Collector's file exporter. What is written is the same encoded request an OTLP exporter
sends (`otlp.LeanEncoder`), turned into JSON here (`FileTransport`), so files and collectors
get one encoding: read straight off the protobuf wire in C (`_otlp_json.c`), or where that was
not built (or declines a request), parsed and dumped in Python (`trace_request_json_python`).
`read_spans` reads ours and the Collector's alike, and skips (and counts) a line cut short by a
crash or a full disk instead of failing on it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from otel_train.export.transport import OK, Outcome

try:  # the trace requests' conversion in C; `trace_request_json_python` is the fallback
    from otel_train.export import _otlp_json
except ImportError:
    _otlp_json = None  # type: ignore[assignment]

_log = logging.getLogger("otel_train")


class JsonLinesFile:
    """Appends one JSON document per line, whole or not at all; opened lazily (no unused file).

    Each line goes down in `os.write` calls on a descriptor opened with O_APPEND. If a write
    fails part-way (a full disk), the file is cut back to where the line began, so no partial
    line is left for the next one to be glued to; if even that fails, the next line starts on a
    fresh line. The run directory is created readable by its owner only (0700) and the files
    0600: they hold attribute values, paths and host names (docs/security.md)."""

    def __init__(self, path: Path, stream: Any = None) -> None:
        self.path = Path(path)
        self._stream = stream  # the console: write there instead of a file
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._broken_line = False

    def write(self, doc: Any) -> Outcome:
        """Append `doc` (a dict, or JSON text already, as str or UTF-8 bytes) as one line."""
        if isinstance(doc, bytes):
            data = doc + b"\n"
        else:
            text = doc if isinstance(doc, str) else json.dumps(doc, separators=(",", ":"))
            data = (text + "\n").encode("utf-8")
        with self._lock:
            if self._stream is not None:
                try:
                    self._stream.write(data.decode("utf-8"))
                    self._stream.flush()
                    return OK
                except (OSError, ValueError) as err:
                    return Outcome(False, False, None, str(err), "the console stream is closed")
            try:
                fd = self._open()
            except OSError as err:
                return Outcome(False, False, None, err.strerror or type(err).__name__,
                               f"cannot create {self.path}: check OTEL_TRAIN_OUTPUT_DIR")
            start = None
            try:
                start = os.fstat(fd).st_size
                if self._broken_line:
                    data = b"\n" + data
                view = memoryview(data)
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
                self._broken_line = False
                return OK
            except OSError as err:
                self._cut_back(fd, start)
                return Outcome(False, False, None, err.strerror or type(err).__name__,
                               f"writing {self.path} failed (a full disk, or a size limit?)")

    def _open(self) -> int:
        if self._fd is None:
            if not self.path.parent.is_dir():
                private_dirs(self.path.parent)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0),
                               0o600)
        return self._fd

    def _cut_back(self, fd: int, size: int | None) -> None:
        try:
            if size is None:
                raise OSError
            os.ftruncate(fd, size)
        except OSError:
            self._broken_line = True  # a partial line may remain: the next one starts afresh

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


class FileTransport:
    """The embedded default (and the console) as a transport (`transport.Transport`): an encoded
    OTLP request is appended as one OTLP JSON line."""

    def __init__(self, path: Path, signal: str = "traces", stream: Any = None) -> None:
        self.out = JsonLinesFile(path, stream)
        self.signal = signal

    def send(self, payload: bytes, timeout_s: float) -> Outcome:
        line = trace_request_line(payload) if self.signal == "traces" else metrics_request_json(payload)
        return self.out.write(line)

    def close(self) -> None:
        self.out.close()


# --- OTLP protobuf -> OTLP JSON ---------------------------------------------------------------
def _json_value(value: Any) -> dict[str, Any]:
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return {"stringValue": value.string_value}
    if kind == "int_value":
        return {"intValue": str(value.int_value)}
    if kind == "double_value":
        return {"doubleValue": value.double_value}
    if kind == "bool_value":
        return {"boolValue": value.bool_value}
    if kind == "array_value":
        return {"arrayValue": {"values": [_json_value(v) for v in value.array_value.values]}}
    if kind == "kvlist_value":
        return {"kvlistValue": {"values": _json_kvs(value.kvlist_value.values)}}
    if kind == "bytes_value":
        import base64
        return {"bytesValue": base64.b64encode(value.bytes_value).decode("ascii")}
    return {}


def _json_kvs(items: Any) -> list[dict[str, Any]]:
    return [{"key": kv.key, "value": _json_value(kv.value)} for kv in items]


def _json_span(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"traceId": span.trace_id.hex(), "spanId": span.span_id.hex(), "name": span.name,
                           "kind": span.kind, "startTimeUnixNano": str(span.start_time_unix_nano),
                           "endTimeUnixNano": str(span.end_time_unix_nano), "attributes": _json_kvs(span.attributes)}
    status = span.status
    out["status"] = ({"code": status.code, **({"message": status.message} if status.message else {})}
                     if status.code or status.message else {})
    if span.parent_span_id:
        out["parentSpanId"] = span.parent_span_id.hex()
    if span.events:
        out["events"] = [{"timeUnixNano": str(e.time_unix_nano), "name": e.name, "attributes": _json_kvs(e.attributes)}
                         for e in span.events]
    if span.links:
        out["links"] = [{"traceId": link.trace_id.hex(), "spanId": link.span_id.hex(),
                         "attributes": _json_kvs(link.attributes)} for link in span.links]
    return out


def trace_request_line(payload: bytes) -> bytes:
    """An encoded `ExportTraceServiceRequest` as one line of OTLP JSON (ids in hex, 64-bit
    integers as strings, ASCII), the OpenTelemetry Collector file exporter's format."""
    if _otlp_json is not None:
        try:
            return _otlp_json.trace_request(payload)
        except ValueError:
            pass  # a request the C reader does not render exactly: Python does
    return trace_request_json_python(payload).encode("ascii")


def trace_request_json_python(payload: bytes) -> str:
    """`trace_request_line` in Python: parsed with protobuf, dumped with `json` (the C reader's
    reference, and its fallback)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest.FromString(payload)
    doc = {"resourceSpans": [
        {"resource": {"attributes": _json_kvs(rs.resource.attributes)},
         "scopeSpans": [{"scope": {"name": ss.scope.name, "version": ss.scope.version},
                         "spans": [_json_span(span) for span in ss.spans]} for ss in rs.scope_spans]}
        for rs in request.resource_spans]}
    return json.dumps(doc, separators=(",", ":"))


def metrics_request_json(payload: bytes) -> str:
    """An encoded `ExportMetricsServiceRequest` as one line of OTLP JSON."""
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    doc = MessageToDict(ExportMetricsServiceRequest.FromString(payload), use_integers_for_enums=True)
    return json.dumps(doc, separators=(",", ":"))


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


def private_dirs(path: Path) -> None:
    """Create `path` and each missing folder above it as 0700: `mkdir(parents=True)` gives the
    folders above the last the process's default mode, so `otel-train/` was 0777 under umask
    000 (the files are 0600). Folders that exist are left as they are."""
    missing = []
    while not path.is_dir():
        missing.append(path)
        if path.parent == path:
            break
        path = path.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:  # another rank made it meanwhile
            pass


def read_spans(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Flattened spans from an OTLP JSON lines file (ours or the Collector's file exporter)."""
    unreadable = 0
    with open(path, encoding="utf-8", errors="replace") as lines:
        for line in lines:
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except ValueError:
                unreadable += 1  # cut short by a crash or a full disk: the rest of the file still reads
                continue
            for resource_spans in doc.get("resourceSpans", []):
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
    if unreadable:
        _log.warning("otel_train: %d line(s) of %s could not be read (cut short?) and were skipped.", unreadable, path)
