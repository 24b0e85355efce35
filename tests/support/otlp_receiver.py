"""A real, in-process OTLP receiver for the test suite.

``OTLPReceiver`` speaks the actual OpenTelemetry Protocol, built on the
official ``opentelemetry-proto`` service definitions, so tests can point real
exporters (the SDK's gRPC and HTTP OTLP exporters, or code under test that
uses them) at it and then assert on what arrived:

* a gRPC server implementing ``TraceService``, ``MetricsService`` and
  ``LogsService`` (``Export`` RPCs, proper ``Export*ServiceResponse`` replies);
* an HTTP server accepting ``POST /v1/traces``, ``/v1/metrics`` and
  ``/v1/logs`` with ``application/x-protobuf`` or ``application/json`` bodies
  (OTLP/JSON, hex-encoded trace/span ids), optionally gzip-compressed.

Both listen on 127.0.0.1 with ports picked by the OS at start-up. Every request
is recorded together with its transport (``"grpc"`` or ``"http"``) and its
headers / gRPC metadata, so a test can check e.g. that
``OTEL_EXPORTER_OTLP_HEADERS`` reached the collector. ``spans()`` and
``metrics()`` flatten the received protobufs into plain dicts of plain Python
values; ``wait_for_spans()`` / ``wait_for_metrics()`` block (on a
``threading.Condition``) until the expected data shows up.

Faults a collector can have, for the fault suite (tests/test_faults.py):

* ``Fault`` / ``inject()``: answer the next trace requests with a gRPC status (with or without
  ``RetryInfo``) or an HTTP status (with ``Retry-After``), and/or after a delay; a refused
  request is recorded in ``refused``, never among the received;
* ``OTLPReceiver(tls=..., token=...)``: serve over TLS (``support.tls`` makes a CA and a
  certificate for 127.0.0.1) and refuse a request without ``authorization: Bearer <token>``
  (UNAUTHENTICATED / 401);
* ``close()`` then ``start()`` again: down and back on the same ports (a collector restart).

Two more helpers cover a collector that is not there at all:

* ``BlackHoleListener`` accepts TCP connections and never reads or answers
  (a "black-holed" collector that makes exporters hang until their timeout);
* ``free_port()`` returns a local port nobody listens on (an unreachable
  collector: connections are refused).
"""

from __future__ import annotations

import base64
import gzip
import http.server
import json
import selectors
import socket
import threading
import zlib
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.logs.v1 import (
    logs_service_pb2,
    logs_service_pb2_grpc,
)
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)
from opentelemetry.proto.collector.trace.v1 import (
    trace_service_pb2,
    trace_service_pb2_grpc,
)
from opentelemetry.proto.common.v1 import common_pb2

__all__ = [
    "BlackHoleListener",
    "OTLPReceiver",
    "ReceivedRequest",
    "free_port",
]

LOCALHOST = "127.0.0.1"

PlainValue = Any  # str | int | float | bool | bytes | None | list | dict
SpanDict = dict[str, Any]
MetricDict = dict[str, Any]
LogDict = dict[str, Any]

# signal name -> (request type, response type)
_SIGNALS: dict[str, tuple[type[Message], type[Message]]] = {
    "traces": (
        trace_service_pb2.ExportTraceServiceRequest,
        trace_service_pb2.ExportTraceServiceResponse,
    ),
    "metrics": (
        metrics_service_pb2.ExportMetricsServiceRequest,
        metrics_service_pb2.ExportMetricsServiceResponse,
    ),
    "logs": (
        logs_service_pb2.ExportLogsServiceRequest,
        logs_service_pb2.ExportLogsServiceResponse,
    ),
}

# OTLP/JSON encodes these bytes fields as hex, protobuf JSON as base64.
_HEX_ID_KEYS = frozenset(
    {"traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"}
)


