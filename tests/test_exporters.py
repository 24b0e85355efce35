"""Exporters: the embedded default's OTLP JSON matches the official encoder and reads back
losslessly (`export/otlp_json.py`); OTLP headers are parsed as the specification says
(`export/exporters.py`)."""

from __future__ import annotations

import base64
import json

from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, Status, StatusCode, TraceFlags

from otel_train.export.exporters import parse_headers
from otel_train.export.otlp_json import FileSpanExporter, read_spans, spans_to_otlp_json

_ID_KEYS = ("traceId", "spanId", "parentSpanId")


def _spans() -> list[ReadableSpan]:
    resource = Resource({"service.name": "svc", "ml.rank": 1})
    scope = InstrumentationScope("otel_train", "1.0")
    flags = TraceFlags(TraceFlags.SAMPLED)
    root = SpanContext(0xA1, 0xB1, False, flags)
    return [
        ReadableSpan("train.step", context=root, resource=resource, instrumentation_scope=scope,
                     attributes={"train.step": 3, "train.step.tags": ("eval", "gc"), "train.step.time_s": 0.25,
                                 "ok": True},
                     events=[Event("loss.spike", {"loss": 9.5}, 1_700_000_000_000_000_500)],
                     links=[Link(SpanContext(0xC1, 0xD1, True, flags))],
                     start_time=1_700_000_000_000_000_000, end_time=1_700_000_000_250_000_000),
        ReadableSpan("train.forward", context=SpanContext(0xA1, 0xB2, False, flags), parent=root,
                     resource=resource, instrumentation_scope=scope, attributes={"train.micro_batch": 0},
                     status=Status(StatusCode.ERROR, "ValueError"),
                     start_time=1_700_000_000_000_000_100, end_time=1_700_000_000_100_000_000),
    ]


def _hex_to_b64(node: object) -> object:
    if isinstance(node, dict):
        return {k: base64.b64encode(bytes.fromhex(v)).decode() if k in _ID_KEYS else _hex_to_b64(v)
                for k, v in node.items()}
    if isinstance(node, list):
        return [_hex_to_b64(v) for v in node]
    return node


def test_json_parses_into_the_official_message_equal_to_the_official_encoding() -> None:
    ours = spans_to_otlp_json(_spans())
    parsed = json_format.ParseDict(_hex_to_b64(ours), ExportTraceServiceRequest())
    official = encode_spans(_spans())
    ours_spans = [s for rs in parsed.resource_spans for ss in rs.scope_spans for s in ss.spans]
    official_spans = [s for rs in official.resource_spans for ss in rs.scope_spans for s in ss.spans]
    for mine, theirs in zip(ours_spans, official_spans, strict=True):
        theirs.ClearField("flags")  # the official encoder adds W3C flag bits we do not write
        mine.ClearField("flags")
        for link in theirs.links:
            link.ClearField("flags")
        assert mine == theirs
    assert parsed.resource_spans[0].resource == official.resource_spans[0].resource


def test_file_exporter_roundtrip(tmp_path) -> None:
    path = tmp_path / "run" / "traces-rank1.jsonl"
    exporter = FileSpanExporter(path)
    exporter.export(_spans())
    exporter.export(_spans()[:1])
    exporter.shutdown()
    assert len(path.read_text().splitlines()) == 2 and json.loads(path.read_text().splitlines()[0])
    spans = list(read_spans(path))
    assert [s["name"] for s in spans] == ["train.step", "train.forward", "train.step"]
    step, fwd = spans[0], spans[1]
    assert step["trace_id"] == f"{0xA1:032x}" and step["parent_span_id"] is None
    assert fwd["parent_span_id"] == f"{0xB1:016x}" and fwd["status_code"] == 2
    assert step["attributes"] == {"train.step": 3, "train.step.tags": ["eval", "gc"], "train.step.time_s": 0.25,
                                  "ok": True}
    assert step["resource"] == {"service.name": "svc", "ml.rank": 1}
    assert step["events"][0]["name"] == "loss.spike" and step["links"][0]["span_id"] == f"{0xD1:016x}"


def test_unwritable_output_dir_fails_the_export_not_the_run(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = FileSpanExporter(blocker / "sub" / "traces.jsonl").export(_spans())
    assert result.name == "FAILURE"


def test_headers_parse_and_bad_items_are_named(caplog) -> None:
    assert parse_headers("Authorization=Bearer%20x, x-team = ml") == {"authorization": "Bearer x", "x-team": "ml"}
    assert parse_headers("novalue,a=b") == {"a": "b"}
    assert "'novalue'" in caplog.text
