"""Tests of the in-process OTLP receiver, driven by the plain OpenTelemetry SDK."""

from __future__ import annotations

import gzip
import json
import socket
import urllib.request
from collections.abc import Iterator

import pytest
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
from opentelemetry.trace import Link, SpanKind, Tracer
from support.otlp_receiver import BlackHoleListener, OTLPReceiver, free_port

pytestmark = pytest.mark.timeout(20)

RESOURCE = Resource.create({"service.name": "receiver-test", "deployment.environment": "ci"})
SECRET_HEADER = {"x-test-token": "s3cret"}


def _tracer_provider(exporter: SpanExporter) -> TracerProvider:
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def _emit_parent_child(tracer: Tracer) -> tuple[str, str]:
    """Emit a linked root span with a child; return (trace_id, root span_id) hex."""
    with tracer.start_as_current_span("linked-from") as other:
        link_ctx = other.get_span_context()
    with tracer.start_as_current_span(
        "root",
        kind=SpanKind.SERVER,
        attributes={"tags": ["a", "b"], "step": 3, "lr": 0.5, "ok": True},
        links=[Link(link_ctx, {"why": "test"})],
    ) as root:
        root.add_event("checkpoint", {"epoch": 1})
        with tracer.start_as_current_span("child", attributes={"layer": "fc1"}):
            pass
    ctx = root.get_span_context()
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


@pytest.fixture
def grpc_tracer(fresh_receiver: OTLPReceiver) -> Iterator[Tracer]:
    exporter = GrpcSpanExporter(
        endpoint=fresh_receiver.grpc_endpoint, insecure=True, headers=SECRET_HEADER, timeout=5
    )
    provider = _tracer_provider(exporter)
    yield provider.get_tracer("grpc-scope")
    provider.shutdown()


@pytest.fixture
def http_tracer(fresh_receiver: OTLPReceiver) -> Iterator[Tracer]:
    exporter = HttpSpanExporter(
        endpoint=f"{fresh_receiver.http_endpoint}/v1/traces",
        headers=SECRET_HEADER,
        compression=Compression.Gzip,
        timeout=5,
    )
    provider = _tracer_provider(exporter)
    yield provider.get_tracer("http-scope")
    provider.shutdown()


def _check_spans(receiver: OTLPReceiver, trace_id: str, root_id: str, transport: str) -> None:
    spans = {s["name"]: s for s in receiver.wait_for_spans(count=3, timeout=5)}
    root, child, other = spans["root"], spans["child"], spans["linked-from"]
    assert root["trace_id"] == trace_id and len(trace_id) == 32
    assert root["span_id"] == root_id and len(root_id) == 16
    assert root["parent_span_id"] is None
    assert child["parent_span_id"] == root_id and child["trace_id"] == trace_id
    assert root["attributes"] == {"tags": ["a", "b"], "step": 3, "lr": 0.5, "ok": True}
    assert child["attributes"] == {"layer": "fc1"}
    assert root["resource"]["service.name"] == "receiver-test"
    assert root["resource"]["deployment.environment"] == "ci"
    assert root["events"][0]["name"] == "checkpoint"
    assert root["events"][0]["attributes"] == {"epoch": 1}
    assert root["start_ns"] <= root["events"][0]["time_ns"] <= root["end_ns"]
    assert root["links"] == [
        {"trace_id": other["trace_id"], "span_id": other["span_id"], "attributes": {"why": "test"}}
    ]
    assert root["kind"] == 2  # SPAN_KIND_SERVER
    assert {s["transport"] for s in spans.values()} == {transport}
    assert receiver.saw_headers(SECRET_HEADER, signal="traces")


def test_spans_over_grpc(fresh_receiver: OTLPReceiver, grpc_tracer: Tracer) -> None:
    trace_id, root_id = _emit_parent_child(grpc_tracer)
    _check_spans(fresh_receiver, trace_id, root_id, "grpc")
    assert all(r.transport == "grpc" for r in fresh_receiver.requests)
    assert fresh_receiver.spans()[0]["scope"] == "grpc-scope"


