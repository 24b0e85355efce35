"""The embedded default's files (`export/otlp_json.py`): the OTLP JSON line is the encoded request
the OTLP exporters send, it reads back losslessly, and a file that cannot be written costs an
export, never a partial or glued line."""

from __future__ import annotations

import base64
import json
import math
import os
import resource
import signal
import subprocess
import sys
import textwrap

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList

from otel_train.export.otlp import LeanEncoder
from otel_train.export.otlp_json import FileTransport, read_spans, trace_request_line

_ID_KEYS = ("traceId", "spanId", "parentSpanId")
RESOURCE = {"service.name": "svc", "ml.rank": 1}


def _payload() -> bytes:
    """Two spans as the pipeline encodes them: a step with tags, an event and a link; a failed forward."""
    step = ("train.step", 0xA1, 0xB1, None, False, 1_700_000_000_000_000_000, 1_700_000_000_250_000_000,
            {"train.step": 3, "train.step.tags": ("eval", "gc"), "train.step.time_s": 0.25, "ok": True},
            [("loss.spike", 1_700_000_000_000_000_500, {"loss": 9.5})], [(0xC1, 0xD1)], 0, None)
    fwd = ("train.forward", 0xA1, 0xB2, 0xB1, False, 1_700_000_000_000_000_100, 1_700_000_000_100_000_000,
           {"train.micro_batch": 0}, None, None, 2, "ValueError")
    (batch,) = LeanEncoder(RESOURCE, "otel_train", "1.0").batches([step, fwd], 10, 1 << 20)
    return batch.payload


def _hex_to_b64(node: object) -> object:
    if isinstance(node, dict):
        return {k: base64.b64encode(bytes.fromhex(v)).decode() if k in _ID_KEYS else _hex_to_b64(v)
                for k, v in node.items()}
    if isinstance(node, list):
        return [_hex_to_b64(v) for v in node]
    return node


def test_the_json_line_parses_into_the_request_it_was_made_from() -> None:
    payload = _payload()
    parsed = json_format.ParseDict(_hex_to_b64(json.loads(trace_request_line(payload))), ExportTraceServiceRequest())
    assert parsed == ExportTraceServiceRequest.FromString(payload)


def test_any_request_reads_back_with_hex_ids_and_ascii_text() -> None:
    """What OTLP JSON asks beyond protobuf's JSON mapping (ids as lowercase hex), and what a
    line must survive: 64-bit integers, NaN and infinities, bytes, nested values, text outside
    ASCII and JSON's escapes, an empty id left out."""
    request = ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    span = spans.add(trace_id=bytes(range(16)), span_id=b"\xab" * 8, parent_span_id=b"\x00" * 7 + b"\x01",
                     name="é\u2028\"\n\U0001f600", kind=2, start_time_unix_nano=2**64 - 1, end_time_unix_nano=1)
    span.links.add(trace_id=b"\xff" * 16, span_id=b"\x10" * 8, flags=0x301)
    span.events.add(name="e", time_unix_nano=2**63)
    values = [AnyValue(int_value=-(2**63)), AnyValue(double_value=math.nan), AnyValue(double_value=-math.inf),
              AnyValue(bytes_value=b"\x00\xff"), AnyValue(bool_value=True)]
    values.append(AnyValue(array_value=ArrayValue(values=values[:2])))
    values.append(AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key="k\t", value=values[0])])))
    span.attributes.extend(KeyValue(key=f"a{i}", value=v) for i, v in enumerate(values))
    spans.add(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="root")  # no parent id: none written
    line = trace_request_line(request.SerializeToString())
    assert line.isascii() and b"\n" not in line
    doc = json.loads(line)
    first, root = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
    assert (first["traceId"], first["spanId"], first["parentSpanId"]) == (bytes(range(16)).hex(), "ab" * 8,
                                                                         "0000000000000001")
    assert first["links"][0]["traceId"] == "ff" * 16 and first["startTimeUnixNano"] == str(2**64 - 1)
    assert "parentSpanId" not in root
    parsed = json_format.ParseDict(_hex_to_b64(doc), ExportTraceServiceRequest())
    assert str(parsed) == str(request)  # NaN is not equal to itself: compare the text form


def test_file_roundtrip(tmp_path) -> None:
    path = tmp_path / "run" / "traces-rank1.jsonl"
    out = FileTransport(path)
    assert out.send(_payload(), 1.0).ok and out.send(_payload(), 1.0).ok
    out.close()
    assert len(path.read_text().splitlines()) == 2
    assert oct(path.stat().st_mode & 0o777) == "0o600" and oct(path.parent.stat().st_mode & 0o777) == "0o700"
    spans = list(read_spans(path))
    assert [s["name"] for s in spans] == ["train.step", "train.forward"] * 2
    step, fwd = spans[0], spans[1]
    assert step["trace_id"] == f"{0xA1:032x}" and step["parent_span_id"] is None
    assert fwd["parent_span_id"] == f"{0xB1:016x}" and fwd["status_code"] == 2
    assert step["attributes"] == {"train.step": 3, "train.step.tags": ["eval", "gc"], "train.step.time_s": 0.25,
                                  "ok": True}
    assert step["resource"] == RESOURCE
    assert step["events"][0]["name"] == "loss.spike" and step["links"][0]["span_id"] == f"{0xD1:016x}"


def test_an_unwritable_output_dir_fails_the_export_not_the_run(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    outcome = FileTransport(blocker / "sub" / "traces.jsonl").send(_payload(), 1.0)
    assert not outcome.ok and not outcome.retry and "OTEL_TRAIN_OUTPUT_DIR" in outcome.hint


def test_a_full_disk_leaves_whole_lines_and_exact_counts(tmp_path) -> None:
    """A size limit (RLIMIT_FSIZE, what a full disk does to one file) part-way through a line:
    the line is cut back, the next ones fail whole, every line left parses, and what the writer
    said it wrote is what reads back."""
    path = tmp_path / "traces.jsonl"
    code = textwrap.dedent(f"""
        import resource, signal, sys
        from otel_train.export.otlp_json import FileTransport
        payload = bytes.fromhex(sys.argv[1])
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2500, 2500))
        out = FileTransport({str(path)!r})
        results = [out.send(payload, 1.0) for _ in range(8)]
        print(sum(r.ok for r in results), sorted({{r.reason for r in results if not r.ok}}))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", code, _payload().hex()], capture_output=True, text=True, env=env,
                          timeout=60, check=True)
    ok, reasons = proc.stdout.split(" ", 1)
    lines = path.read_text().splitlines()
    assert 0 < int(ok) < 8 and "File too large" in reasons
    assert len(lines) == int(ok) and all(json.loads(line) for line in lines)
    assert len(list(read_spans(path))) == 2 * int(ok)
    assert resource and signal  # the limits above are Linux's (this suite runs there)


def test_reading_skips_a_line_cut_short(tmp_path, caplog) -> None:
    path = tmp_path / "traces.jsonl"
    line = trace_request_line(_payload()).decode("ascii")
    path.write_text(line + "\n" + line[: len(line) // 2] + "\n" + line + "\n")
    assert len(list(read_spans(path))) == 4
    assert "1 line(s)" in caplog.text
