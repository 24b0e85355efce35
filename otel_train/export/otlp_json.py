"""OTLP JSON files: the embedded default's writer, and reading its lines back.

One export request per line (`ExportTraceServiceRequest` / `ExportMetricsServiceRequest` as
OTLP/JSON: ids in hex, 64-bit integers as strings), the format of the OpenTelemetry
Collector's file exporter. What is written is the same encoded request an OTLP exporter
sends (`otlp.LeanEncoder`), turned into JSON here (`FileTransport`) by protobuf's own JSON
mapping, so files and collectors get one encoding.
`read_spans` reads ours and the Collector's alike, and skips (and counts) a line cut short by a
crash or a full disk instead of failing on it.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict

from otel_train.export.transport import OK, Outcome

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
#: Where OTLP JSON departs from protobuf's JSON mapping: ids are hex, not base64
#: (https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding).
_ID_KEYS = ("traceId", "spanId", "parentSpanId")


def _hex_ids(node: dict[str, Any]) -> None:
    for key in _ID_KEYS:
        value = node.get(key)
        if value is not None:
            node[key] = base64.b64decode(value).hex()


def trace_request_line(payload: bytes) -> bytes:
    """An encoded `ExportTraceServiceRequest` as one line of OTLP JSON (the OpenTelemetry
    Collector file exporter's format, ASCII): protobuf's JSON mapping (`json_format`; 64-bit
    integers as strings, enums as integers, as OTLP asks) with the ids turned to hex. Costs the
    exporter process ~27 µs of CPU a span, off the training thread
    (docs/benchmarks/2026-11-28-json-format.md)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    doc = MessageToDict(ExportTraceServiceRequest.FromString(payload), use_integers_for_enums=True)
    for resource_spans in doc.get("resourceSpans", ()):
        for scope_spans in resource_spans.get("scopeSpans", ()):
            for span in scope_spans.get("spans", ()):
                _hex_ids(span)
                for link in span.get("links", ()):
                    _hex_ids(link)
    return json.dumps(doc, separators=(",", ":")).encode("ascii")


def metrics_request_json(payload: bytes) -> str:
    """An encoded `ExportMetricsServiceRequest` as one line of OTLP JSON (no ids to fix up)."""
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