def test_spans_over_http_gzip(fresh_receiver: OTLPReceiver, http_tracer: Tracer) -> None:
    trace_id, root_id = _emit_parent_child(http_tracer)
    _check_spans(fresh_receiver, trace_id, root_id, "http")
    request = fresh_receiver.requests[0]
    assert request.content_type == "application/x-protobuf"
    assert request.content_encoding == "gzip"


def test_wait_for_spans_predicate_and_timeout(
    fresh_receiver: OTLPReceiver, grpc_tracer: Tracer
) -> None:
    _emit_parent_child(grpc_tracer)
    children = fresh_receiver.wait_for_spans(lambda s: s["name"] == "child", timeout=5)
    assert [s["name"] for s in children] == ["child"]
    with pytest.raises(TimeoutError):
        fresh_receiver.wait_for_spans(lambda s: s["name"] == "never", timeout=0.2)
    fresh_receiver.clear()
    assert fresh_receiver.spans() == [] and fresh_receiver.requests == []


def test_metrics_over_grpc(fresh_receiver: OTLPReceiver) -> None:
    exporter = OTLPMetricExporter(
        endpoint=fresh_receiver.grpc_endpoint, insecure=True, headers=SECRET_HEADER, timeout=5
    )
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=60_000)
    provider = MeterProvider(resource=RESOURCE, metric_readers=[reader])
    meter = provider.get_meter("metrics-scope")
    counter = meter.create_counter("train.steps", unit="1")
    histogram = meter.create_histogram("train.step_time", unit="s")
    counter.add(2, {"phase": "train"})
    counter.add(3, {"phase": "train"})
    for value in (0.5, 1.5, 7.0):
        histogram.record(value, {"phase": "train"})
    try:
        assert provider.force_flush(timeout_millis=5_000)
        got = fresh_receiver.wait_for_metrics(
            lambda m: m["name"] in ("train.steps", "train.step_time"), count=2, timeout=5
        )
    finally:
        provider.shutdown(timeout_millis=5_000)
    by_name = {m["name"]: m for m in got}
    steps, step_time = by_name["train.steps"], by_name["train.step_time"]
    assert steps["type"] == "sum" and steps["unit"] == "1" and steps["is_monotonic"]
    assert steps["data_points"][0]["value"] == 5
    assert steps["data_points"][0]["attributes"] == {"phase": "train"}
    assert step_time["type"] == "histogram" and step_time["unit"] == "s"
    point = step_time["data_points"][0]
    assert point["count"] == 3 and point["sum"] == pytest.approx(9.0)
    assert sum(point["bucket_counts"]) == 3
    assert steps["resource"]["service.name"] == "receiver-test"
    assert steps["transport"] == "grpc"
    assert fresh_receiver.saw_headers(SECRET_HEADER, signal="metrics")


