"""The lean OTLP encoder writes exactly the message the official encoder builds."""

from __future__ import annotations

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, Status, StatusCode, TraceFlags

from otel_train._otlp import LeanEncoder, LeanSpanBatch

RESOURCE = {"service.name": "svc", "ml.rank": 3, "ml.run.id": "r", "x.ratio": 0.5, "x.flag": True}
FLAGS = TraceFlags(TraceFlags.SAMPLED)
SPANS = [  # (name, trace, span, parent, parent_remote, start, end, attrs, events, links, code, message)
    ("train.step", 2**127 + 5, 2**63 + 7, 0x99, True, 1_700_000_000_000_000_000, 1_700_000_000_250_000_000,
     {"train.step": 12, "train.step.tags": ("eval", "gc"), "train.step.time_s": 0.25, "neg": -3},
     [("loss.spike", 1_700_000_000_000_000_500, {"loss": 9.5, "why": "é"})], [(0xC1, 0xD1)], 0, None),
    ("train.forward", 2**127 + 5, 0xB2, 2**63 + 7, False, 1_700_000_000_000_000_100, 1_700_000_000_100_000_000,
     {"train.micro_batch": 0, "ok": False, "ints": (1, 2, 3)}, None, [], 2, "ValueError"),
    ("train.checkpoint", 77, 78, None, False, 5, 6, {}, None, [], 0, None),
]


def _readable(span: tuple) -> ReadableSpan:
    name, trace, sid, parent, remote, start, end, attrs, events, links, code, message = span
    return ReadableSpan(
        name, context=SpanContext(trace, sid, False, FLAGS),
        parent=SpanContext(trace, parent, remote, FLAGS) if parent else None,
        resource=Resource(RESOURCE), instrumentation_scope=InstrumentationScope("otel_train", "1.2"),
        attributes=attrs, events=[Event(n, a, t) for n, t, a in events or ()],
        links=[Link(SpanContext(t, s, True, FLAGS)) for t, s in links],
        status=Status(StatusCode(code), message), start_time=start, end_time=end)


def test_lean_bytes_parse_into_the_official_message() -> None:
    encoder = LeanEncoder(RESOURCE, "otel_train", "1.2")
    for _ in range(2):  # the second pass is served from the caches
        (batch,) = encoder.batches(SPANS, len(SPANS), 1 << 30)
        lean = ExportTraceServiceRequest.FromString(batch.payload)
        assert lean == encode_spans([_readable(s) for s in SPANS])


def test_batch_reports_its_span_count() -> None:
    assert len(LeanSpanBatch(b"", 7)) == 7


def test_batches_are_cut_by_count_and_by_bytes() -> None:
    encoder = LeanEncoder(RESOURCE, "otel_train", "1.0")
    spans = [("s", 1, i + 1, None, False, 0, 1, {"big": "x" * 1000}, None, [], 0, None) for i in range(10)]
    by_count = encoder.batches(spans, 4, 1 << 20)
    assert [b.count for b in by_count] == [4, 4, 2]
    by_bytes = encoder.batches(spans, 100, 2500)  # two ~1 KB spans fit, a third does not
    assert [b.count for b in by_bytes] == [2, 2, 2, 2, 2]
    assert all(len(b.payload) <= 2600 for b in by_bytes)
    for batch in by_count + by_bytes:  # each is a whole request, parseable on its own
        request = ExportTraceServiceRequest.FromString(batch.payload)
        assert sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans) == batch.count
    assert [s.span_id for b in by_count for s in ExportTraceServiceRequest.FromString(b.payload)
            .resource_spans[0].scope_spans[0].spans] == [(i + 1).to_bytes(8, "big") for i in range(10)]