# --------------------------------------------------------------------------- #
# Recorded requests
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class ReceivedRequest:
    """One export request as it arrived at the receiver."""

    transport: str  # "grpc" or "http"
    signal: str  # "traces", "metrics" or "logs"
    headers: dict[str, str]  # lower-cased names (HTTP headers / gRPC metadata)
    message: Message  # the decoded Export*ServiceRequest
    content_type: str = "application/grpc"
    content_encoding: str | None = None

    def has_headers(self, expected: Mapping[str, str]) -> bool:
        """True when every ``expected`` header arrived (names case-insensitive)."""
        return all(self.headers.get(k.lower()) == v for k, v in expected.items())


@dataclass
class Fault:
    """How to answer trace requests, for `count` of them (None: until `inject([])` clears it)."""

    grpc_code: grpc.StatusCode | None = None
    http_status: int | None = None
    retry_after_s: float | None = None  # gRPC RetryInfo / HTTP Retry-After, when given
    delay_s: float = 0.0  # before answering (a slow collector), refused or not
    gate: threading.Event | None = None  # answered only once set (60 s at most), before delay_s
    count: int | None = 1

    def refuses(self) -> bool:
        return self.grpc_code is not None or self.http_status is not None


# --------------------------------------------------------------------------- #
# Protobuf -> plain Python conversion
# --------------------------------------------------------------------------- #


def _hex_or_none(raw: bytes) -> str | None:
    return raw.hex() if raw else None