def _otlp_json_body(trace_id: str, span_id: str, parent_id: str) -> dict:
    attribute_list = {"arrayValue": {"values": [{"stringValue": "x"}, {"intValue": "7"}]}}
    return {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": "json-svc"}}]
                },
                "scopeSpans": [
                    {
                        "scope": {"name": "json-scope"},
                        "spans": [
                            {
                                "traceId": trace_id,
                                "spanId": span_id,
                                "parentSpanId": parent_id,
                                "name": "json-span",
                                "kind": 3,
                                "startTimeUnixNano": "1000",
                                "endTimeUnixNano": "2000",
                                "attributes": [
                                    {"key": "n", "value": {"intValue": "42"}},
                                    {"key": "f", "value": {"doubleValue": 1.25}},
                                    {"key": "l", "value": attribute_list},
                                ],
                                "links": [{"traceId": trace_id, "spanId": parent_id}],
                                "status": {"code": 2, "message": "boom"},
                            }
                        ],
                    }
                ],
            }
        ]
    }


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, str, bytes]:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=5) as response:
        return response.status, response.headers.get("Content-Type"), response.read()


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
def test_json_post(fresh_receiver: OTLPReceiver, compress: bool) -> None:
    trace_id, span_id, parent_id = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", "00f067aa0ba902b7"
    body = json.dumps(_otlp_json_body(trace_id, span_id, parent_id)).encode()
    headers = {"Content-Type": "application/json", "X-Custom": "yes"}
    if compress:
        body, headers["Content-Encoding"] = gzip.compress(body), "gzip"
    status, content_type, reply = _post(f"{fresh_receiver.http_endpoint}/v1/traces", body, headers)
    assert status == 200 and content_type == "application/json"
    assert json.loads(reply) == {}
    [span] = fresh_receiver.wait_for_spans(timeout=5)
    assert (span["trace_id"], span["span_id"], span["parent_span_id"]) == (trace_id, span_id, parent_id)
    assert span["attributes"] == {"n": 42, "f": 1.25, "l": ["x", 7]}
    assert span["links"] == [{"trace_id": trace_id, "span_id": parent_id, "attributes": {}}]
    assert (span["start_ns"], span["end_ns"], span["kind"], span["status_code"]) == (1000, 2000, 3, 2)
    assert span["resource"] == {"service.name": "json-svc"} and span["scope"] == "json-scope"
    assert span["transport"] == "http"
    assert fresh_receiver.saw_headers({"X-Custom": "yes"})


def test_http_rejects_unknown_path_and_type(fresh_receiver: OTLPReceiver) -> None:
    for path, content_type, code in (
        ("/v1/nope", "application/x-protobuf", 404),
        ("/v1/traces", "text/plain", 415),
        ("/v1/traces", "application/x-protobuf", 400),
    ):
        with pytest.raises(urllib.error.HTTPError) as info:
            _post(f"{fresh_receiver.http_endpoint}{path}", b"\xff\xff", {"Content-Type": content_type})
        info.value.close()
        assert info.value.code == code
    assert fresh_receiver.requests == []


def test_endpoints_are_local_and_distinct(otlp_receiver: OTLPReceiver) -> None:
    assert otlp_receiver.grpc_endpoint == f"http://127.0.0.1:{otlp_receiver.grpc_port}"
    assert otlp_receiver.http_endpoint == f"http://127.0.0.1:{otlp_receiver.http_port}"
    assert otlp_receiver.grpc_port != otlp_receiver.http_port


def test_context_manager_closes() -> None:
    with OTLPReceiver() as receiver:
        port = receiver.http_port
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_black_hole_accepts_and_never_answers() -> None:
    with BlackHoleListener() as hole:
        assert hole.endpoint == f"http://127.0.0.1:{hole.port}"
        with socket.create_connection(("127.0.0.1", hole.port), timeout=1) as conn:
            conn.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
            assert hole.wait_for_connections(1, timeout=2) == 1
            conn.settimeout(0.3)
            with pytest.raises(socket.timeout):
                conn.recv(1)


def test_free_port_refuses_connections() -> None:
    port = free_port()
    assert 0 < port < 65536
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_forget_run_drops_that_runs_requests_only(fresh_receiver: OTLPReceiver) -> None:
    for run_id in ("first", "second"):
        exporter = GrpcSpanExporter(endpoint=fresh_receiver.grpc_endpoint, insecure=True, timeout=5)
        provider = TracerProvider(resource=Resource.create({"service.name": "t", "ml.run.id": run_id}))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        with provider.get_tracer("t").start_as_current_span(f"span-of-{run_id}"):
            pass
        provider.shutdown()
    fresh_receiver.forget_run("first")
    assert [s["name"] for s in fresh_receiver.spans()] == ["span-of-second"]
