"""transport: the OTLP specification's retry rules, status by status, against the suite's receiver.

Each case sends one real request (gRPC or HTTP/protobuf) to `support.otlp_receiver` told to
answer with a status, and checks what the transport makes of it: retryable or not, the server's
delay, a message that says what to check. Retrying itself is `Delivery`'s (tests/test_delivery.py).
"""

from __future__ import annotations

import dataclasses
import email.utils
import time
from collections.abc import Iterator

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1 import trace_pb2
from support.otlp_receiver import Fault, OTLPReceiver

from otel_train.export.destination import Destination
from otel_train.export.transport import GrpcTransport, HttpTransport, _retry_after

S = grpc.StatusCode
GRPC_RETRYABLE = [S.UNAVAILABLE, S.CANCELLED, S.DEADLINE_EXCEEDED, S.ABORTED, S.OUT_OF_RANGE, S.DATA_LOSS]
GRPC_FINAL = [S.INVALID_ARGUMENT, S.UNAUTHENTICATED, S.PERMISSION_DENIED, S.NOT_FOUND, S.UNIMPLEMENTED,
              S.RESOURCE_EXHAUSTED, S.FAILED_PRECONDITION, S.INTERNAL, S.UNKNOWN, S.ALREADY_EXISTS]
HTTP_RETRYABLE = [429, 502, 503, 504]
HTTP_FINAL = [400, 401, 403, 404, 405, 413, 415, 500]


def _payload() -> bytes:
    span = trace_pb2.Span(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="train.step",
                          start_time_unix_nano=1, end_time_unix_nano=2)
    request = ExportTraceServiceRequest(resource_spans=[trace_pb2.ResourceSpans(
        scope_spans=[trace_pb2.ScopeSpans(spans=[span])])])
    return request.SerializeToString()


@pytest.fixture(scope="module")
def receiver() -> Iterator[OTLPReceiver]:
    with OTLPReceiver() as r:
        yield r


def _dest(receiver: OTLPReceiver, protocol: str, **kw: object) -> Destination:
    if protocol == "grpc":
        return Destination("traces", "otlp", "grpc", receiver.grpc_endpoint, f"127.0.0.1:{receiver.grpc_port}", **kw)
    return Destination("traces", "otlp", "http/protobuf", receiver.http_endpoint,
                       f"{receiver.http_endpoint}/v1/traces", **kw)


def _send(receiver: OTLPReceiver, protocol: str, fault: Fault | None, timeout_s: float = 5.0):
    receiver.inject([dataclasses.replace(fault)] if fault else [])
    transport = GrpcTransport(_dest(receiver, protocol)) if protocol == "grpc" else \
        HttpTransport(_dest(receiver, protocol))
    try:
        return transport.send(_payload(), timeout_s)
    finally:
        transport.close()
        receiver.inject([])


@pytest.mark.parametrize("code", GRPC_RETRYABLE, ids=lambda c: c.name)
def test_grpc_retryable_codes(receiver: OTLPReceiver, code: grpc.StatusCode) -> None:
    outcome = _send(receiver, "grpc", Fault(grpc_code=code))
    assert not outcome.ok and outcome.retry and outcome.reason == code.name and outcome.delay_s is None
    # Issue 53: the words say what the code means; only UNAVAILABLE is "not reachable".
    assert ("not reachable" in outcome.hint) == (code == S.UNAVAILABLE), outcome.hint


@pytest.mark.parametrize("code", GRPC_FINAL, ids=lambda c: c.name)
def test_grpc_codes_never_retried(receiver: OTLPReceiver, code: grpc.StatusCode) -> None:
    outcome = _send(receiver, "grpc", Fault(grpc_code=code))
    assert not outcome.ok and not outcome.retry and outcome.reason == code.name
    if code in (S.UNAUTHENTICATED, S.PERMISSION_DENIED):
        assert "OTEL_EXPORTER_OTLP_HEADERS" in outcome.hint


def test_grpc_resource_exhausted_with_retry_info_is_retried_after_its_delay(receiver: OTLPReceiver) -> None:
    outcome = _send(receiver, "grpc", Fault(grpc_code=S.RESOURCE_EXHAUSTED, retry_after_s=2.5))
    assert outcome.retry and outcome.delay_s == pytest.approx(2.5)
    assert "over a limit" in outcome.hint and "not reachable" not in outcome.hint


def test_grpc_an_answer_past_the_timeout_is_deadline_exceeded_and_retryable(receiver: OTLPReceiver) -> None:
    outcome = _send(receiver, "grpc", Fault(delay_s=1.0), timeout_s=0.2)
    assert outcome.retry and outcome.reason == "DEADLINE_EXCEEDED"
    assert outcome.unanswered and "OTEL_EXPORTER_OTLP_TIMEOUT" in outcome.hint  # it may have arrived


def test_http_an_answer_past_the_timeout_is_unanswered_and_retryable(receiver: OTLPReceiver) -> None:
    outcome = _send(receiver, "http/protobuf", Fault(delay_s=1.0), timeout_s=0.2)
    assert outcome.retry and outcome.unanswered and "OTEL_EXPORTER_OTLP_TIMEOUT" in outcome.hint


@pytest.mark.parametrize("status", HTTP_RETRYABLE)
def test_http_retryable_statuses_honour_retry_after(receiver: OTLPReceiver, status: int) -> None:
    outcome = _send(receiver, "http/protobuf", Fault(http_status=status, retry_after_s=3))
    assert not outcome.ok and outcome.retry and outcome.delay_s == 3.0 and outcome.reason == f"HTTP {status}"
    assert ("proxy" in outcome.hint) == (status in (502, 504)), outcome.hint


@pytest.mark.parametrize("status", HTTP_FINAL)
def test_http_statuses_never_retried(receiver: OTLPReceiver, status: int) -> None:
    outcome = _send(receiver, "http/protobuf", Fault(http_status=status))
    assert not outcome.ok and not outcome.retry and outcome.reason == f"HTTP {status}"
    if status in (401, 403):
        assert "OTEL_EXPORTER_OTLP_HEADERS" in outcome.hint


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_accepted_and_nothing_listening(receiver: OTLPReceiver, protocol: str) -> None:
    assert _send(receiver, protocol, None).ok
    with OTLPReceiver() as gone:
        dest = _dest(gone, protocol)
    transport = GrpcTransport(dest) if protocol == "grpc" else HttpTransport(dest)
    outcome = transport.send(_payload(), 2.0)
    transport.close()
    assert not outcome.ok and outcome.retry  # a collector not (yet) there: kept for later


def test_retry_after_as_seconds_or_an_http_date() -> None:
    assert _retry_after("7") == 7.0
    assert _retry_after(None) is None and _retry_after("soon") is None
    later = email.utils.formatdate(time.time() + 120, usegmt=True)
    assert 100 < _retry_after(later) <= 120
    assert _retry_after(email.utils.formatdate(time.time() - 60, usegmt=True)) == 0.0