def any_value_to_python(value: common_pb2.AnyValue) -> PlainValue:
    """Decode an OTLP ``AnyValue`` into a plain Python value."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value_to_python(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return attributes_to_dict(value.kvlist_value.values)
    return getattr(value, kind)


def attributes_to_dict(attributes: Iterable[common_pb2.KeyValue]) -> dict[str, PlainValue]:
    """Decode a repeated ``KeyValue`` field into a dict."""
    return {kv.key: any_value_to_python(kv.value) for kv in attributes}


def _event_to_dict(event: Any) -> dict[str, Any]:
    return {
        "name": event.name,
        "time_ns": int(event.time_unix_nano),
        "attributes": attributes_to_dict(event.attributes),
    }


def _link_to_dict(link: Any) -> dict[str, Any]:
    return {
        "trace_id": link.trace_id.hex(),
        "span_id": link.span_id.hex(),
        "attributes": attributes_to_dict(link.attributes),
    }


def _span_to_dict(span: Any, resource: dict[str, Any], scope: str, transport: str) -> SpanDict:
    return {
        "name": span.name,
        "trace_id": span.trace_id.hex(),
        "span_id": span.span_id.hex(),
        "parent_span_id": _hex_or_none(span.parent_span_id),
        "start_ns": int(span.start_time_unix_nano),
        "end_ns": int(span.end_time_unix_nano),
        "attributes": attributes_to_dict(span.attributes),
        "resource": resource,
        "scope": scope,
        "events": [_event_to_dict(e) for e in span.events],
        "links": [_link_to_dict(link) for link in span.links],
        "status_code": int(span.status.code),
        "status_message": span.status.message,
        "kind": int(span.kind),
        "transport": transport,
    }


def _number_point_to_dict(point: Any) -> dict[str, Any]:
    which = point.WhichOneof("value")
    return {
        "attributes": attributes_to_dict(point.attributes),
        "value": getattr(point, which) if which else None,
        "start_ns": int(point.start_time_unix_nano),
        "time_ns": int(point.time_unix_nano),
    }


def _histogram_point_to_dict(point: Any) -> dict[str, Any]:
    return {
        "attributes": attributes_to_dict(point.attributes),
        "count": int(point.count),
        "sum": point.sum if point.HasField("sum") else None,
        "min": point.min if point.HasField("min") else None,
        "max": point.max if point.HasField("max") else None,
        "bucket_counts": [int(c) for c in point.bucket_counts],
        "explicit_bounds": list(point.explicit_bounds),
        "start_ns": int(point.start_time_unix_nano),
        "time_ns": int(point.time_unix_nano),
    }


def _generic_point_to_dict(point: Any) -> dict[str, Any]:
    """Fallback for exponential histograms and summaries."""
    plain = json_format.MessageToDict(point, preserving_proto_field_name=True)
    plain["attributes"] = attributes_to_dict(point.attributes)
    return plain


def _metric_to_dict(metric: Any, resource: dict[str, Any], scope: str, transport: str) -> MetricDict:
    kind = metric.WhichOneof("data")
    data = getattr(metric, kind) if kind else None
    result: MetricDict = {
        "name": metric.name,
        "description": metric.description,
        "unit": metric.unit,
        "type": kind,
        "resource": resource,
        "scope": scope,
        "transport": transport,
        "data_points": [],
    }
    if data is None:
        return result
    if kind in ("sum", "gauge"):
        result["data_points"] = [_number_point_to_dict(p) for p in data.data_points]
    elif kind == "histogram":
        result["data_points"] = [_histogram_point_to_dict(p) for p in data.data_points]
    else:
        result["data_points"] = [_generic_point_to_dict(p) for p in data.data_points]
    if kind == "sum":
        result["is_monotonic"] = bool(data.is_monotonic)
    if hasattr(data, "aggregation_temporality"):
        result["aggregation_temporality"] = int(data.aggregation_temporality)
    return result


def _log_to_dict(record: Any, resource: dict[str, Any], scope: str, transport: str) -> LogDict:
    return {
        "body": any_value_to_python(record.body),
        "severity_number": int(record.severity_number),
        "severity_text": record.severity_text,
        "attributes": attributes_to_dict(record.attributes),
        "time_ns": int(record.time_unix_nano),
        "trace_id": _hex_or_none(record.trace_id),
        "span_id": _hex_or_none(record.span_id),
        "resource": resource,
        "scope": scope,
        "transport": transport,
    }


def flatten_spans(request: ReceivedRequest) -> list[SpanDict]:
    """Flatten one ExportTraceServiceRequest into span dicts."""
    spans: list[SpanDict] = []
    for resource_spans in request.message.resource_spans:
        resource = attributes_to_dict(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope.name
            spans.extend(
                _span_to_dict(s, resource, scope, request.transport) for s in scope_spans.spans
            )
    return spans


def flatten_metrics(request: ReceivedRequest) -> list[MetricDict]:
    """Flatten one ExportMetricsServiceRequest into metric dicts."""
    metrics: list[MetricDict] = []
    for resource_metrics in request.message.resource_metrics:
        resource = attributes_to_dict(resource_metrics.resource.attributes)
        for scope_metrics in resource_metrics.scope_metrics:
            scope = scope_metrics.scope.name
            metrics.extend(
                _metric_to_dict(m, resource, scope, request.transport)
                for m in scope_metrics.metrics
            )
    return metrics


def flatten_logs(request: ReceivedRequest) -> list[LogDict]:
    """Flatten one ExportLogsServiceRequest into log record dicts."""
    logs: list[LogDict] = []
    for resource_logs in request.message.resource_logs:
        resource = attributes_to_dict(resource_logs.resource.attributes)
        for scope_logs in resource_logs.scope_logs:
            scope = scope_logs.scope.name
            logs.extend(
                _log_to_dict(r, resource, scope, request.transport) for r in scope_logs.log_records
            )
    return logs


# --------------------------------------------------------------------------- #
# OTLP/JSON helpers
# --------------------------------------------------------------------------- #


def _hex_to_base64(value: Any) -> Any:
    if not isinstance(value, str) or value == "":
        return value
    try:
        return base64.b64encode(bytes.fromhex(value)).decode("ascii")
    except ValueError:
        return value  # not hex: assume it already is base64


def _convert_ids(node: Any, convert: Callable[[Any], Any]) -> Any:
    """Recursively apply ``convert`` to every trace/span id field."""
    if isinstance(node, list):
        return [_convert_ids(item, convert) for item in node]
    if isinstance(node, dict):
        return {
            key: convert(value) if key in _HEX_ID_KEYS else _convert_ids(value, convert)
            for key, value in node.items()
        }
    return node


def parse_otlp_json(body: bytes, message_type: type[Message]) -> Message:
    """Parse an OTLP/JSON body (hex ids) into a protobuf message."""
    document = json.loads(body.decode("utf-8"))
    document = _convert_ids(document, _hex_to_base64)
    return json_format.ParseDict(document, message_type(), ignore_unknown_fields=True)


def to_otlp_json(message: Message) -> str:
    """Serialize a protobuf message as OTLP/JSON (hex ids)."""
    document = json_format.MessageToDict(message)
    document = _convert_ids(document, lambda v: base64.b64decode(v).hex() if v else v)
    return json.dumps(document)


def _resource_run_id(resource_doc: dict[str, Any]) -> str | None:
    for item in resource_doc.get("resource", {}).get("attributes", []):
        if item.get("key") == "ml.run.id":
            return item.get("value", {}).get("stringValue")
    return None


def _request_run_ids(request: ReceivedRequest) -> set[str | None]:
    """The `ml.run.id` of every resource in one export request."""
    resources = (getattr(request.message, field, ()) for field in ("resource_spans", "resource_metrics",
                                                                    "resource_logs"))
    return {attributes_to_dict(r.resource.attributes).get("ml.run.id") for group in resources for r in group}


def _decompress(body: bytes, encoding: str | None) -> bytes:
    encoding = (encoding or "identity").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding == "gzip":
        return gzip.decompress(body)
    if encoding == "deflate":
        return zlib.decompress(body)
    raise ValueError(f"unsupported Content-Encoding: {encoding}")


# --------------------------------------------------------------------------- #
# gRPC services
# --------------------------------------------------------------------------- #


def _metadata(context: grpc.ServicerContext) -> dict[str, str]:
    headers: dict[str, str] = {}
    for key, value in context.invocation_metadata() or ():
        headers[key.lower()] = value if isinstance(value, str) else repr(value)
    return headers


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OTLPReceiver) -> None:
        self._receiver = receiver

    def Export(self, request: Message, context: grpc.ServicerContext) -> Message:  # noqa: N802
        headers = _metadata(context)
        refusal = self._receiver._refusal("grpc", "traces", headers, request)
        if refusal is not None:
            code, retry_after_s, details = refusal
            if retry_after_s is not None:
                from google.protobuf.duration_pb2 import Duration
                from google.rpc.error_details_pb2 import RetryInfo

                delay = Duration(seconds=int(retry_after_s), nanos=int(retry_after_s % 1 * 1e9))
                context.set_trailing_metadata((("google.rpc.retryinfo-bin",
                                                RetryInfo(retry_delay=delay).SerializeToString()),))
            context.abort(code, details)
        self._receiver._record(ReceivedRequest("grpc", "traces", headers, request))
        return trace_service_pb2.ExportTraceServiceResponse()


class _MetricsService(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, receiver: OTLPReceiver) -> None:
        self._receiver = receiver

    def Export(self, request: Message, context: grpc.ServicerContext) -> Message:  # noqa: N802
        headers = _metadata(context)
        refusal = self._receiver._refusal("grpc", "metrics", headers, request)
        if refusal is not None:
            context.abort(refusal[0], refusal[2])
        self._receiver._record(ReceivedRequest("grpc", "metrics", headers, request))
        return metrics_service_pb2.ExportMetricsServiceResponse()


class _LogsService(logs_service_pb2_grpc.LogsServiceServicer):
    def __init__(self, receiver: OTLPReceiver) -> None:
        self._receiver = receiver

    def Export(self, request: Message, context: grpc.ServicerContext) -> Message:  # noqa: N802
        self._receiver._record(ReceivedRequest("grpc", "logs", _metadata(context), request))
        return logs_service_pb2.ExportLogsServiceResponse()


# --------------------------------------------------------------------------- #
# HTTP server
# --------------------------------------------------------------------------- #


class _OTLPHTTPHandler(http.server.BaseHTTPRequestHandler):
    """Handles ``POST /v1/{traces,metrics,logs}``; the receiver is on the server."""

    protocol_version = "HTTP/1.1"
    timeout = 10  # idle keep-alive connections are closed after this
    server: _OTLPHTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # keep test output quiet

    def do_POST(self) -> None:  # noqa: N802
        signal = self.path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
        if not self.path.startswith("/v1/") or signal not in _SIGNALS:
            self._reply(404, "text/plain", b"unknown OTLP path")
            return
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if content_type not in ("application/x-protobuf", "application/json"):
            self._reply(415, "text/plain", b"unsupported Content-Type")
            return
        try:
            message = self._decode(signal, content_type)
        except (ValueError, DecodeError, json_format.ParseError, OSError, EOFError) as exc:
            self._reply(400, "text/plain", f"bad OTLP request: {exc}".encode())
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        refusal = self.server.receiver._refusal("http", signal, headers, message)
        if refusal is not None:
            status, retry_after_s, details = refusal
            self._reply(status, "text/plain", details.encode(),
                        {"Retry-After": str(int(retry_after_s))} if retry_after_s is not None else None)
            return
        self.server.receiver._record(
            ReceivedRequest(
                "http",
                signal,
                headers,
                message,
                content_type=content_type,
                content_encoding=self.headers.get("Content-Encoding"),
            )
        )
        self._reply_empty(signal, content_type)

    def _decode(self, signal: str, content_type: str) -> Message:
        body = _decompress(self._read_body(), self.headers.get("Content-Encoding"))
        request_type = _SIGNALS[signal][0]
        if content_type == "application/json":
            return parse_otlp_json(body, request_type)
        message = request_type()
        message.ParseFromString(body)
        return message

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return self._read_chunked()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _read_chunked(self) -> bytes:
        chunks: list[bytes] = []
        while True:
            size = int(self.rfile.readline().split(b";", 1)[0].strip(), 16)
            if size == 0:
                self.rfile.readline()  # trailing CRLF after the last chunk
                return b"".join(chunks)
            chunks.append(self.rfile.read(size))
            self.rfile.readline()

    def _reply_empty(self, signal: str, content_type: str) -> None:
        response = _SIGNALS[signal][1]()
        if content_type == "application/json":
            self._reply(200, "application/json", to_otlp_json(response).encode())
        else:
            self._reply(200, "application/x-protobuf", response.SerializeToString())

    def _reply(self, status: int, content_type: str, body: bytes, extra: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        if status != 200:  # the body may be unread: do not reuse the connection
            self.close_connection = True
            self.send_header("Connection", "close")
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _OTLPHTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, receiver: OTLPReceiver, port: int = 0) -> None:
        super().__init__((LOCALHOST, port), _OTLPHTTPHandler)
        self.receiver = receiver
        if receiver.tls is not None:
            import ssl

            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(receiver.tls.cert_file, receiver.tls.key_file)
            self.socket = context.wrap_socket(self.socket, server_side=True)


# --------------------------------------------------------------------------- #
# The receiver
# --------------------------------------------------------------------------- #


class OTLPReceiver:
    """In-process OTLP collector (gRPC + HTTP) that records what it receives."""

    def __init__(self, max_workers: int = 8, tls: Any = None, token: str | None = None) -> None:
        self._max_workers = max_workers
        self.tls = tls  # `support.tls.TlsMaterial`: serve over TLS with its certificate
        self.token = token  # refuse requests without `authorization: Bearer <token>`
        self._cond = threading.Condition(threading.RLock())
        self._requests: list[ReceivedRequest] = []
        self.refused: list[tuple[str, str, str]] = []  # (transport, signal, reason) of every refused request
        self._faults: list[Fault] = []
        self._grpc_server: grpc.Server | None = None
        self._http_server: _OTLPHTTPServer | None = None
        self._http_thread: threading.Thread | None = None
        self._grpc_port: int | None = None
        self._http_port_fixed: int = 0  # after the first start: the same ports again (a restart)

    # -- lifecycle ---------------------------------------------------------- #

    def start(self) -> OTLPReceiver:
        """Start both servers (idempotent); returns ``self``."""
        if self._grpc_server is None:
            self._start_grpc()
        if self._http_server is None:
            self._start_http()
        return self

    def _start_grpc(self) -> None:
        server = grpc.server(
            ThreadPoolExecutor(max_workers=self._max_workers, thread_name_prefix="otlp-grpc"),
            options=[("grpc.so_reuseport", 0)],
        )
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(self), server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_MetricsService(self), server)
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(_LogsService(self), server)
        address = f"{LOCALHOST}:{self._grpc_port or 0}"
        if self.tls is not None:
            credentials = grpc.ssl_server_credentials([(self.tls.key_pem, self.tls.cert_pem)])
            port = server.add_secure_port(address, credentials)
        else:
            port = server.add_insecure_port(address)
        if port == 0:
            raise RuntimeError("could not bind the OTLP gRPC server")
        server.start()
        self._grpc_server, self._grpc_port = server, port

    def _start_http(self) -> None:
        server = _OTLPHTTPServer(self, self._http_port_fixed)
        self._http_port_fixed = int(server.server_address[1])
        thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="otlp-http",
            daemon=True,
        )
        thread.start()
        self._http_server, self._http_thread = server, thread

    def close(self) -> None:
        """Stop both servers (idempotent)."""
        if self._grpc_server is not None:
            self._grpc_server.stop(grace=None).wait(5)
            self._grpc_server = None
        if self._http_server is not None:
            self._http_server.shutdown()
            self._http_server.server_close()
            self._http_server = None
        if self._http_thread is not None:
            self._http_thread.join(5)
            self._http_thread = None
        with self._cond:
            self._cond.notify_all()

    def __enter__(self) -> OTLPReceiver:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- endpoints ---------------------------------------------------------- #

    @property
    def grpc_port(self) -> int:
        if self._grpc_port is None or self._grpc_server is None:
            raise RuntimeError("OTLPReceiver is not started")
        return self._grpc_port

    @property
    def http_port(self) -> int:
        if self._http_server is None:
            raise RuntimeError("OTLPReceiver is not started")
        return int(self._http_server.server_address[1])

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    @property
    def grpc_endpoint(self) -> str:
        return f"{self.scheme}://{LOCALHOST}:{self._grpc_port or self.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        return f"{self.scheme}://{LOCALHOST}:{self._http_port_fixed or self.http_port}"

    # -- faults ------------------------------------------------------------- #

    def inject(self, faults: list[Fault]) -> None:
        """Answer the coming trace requests as `faults` say, in order (an empty list: normally)."""
        with self._cond:
            self._faults = list(faults)

    def _refusal(self, transport: str, signal: str, headers: Mapping[str, str],
                 message: Message) -> tuple[Any, float | None, str] | None:
        """(gRPC code or HTTP status, retry delay, details) to refuse a request with, or None.
        The bearer token first; then, for traces, the next injected fault (delays included)."""
        if self.token is not None and headers.get("authorization") != f"Bearer {self.token}":
            with self._cond:
                self.refused.append((transport, signal, "unauthenticated"))
            return (grpc.StatusCode.UNAUTHENTICATED if transport == "grpc" else 401), None, "missing or wrong token"
        if signal != "traces":
            return None
        with self._cond:
            fault = self._faults[0] if self._faults else None
            if fault is not None and fault.count is not None:
                fault.count -= 1
                if fault.count <= 0:
                    self._faults.pop(0)
        if fault is None:
            return None
        if fault.gate is not None:
            fault.gate.wait(60)
        if fault.delay_s:
            import time

            time.sleep(fault.delay_s)
        if not fault.refuses():
            return None
        code: Any = fault.grpc_code if transport == "grpc" else fault.http_status
        if code is None:  # a fault for the other transport: this one answers normally
            return None
        with self._cond:
            self.refused.append((transport, signal, str(getattr(code, "name", code))))
            self._cond.notify_all()
        return code, fault.retry_after_s, "injected by the test"

    def wait_for_refusals(self, count: int, timeout: float = 30.0) -> int:
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.refused) >= count, timeout=timeout):
                raise TimeoutError(f"waited {timeout:.1f}s for {count} refusals, got {len(self.refused)}")
            return len(self.refused)

    # -- recording ---------------------------------------------------------- #

    def _record(self, request: ReceivedRequest) -> None:
        with self._cond:
            self._requests.append(request)
            self._cond.notify_all()

    def clear(self) -> None:
        """Forget everything received so far."""
        with self._cond:
            self._requests.clear()

    def forget_run(self, run_id: str) -> None:
        """Forget the requests that came from one run (`ml.run.id`), e.g. before launching it again."""
        with self._cond:
            self._requests = [r for r in self._requests if run_id not in _request_run_ids(r)]

    @property
    def requests(self) -> list[ReceivedRequest]:
        """A snapshot of every request received, oldest first."""
        with self._cond:
            return list(self._requests)

    def requests_for(self, signal: str, transport: str | None = None) -> list[ReceivedRequest]:
        """Requests of one signal (``traces``/``metrics``/``logs``), optionally one transport."""
        return [
            r
            for r in self.requests
            if r.signal == signal and (transport is None or r.transport == transport)
        ]

    def headers(self, signal: str | None = None) -> list[dict[str, str]]:
        """Headers / metadata of every request (optionally of one signal)."""
        return [r.headers for r in self.requests if signal is None or r.signal == signal]

    def saw_headers(self, expected: Mapping[str, str], signal: str | None = None) -> bool:
        """True when some request (optionally of one signal) carried all ``expected`` headers."""
        return any(
            r.has_headers(expected)
            for r in self.requests
            if signal is None or r.signal == signal
        )

    def dump_jsonl(self, path: str, run_id: str | None = None,
                   signals: tuple[str, ...] = ("traces", "metrics")) -> int:
        """Write what arrived as OTLP JSON lines, the OpenTelemetry Collector file exporter's
        format (and the embedded default's), which ``otel-train diagnose`` reads: one
        ``Export*ServiceRequest`` per line, in arrival order. With ``run_id``, only resources
        whose ``ml.run.id`` is that. Returns the number of lines written."""
        lines = 0
        with open(path, "w", encoding="utf-8") as out:
            for request in self.requests:
                if request.signal not in signals:
                    continue
                doc = json.loads(to_otlp_json(request.message))
                if run_id is not None:
                    for key in ("resourceSpans", "resourceMetrics", "resourceLogs"):
                        if key in doc:
                            doc[key] = [r for r in doc[key] if _resource_run_id(r) == run_id]
                            if not doc[key]:
                                doc = {}
                if doc:
                    out.write(json.dumps(doc, separators=(",", ":")) + "\n")
                    lines += 1
        return lines

    # -- flattened views ---------------------------------------------------- #

    def spans(self) -> list[SpanDict]:
        return [s for r in self.requests_for("traces") for s in flatten_spans(r)]

    def metrics(self) -> list[MetricDict]:
        return [m for r in self.requests_for("metrics") for m in flatten_metrics(r)]

    def logs(self) -> list[LogDict]:
        return [rec for r in self.requests_for("logs") for rec in flatten_logs(r)]

    # -- waiting ------------------------------------------------------------ #

    def _wait_for(
        self,
        what: str,
        collect: Callable[[], list[dict[str, Any]]],
        predicate: Callable[[dict[str, Any]], bool] | None,
        count: int | None,
        timeout: float,
    ) -> list[dict[str, Any]]:
        wanted = 1 if count is None else count
        found: list[dict[str, Any]] = []

        def ready() -> bool:
            nonlocal found
            found = [x for x in collect() if predicate is None or predicate(x)]
            return len(found) >= wanted

        with self._cond:
            if not self._cond.wait_for(ready, timeout=timeout):
                raise TimeoutError(
                    f"waited {timeout:.1f}s for {wanted} {what}, got {len(found)}: "
                    f"{sorted({str(x.get('name')) for x in collect()})}"
                )
        return found

    def wait_for_spans(
        self,
        predicate: Callable[[SpanDict], bool] | None = None,
        count: int | None = None,
        timeout: float = 30.0,
    ) -> list[SpanDict]:
        """Block until at least ``count`` (default 1) spans match ``predicate``.

        Returns the matching spans (all spans when ``predicate`` is None);
        raises ``TimeoutError`` if they do not arrive within ``timeout`` seconds.
        """
        return self._wait_for("spans", self.spans, predicate, count, timeout)

    def wait_for_metrics(
        self,
        predicate: Callable[[MetricDict], bool] | None = None,
        count: int | None = None,
        timeout: float = 30.0,
    ) -> list[MetricDict]:
        """Like :meth:`wait_for_spans`, for metric dicts."""
        return self._wait_for("metrics", self.metrics, predicate, count, timeout)

    def wait_for_logs(
        self,
        predicate: Callable[[LogDict], bool] | None = None,
        count: int | None = None,
        timeout: float = 30.0,
    ) -> list[LogDict]:
        """Like :meth:`wait_for_spans`, for log record dicts."""
        return self._wait_for("log records", self.logs, predicate, count, timeout)


# --------------------------------------------------------------------------- #
# Failure-mode helpers
# --------------------------------------------------------------------------- #


class BlackHoleListener:
    """A TCP listener that accepts connections and never reads or replies.

    Accepted sockets are held open until :meth:`close`, so a client sees a
    connected peer that simply never answers (a black-holed collector).
    """

    def __init__(self) -> None:
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((LOCALHOST, 0))
        self._listener.listen(128)
        self._listener.setblocking(False)
        self._wake_r, self._wake_w = socket.socketpair()
        self._held: list[socket.socket] = []
        self._lock = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._accept_loop, name="black-hole", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    @property
    def endpoint(self) -> str:
        return f"http://{LOCALHOST}:{self.port}"

    @property
    def connection_count(self) -> int:
        """Number of connections accepted so far."""
        with self._lock:
            return len(self._held)

    def wait_for_connections(self, count: int = 1, timeout: float = 5.0) -> int:
        """Block until ``count`` connections were accepted; returns the number held."""
        with self._lock:
            if not self._lock.wait_for(lambda: len(self._held) >= count, timeout=timeout):
                raise TimeoutError(f"waited {timeout:.1f}s for {count} connection(s)")
            return len(self._held)

    def _accept_loop(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while True:
                for key, _ in selector.select():
                    if key.fileobj is self._wake_r:
                        return
                    self._accept_one()

    def _accept_one(self) -> None:
        try:
            conn, _ = self._listener.accept()
        except (BlockingIOError, OSError):
            return
        with self._lock:
            self._held.append(conn)
            self._lock.notify_all()

    def close(self) -> None:
        """Stop accepting and drop every held connection (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._wake_w.send(b"x")
        self._thread.join(5)
        with self._lock:
            for conn in self._held:
                conn.close()
            self._held.clear()
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()

    def __enter__(self) -> BlackHoleListener:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, read, released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOCALHOST, 0))
        return int(sock.getsockname()[1])


def unreachable_endpoint() -> str:
    """``http://127.0.0.1:<free_port()>``: connections to it are refused."""
    return f"http://{LOCALHOST}:{free_port()}"
