"""The trace requests' OTLP JSON line read straight off the protobuf wire in C (`_otlp_json.c`):
the same bytes as the Python converter (`otlp_json.trace_request_json_python`, protobuf's parse
and `json.dumps`) for any request, and Python's answer wherever the C reader declines one."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
from support.procs import pytest_without
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from otel_train.export import otlp_json
from otel_train.export.otlp_json import FileTransport, trace_request_json_python, trace_request_line

_otlp_json = pytest.importorskip("otel_train.export._otlp_json", reason="the C converter was not built")

#: Characters a string is drawn from: every JSON escape, DEL, Latin-1, the BMP's edges, non-BMP.
_CHARS = ["a", "Z", "0", " ", "~", '"', "\\", "/", "\b", "\f", "\n", "\r", "\t", "\x00", "\x1f", "\x7f", "\x80",
          "é", "\u2028", "\ufeff", "\uffff", "中", "\U0001f600", "\U0010ffff", "{", "}", ":", ","]
_DOUBLES = [0.0, -0.0, 1.0, -2.5, 0.1, 1e16, 1e-7, 123456789.123, 1e300, 5e-324, -1.7976931348623157e308,
            math.inf, -math.inf, math.nan, 3.0000000000000004]
_INTS = [0, 1, -1, 127, 128, 2**31 - 1, -(2**31), 2**53 + 1, 2**63 - 1, -(2**63)]


def _text(rng: random.Random) -> str:
    return "".join(rng.choice(_CHARS) for _ in range(rng.randrange(0, 9)))


def _value(rng: random.Random, value: AnyValue, depth: int = 0) -> None:
    kind = rng.randrange(8 if depth < 2 else 5)
    if kind == 0:
        value.string_value = _text(rng)
    elif kind == 1:
        value.bool_value = rng.random() < 0.5
    elif kind == 2:
        value.int_value = rng.choice(_INTS + [rng.randrange(-(2**63), 2**63)])
    elif kind == 3:
        value.double_value = rng.choice(_DOUBLES + [rng.uniform(-1e6, 1e6)])
    elif kind == 4:
        value.bytes_value = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 7)))
    elif kind == 5:
        value.array_value.SetInParent()
        for _ in range(rng.randrange(0, 4)):
            _value(rng, value.array_value.values.add(), depth + 1)
    elif kind == 6:
        value.kvlist_value.SetInParent()
        _attributes(rng, value.kvlist_value.values, depth + 1)
    # kind 7: no value at all


def _attributes(rng: random.Random, into: object, depth: int = 0) -> None:
    for _ in range(rng.randrange(0, 5)):
        kv: KeyValue = into.add()  # type: ignore[attr-defined]
        kv.key = _text(rng)
        if rng.random() < 0.9:
            _value(rng, kv.value, depth)


def _span(rng: random.Random, span: Span) -> None:
    span.trace_id = rng.randbytes(rng.choice([16, 16, 0]))
    span.span_id = rng.randbytes(rng.choice([8, 8, 0]))
    if rng.random() < 0.6:
        span.parent_span_id = rng.randbytes(rng.choice([8, 0]))
    if rng.random() < 0.3:
        span.trace_state = "k=v"
    span.flags = rng.choice([0, 0x100, 0x300])
    span.name = _text(rng)
    span.kind = rng.randrange(0, 6)
    span.start_time_unix_nano = rng.randrange(2**64)
    span.end_time_unix_nano = rng.choice([0, 1_700_000_000_000_000_000, 2**64 - 1])
    _attributes(rng, span.attributes)
    span.dropped_attributes_count = rng.choice([0, 3])
    for _ in range(rng.choice([0, 0, 1, 2])):
        event = span.events.add()
        event.time_unix_nano = rng.randrange(2**64)
        event.name = _text(rng)
        _attributes(rng, event.attributes)
    for _ in range(rng.choice([0, 0, 1, 2])):
        link = span.links.add()
        link.trace_id, link.span_id = rng.randbytes(16), rng.randbytes(8)
        link.flags = 0x100
        _attributes(rng, link.attributes)
    choice = rng.randrange(4)
    if choice == 1:
        span.status.code = Status.STATUS_CODE_ERROR
    elif choice == 2:
        span.status.message = _text(rng) or "x"
    elif choice == 3:
        span.status.SetInParent()  # present and empty, as the encoder's tail writes it


def _request(seed: int) -> ExportTraceServiceRequest:
    rng = random.Random(seed)
    request = ExportTraceServiceRequest()
    for _ in range(rng.choice([0, 1, 1, 2])):
        rs = request.resource_spans.add()
        if rng.random() < 0.8:
            _attributes(rng, rs.resource.attributes)
        for _ in range(rng.choice([0, 1, 1, 2])):
            ss = rs.scope_spans.add()
            if rng.random() < 0.8:
                ss.scope.name, ss.scope.version = _text(rng), _text(rng)
            for _ in range(rng.randrange(0, 4)):
                _span(rng, ss.spans.add())
    return request


def test_the_c_reader_writes_the_python_converter_s_bytes_for_any_request() -> None:
    for seed in range(800):
        payload = _request(seed).SerializeToString()
        line = _otlp_json.trace_request(payload)
        assert line == trace_request_json_python(payload).encode("ascii"), seed


def test_the_pipeline_s_own_requests_convert_byte_for_byte(tmp_path: Path) -> None:
    """What the exporter process sends: a run's records through the real assembler and encoder."""
    from test_exporters import _payload
    payload = _payload()
    assert _otlp_json.trace_request(payload) == trace_request_json_python(payload).encode("ascii")
    path = tmp_path / "traces.jsonl"
    assert FileTransport(path).send(payload, 1.0).ok
    assert path.read_bytes() == trace_request_json_python(payload).encode("ascii") + b"\n"
    assert json.loads(path.read_text())["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["name"] == "train.step"


def _field(number: int, wire_type: int, body: bytes) -> bytes:
    tag = bytes([number << 3 | wire_type]) if number < 16 else bytes([(number << 3 | wire_type) & 0x7F | 0x80,
                                                                        (number << 3 | wire_type) >> 7])
    return tag + (bytes([len(body)]) + body if wire_type == 2 else body)


def _wrap_span(span: bytes) -> bytes:
    """`span` (a Span's fields) inside a request: resource_spans { scope_spans { spans } }."""
    return _field(1, 2, _field(2, 2, _field(2, 2, span)))


@pytest.mark.parametrize("span, why", [
    (_field(5, 0, b"\x01"), "the name as a varint: a wire type its field does not have"),
    (_field(15, 2, _field(3, 0, b"\x02")) + _field(15, 2, b""), "status twice: protobuf merges the two"),
    (_field(9, 2, _field(1, 2, b"k") + _field(2, 2, _field(1, 2, b"s") + _field(3, 0, b"\x05"))),
     "an attribute value with two members of its oneof"),
    (_field(5, 2, b"\xc3\x28"), "a name that is not UTF-8"),
    (_field(5, 2, b"\xed\xa0\x80"), "a name holding a surrogate"),
    (_field(5, 2, b"\xc0\xaf"), "an overlong UTF-8 form"),
    (_field(5, 2, b"ab\xe4\xb8"), "a name cut short inside a character"),
])
def test_the_c_reader_declines_what_it_cannot_render_exactly_and_python_answers(span: bytes, why: str) -> None:
    payload = _wrap_span(span)
    with pytest.raises(ValueError):
        _otlp_json.trace_request(payload)
    try:
        expected: object = trace_request_json_python(payload).encode("ascii")
    except Exception as err:  # noqa: BLE001 - protobuf refuses it too: the line must fail the same way
        with pytest.raises(type(err)):
            trace_request_line(payload)
    else:
        assert trace_request_line(payload) == expected, why


def test_a_truncated_request_is_declined_not_read_past_its_end() -> None:
    payload = _request(7).SerializeToString()
    assert payload
    for cut in range(1, len(payload)):
        try:
            line = _otlp_json.trace_request(payload[:cut])
        except ValueError:
            continue
        # A cut between two whole fields is itself a valid, shorter request.
        assert line == trace_request_json_python(payload[:cut]).encode("ascii"), cut


def test_corrupted_requests_never_render_differently() -> None:
    """Random byte edits of valid requests: the C reader declines, or writes protobuf's bytes.
    It does not check what it skips (a trace state's UTF-8, a scope's own attributes), so it
    may write a request protobuf refuses as corrupt (DecodeError), from the fields it reads,
    where the Python converter writes nothing; never another rendering of one it parses."""
    from google.protobuf.message import DecodeError

    rng = random.Random(5)
    seeds = [_request(seed).SerializeToString() for seed in range(100)]
    rendered = 0
    for _ in range(20000):
        payload = bytearray(rng.choice(seeds))
        for _ in range(rng.randrange(1, 4)):
            if not payload:
                break
            i, edit = rng.randrange(len(payload)), rng.randrange(3)
            if edit == 0:
                payload[i] = rng.randrange(256)
            elif edit == 1:
                del payload[i:i + rng.randrange(1, 5)]
            else:
                payload[i:i] = rng.randbytes(rng.randrange(1, 4))
        try:
            line = _otlp_json.trace_request(bytes(payload))
        except ValueError:
            continue
        try:
            expected = trace_request_json_python(bytes(payload)).encode("ascii")
        except DecodeError:
            continue
        assert line == expected, bytes(payload).hex()
        rendered += 1
    assert rendered > 500  # enough edits left a request both read


def test_unknown_and_unrendered_fields_are_skipped_as_python_skips_them() -> None:
    span = Span(name="s", trace_id=b"\x01" * 16, span_id=b"\x02" * 8).SerializeToString()
    extra = _field(50, 2, b"xyz") + _field(51, 0, b"\x96\x01") + _field(52, 5, b"\x00\x00\x00\x00") \
        + _field(53, 1, b"\x00" * 8)
    payload = _wrap_span(span + extra) + _field(9, 2, b"future")
    assert _otlp_json.trace_request(payload) == trace_request_json_python(payload).encode("ascii")


def test_fields_written_out_with_their_default_values_render_as_absent_ones() -> None:
    """protobuf's serializer leaves out a default scalar; another encoder may write it: an empty
    parent span id, name or status message, a zero kind or time."""
    span = (_field(1, 2, b"\x01" * 16) + _field(2, 2, b"\x02" * 8) + _field(4, 2, b"") + _field(5, 2, b"")
            + _field(6, 0, b"\x00") + _field(7, 1, b"\x00" * 8)
            + _field(15, 2, _field(2, 2, b"") + _field(3, 0, b"\x00")))
    payload = _wrap_span(span)
    line = _otlp_json.trace_request(payload)
    assert line == trace_request_json_python(payload).encode("ascii")
    assert b"parentSpanId" not in line and b'"status":{}' in line


def test_the_file_transport_writes_the_same_line_without_the_c_module(tmp_path: Path, monkeypatch) -> None:
    payload = _request(3).SerializeToString()
    with_c = tmp_path / "c.jsonl"
    assert FileTransport(with_c).send(payload, 1.0).ok
    monkeypatch.setattr(otlp_json, "_otlp_json", None)
    without = tmp_path / "py.jsonl"
    assert FileTransport(without).send(payload, 1.0).ok
    assert with_c.read_bytes() == without.read_bytes()


def test_the_exporter_tests_pass_without_the_c_module() -> None:
    proc = pytest_without("otel_train.export._otlp_json",
                          "from otel_train.export import otlp_json\nassert otlp_json._otlp_json is None",
                          ["tests/test_exporters.py"])
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout
