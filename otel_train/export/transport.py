"""OTLP transports: one encoded export request to a collector, and what became of it.

`GrpcTransport` and `HttpTransport` send bytes that are an `Export*ServiceRequest` already
(`otlp.LeanEncoder`, or the SDK's metrics encoder) and classify the answer as the OTLP
specification says (https://opentelemetry.io/docs/specs/otlp/#failures):

- retryable: gRPC UNAVAILABLE, CANCELLED, DEADLINE_EXCEEDED, ABORTED, OUT_OF_RANGE, DATA_LOSS,
  and RESOURCE_EXHAUSTED only when the server sent `RetryInfo`; HTTP 429, 502, 503, 504; a
  connection that failed or timed out. The server's delay (`RetryInfo`, `Retry-After`) is
  passed on.
- not retryable: everything else (INVALID_ARGUMENT, UNAUTHENTICATED, PERMISSION_DENIED,
  HTTP 400, 401, 403, 404, 413, ...): the request is dropped, counted, and said once with
  what to check.

A transport tries once; retrying, keeping and counting is `delivery.Delivery`'s job. Nothing
here ever prints a header value.
"""

from __future__ import annotations

import email.utils
import gzip
import http.client
import os
import ssl
import sys
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Protocol

from otel_train.export.destination import Destination

_USER_AGENT = "otel-train"


@dataclass(frozen=True)
class Outcome:
    """What became of one request."""

    ok: bool
    retry: bool = False
    """A failure the specification says to retry."""
    delay_s: float | None = None
    """The server's own delay before a retry (gRPC RetryInfo, HTTP Retry-After)."""
    reason: str = ""
    """A short name of the failure (`UNAVAILABLE`, `HTTP 401`, `connection refused`)."""
    hint: str = ""
    """What to check, for the one message a kind of failure gets."""
    rejected: int = 0
    """Items a successful request's partial success said were rejected."""
    unanswered: bool = False
    """Sent, and no answer came in time: the collector may have taken it (a timeout after the
    request went out). Retried with a longer timeout; counted as `unconfirmed` if it never
    gets an answer, as possibly `duplicated` if a retry succeeds."""


OK = Outcome(True)


class Transport(Protocol):
    def send(self, payload: bytes, timeout_s: float) -> Outcome: ...

    def close(self) -> None: ...


# --- gRPC --------------------------------------------------------------------------------------
_GRPC_METHODS = {"traces": "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                 "metrics": "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"}
_GRPC_RETRYABLE = frozenset(("UNAVAILABLE", "CANCELLED", "DEADLINE_EXCEEDED", "ABORTED", "OUT_OF_RANGE",
                             "DATA_LOSS"))
_GRPC_HINTS = {
    "UNAUTHENTICATED": "the collector refused the credentials: check OTEL_EXPORTER_OTLP_HEADERS",
    "PERMISSION_DENIED": "the collector refused the credentials: check OTEL_EXPORTER_OTLP_HEADERS",
    "UNIMPLEMENTED": "the endpoint does not serve OTLP over gRPC (the HTTP port, 4318? set "
                     "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf)",
    "INVALID_ARGUMENT": "the collector rejected the request as malformed",
    "RESOURCE_EXHAUSTED": "the collector refused the request (too large, or over a limit) without asking for a "
                          "retry",
    "INTERNAL": "an internal error, in the collector or in the gRPC channel before the request left",
    "UNKNOWN": "an unknown error, in the collector or in the gRPC channel",
}
#: What a retryable code says: only UNAVAILABLE means the collector could not be reached.
_GRPC_RETRY_HINTS = {
    "UNAVAILABLE": "the collector is not reachable",
    "DEADLINE_EXCEEDED": "no answer within OTEL_EXPORTER_OTLP_TIMEOUT (a slow or overloaded collector)",
    "RESOURCE_EXHAUSTED": "the collector is over a limit and asked to retry later",
    "ABORTED": "the collector aborted the request",
    "CANCELLED": "the request was cancelled",
}
_TLS_WORDS = ("ssl", "tls", "certificate", "handshake")
_TLS_HINT = ("the TLS handshake failed: check OTEL_EXPORTER_OTLP_CERTIFICATE (the CA that signed the collector's "
             "certificate); nothing is sent in plaintext instead")


def _read(path: str | None) -> bytes | None:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


class GrpcTransport:
    """Unary OTLP/gRPC `Export` calls on one channel, request bytes passed through as they are."""

    def __init__(self, dest: Destination) -> None:
        if "grpc" not in sys.modules and "GRPC_VERBOSITY" not in os.environ:
            # First to import gRPC here (the training process exporting itself: thread mode,
            # or taking over from an exporter that never started): its C core's own log lines
            # ("Handshake failed ...") would repeat what our one message says. Read once, at
            # import; a user who imports gRPC first, or sets it, keeps theirs.
            os.environ["GRPC_VERBOSITY"] = "NONE"
        import grpc

        self._grpc = grpc
        # Reconnect soon after a collector comes back (gRPC's own default backs off to 120 s),
        # and leave retrying to `Delivery`, which keeps what failed.
        # A call on a channel that is between reconnects fails at once, so the reconnect backoff
        # caps how soon a collector that came back is seen: at 2 s, one back 3 s into a 5 s
        # shutdown bound was seen too late. A reconnect is one refused connect: cheap.
        options = [("grpc.initial_reconnect_backoff_ms", 200), ("grpc.min_reconnect_backoff_ms", 200),
                   ("grpc.max_reconnect_backoff_ms", 500), ("grpc.enable_retries", 0),
                   ("grpc.primary_user_agent", _USER_AGENT)]
        compression = grpc.Compression.Gzip if dest.compression == "gzip" else None
        if dest.secure:
            credentials = grpc.ssl_channel_credentials(_read(dest.certificate), _read(dest.client_key),
                                                       _read(dest.client_certificate))
            self._channel = grpc.secure_channel(dest.target, credentials, options, compression)
        else:
            self._channel = grpc.insecure_channel(dest.target, options, compression)
        self._call = self._channel.unary_unary(_GRPC_METHODS[dest.signal], request_serializer=None,
                                               response_deserializer=None, _registered_method=True)
        # gRPC raises TypeError for a `-bin` key (binary metadata) with a str value.
        self._metadata = tuple((k, v.encode("utf-8") if k.endswith("-bin") else v) for k, v in dest.headers) or None
        self._signal = dest.signal

    def send(self, payload: bytes, timeout_s: float) -> Outcome:
        try:
            response = self._call(payload, timeout=max(0.001, timeout_s), metadata=self._metadata,
                                  wait_for_ready=False)
        except self._grpc.RpcError as err:
            return _grpc_outcome(err)
        return Outcome(True, rejected=_partial_rejections(self._signal, response))

    def close(self) -> None:
        self._channel.close()


def _grpc_outcome(err: Any) -> Outcome:
    code = err.code() if hasattr(err, "code") else None
    name = getattr(code, "name", "UNKNOWN")
    details = (err.details() if hasattr(err, "details") else "") or ""
    delay = _retry_info(err)
    tls = any(word in details.lower() for word in _TLS_WORDS)
    if name in _GRPC_RETRYABLE or (name == "RESOURCE_EXHAUSTED" and delay is not None):
        reason = name if name != "UNAVAILABLE" or not tls else "UNAVAILABLE (TLS handshake failed)"
        hint = _TLS_HINT if tls else _GRPC_RETRY_HINTS.get(name, f"the collector answered {name}, to be retried")
        return Outcome(False, True, delay, reason, hint, unanswered=name == "DEADLINE_EXCEEDED")
    return Outcome(False, False, None, name, _GRPC_HINTS.get(name, f"the collector answered {name}"))


def _retry_info(err: Any) -> float | None:
    """The delay a `google.rpc.RetryInfo` in the error's trailers asks for, if any."""
    try:
        trailers = dict(err.trailing_metadata() or ())
    except Exception:  # noqa: BLE001 - a channel-level error has no trailers
        return None
    raw = trailers.get("google.rpc.retryinfo-bin")
    details = trailers.get("grpc-status-details-bin")
    try:
        from google.rpc import error_details_pb2, status_pb2

        if raw is not None:
            info = error_details_pb2.RetryInfo.FromString(raw)
            return info.retry_delay.seconds + info.retry_delay.nanos / 1e9
        if details is not None:
            for any_detail in status_pb2.Status.FromString(details).details:
                if any_detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                    info = error_details_pb2.RetryInfo()
                    any_detail.Unpack(info)
                    return info.retry_delay.seconds + info.retry_delay.nanos / 1e9
    except Exception:  # noqa: BLE001 - malformed details: no delay
        return None
    return None


def _partial_rejections(signal: str, response: bytes | None) -> int:
    """Items an `Export*ServiceResponse`'s partial success rejected (0 for the usual empty reply)."""
    if not response:
        return 0
    try:
        if signal == "traces":
            from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
            return int(ExportTraceServiceResponse.FromString(response).partial_success.rejected_spans)
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse
        return int(ExportMetricsServiceResponse.FromString(response).partial_success.rejected_data_points)
    except Exception:  # noqa: BLE001 - not a response we can read: nothing said rejected
        return 0


# --- HTTP --------------------------------------------------------------------------------------
_HTTP_RETRY_HINTS = {
    429: "the collector is over a limit and asked to retry later",
    502: "a proxy in front of the collector could not reach it",
    503: "the collector is unavailable for now",
    504: "a proxy in front of the collector got no answer from it in time",
}
_HTTP_RETRYABLE = frozenset(_HTTP_RETRY_HINTS)
_HTTP_HINTS = {
    400: "the collector rejected the request as malformed",
    401: "the collector refused the credentials: check OTEL_EXPORTER_OTLP_HEADERS",
    403: "the collector refused the credentials: check OTEL_EXPORTER_OTLP_HEADERS",
    404: "no OTLP receiver at this URL (the gRPC port, 4317? set OTEL_EXPORTER_OTLP_PROTOCOL=grpc)",
    413: "the collector refused the request as too large",
}


class HttpTransport:
    """OTLP/HTTP protobuf POSTs on one kept-alive connection (the standard library's http.client)."""

    def __init__(self, dest: Destination) -> None:
        url = urllib.parse.urlsplit(dest.target)
        self._secure = url.scheme.lower() == "https"
        self._host = url.hostname or "localhost"
        self._port = url.port or (443 if self._secure else 80)
        self._path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        self._headers = {"Content-Type": "application/x-protobuf", "User-Agent": _USER_AGENT, **dict(dest.headers)}
        self._gzip = dest.compression == "gzip"
        if self._gzip:
            self._headers["Content-Encoding"] = "gzip"
        self._context: ssl.SSLContext | None = None
        if self._secure:
            self._context = ssl.create_default_context(cafile=dest.certificate)
            if dest.client_certificate:
                self._context.load_cert_chain(dest.client_certificate, dest.client_key)
        self._conn: http.client.HTTPConnection | None = None
        self._signal = dest.signal

    def _connection(self, timeout_s: float) -> http.client.HTTPConnection:
        if self._conn is None:
            if self._secure:
                self._conn = http.client.HTTPSConnection(self._host, self._port, timeout=timeout_s,
                                                         context=self._context)
            else:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout_s)
        self._conn.timeout = timeout_s
        if self._conn.sock is not None:
            self._conn.sock.settimeout(timeout_s)
        return self._conn

    def send(self, payload: bytes, timeout_s: float) -> Outcome:
        body = gzip.compress(payload, 6) if self._gzip else payload
        sent = False
        try:
            conn = self._connection(max(0.001, timeout_s))
            conn.request("POST", self._path, body, self._headers)
            sent = True
            response = conn.getresponse()
            data = response.read()
        except ssl.SSLError as err:
            self.close()
            return Outcome(False, True, None, f"TLS error ({err.reason or err.__class__.__name__})", _TLS_HINT,
                           unanswered=sent)
        except (OSError, http.client.HTTPException) as err:
            self.close()
            if sent:  # the request went out: after a timeout the collector may have it
                timed_out = isinstance(err, TimeoutError)
                return Outcome(False, True, None, f"no answer ({_network_reason(err)})",
                               "no answer within OTEL_EXPORTER_OTLP_TIMEOUT (a slow or overloaded collector)"
                               if timed_out else "the connection closed before an answer", unanswered=timed_out)
            return Outcome(False, True, None, _network_reason(err), "the collector is not reachable")
        status = response.status
        if 200 <= status < 300:
            return Outcome(True, rejected=_partial_rejections(self._signal, data)
                           if response.getheader("Content-Type", "").startswith("application/x-protobuf") else 0)
        if response.getheader("Connection", "").lower() == "close":
            self.close()
        if status in _HTTP_RETRYABLE:
            return Outcome(False, True, _retry_after(response.getheader("Retry-After")), f"HTTP {status}",
                           _HTTP_RETRY_HINTS[status])
        return Outcome(False, False, None, f"HTTP {status}", _HTTP_HINTS.get(status, f"the collector answered {status}"))

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _network_reason(err: BaseException) -> str:
    if isinstance(err, ConnectionRefusedError):
        return "connection refused"
    if isinstance(err, TimeoutError):
        return "timed out"
    return type(err).__name__


def _retry_after(value: str | None) -> float | None:
    """`Retry-After` as seconds: a number, or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
