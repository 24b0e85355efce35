"""The exporter's fast path (`otel_train/export/fast_path.py`) against the general path: the same
spans and metrics, the same records left for the general path, the one definition of span ids;
and a packed drain, unpacked in the exporter, encoded as its records would be."""

from __future__ import annotations

import struct
import sys
from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource

from otel_train._distributed import RunInfo
from otel_train.export import fast_path, span_ids
from otel_train.export.attributes import AttributeCleaner
from otel_train.export.otlp import LeanEncoder
from otel_train.export.pipeline import ExportPipeline
from otel_train.export.spans import SpanAssembler
from otel_train.record import recorder as _recorder
from otel_train.record.clock import FakeClock
from otel_train.wire import schema

sys.path.insert(0, "tests")
from test_otlp import RESOURCE, _assemble, mixed_records  # noqa: E402


def _edge_records() -> list:
    """What the mixed records lack: one unhashable attribute, regions after a step ended
    (`After`) and before any, nested parents, a step number beyond int64."""
    clock = FakeClock()
    recorder = _recorder.Recorder(1024, clock)
    _recorder.install(recorder)
    try:
        with _recorder.Region("before.any.step", **{"x.nan": float("nan")}):
            clock.advance(3)
        for n in (5, 6, 2**70, 8):
            with _recorder.Step(n, None):
                with _recorder.Region("train.forward", **{"x.list": [1, 2]}):  # unhashable: general path
                    clock.advance(11)
                with _recorder.Region("train.optimizer"):
                    with _recorder.Region("clip", **{"x.big": 2**70}):
                        clock.advance(13)
                    with _recorder.Region("clip", **{"x.i": n}):
                        clock.advance(17)
            with _recorder.Region("between.steps", **{"x.f": 0.25}):  # after step n ended
                clock.advance(19)
    finally:
        _recorder.install(None)
    return list(recorder.buf)


def _fast(records: list, rank: int, step_sample: int, offset: int,
          salt: int = 0xDEADBEEF12345678) -> tuple[list, list, dict]:
    durations: dict[str, list[int]] = {}
    assembler = SpanAssembler(RunInfo(run_id="r", rank=rank), salt, Resource(RESOURCE),
                              AttributeCleaner(16), lambda spans: None, step_sample=step_sample,
                              encoder=LeanEncoder(RESOURCE, "otel_train", "1.2"))
    out: list = []
    rest = assembler.fast_path.regions(records, offset, out, durations)
    return out, rest, durations


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("step_sample", [1, 2])  # 2: the odd steps' regions are counted, not sent
def test_the_edge_records_encode_as_the_general_path_does(rank: int, step_sample: int) -> None:
    """An unhashable or out-of-range attribute, regions before any step and after one ended,
    nested parents, a step number beyond int64: the same spans and metrics either way."""
    records = mixed_records() + _edge_records()
    fast_spans, fast_metrics, encoded = _assemble(records, 10**18, fast=True, rank=rank, step_sample=step_sample)
    general_spans, general_metrics, _ = _assemble(records, 10**18, fast=False, rank=rank, step_sample=step_sample)
    assert encoded and fast_spans
    assert (fast_spans, fast_metrics) == (general_spans, general_metrics)


def test_the_records_left_and_the_durations() -> None:
    """What the region loop leaves for the general path (steps, an exception or event, an
    unhashable or unusual value, a sibling) in order, and a duration for every region it took,
    sampled out or not."""
    batch = mixed_records() + _edge_records()
    out, rest, durations = _fast(batch, 0, 2, 10**18)
    taken = [r for r in batch if not any(r is kept for kept in rest)]
    assert out and rest and taken
    assert all(r[schema.REC_KIND] == schema.KIND_SPAN for r in taken)
    assert [r for r in batch if any(r is kept for kept in rest)] == rest  # in order
    expected: dict[str, list[int]] = {}
    for r in taken:
        expected.setdefault(r[schema.REC_NAME], []).append(r[schema.REC_T1] - r[schema.REC_T0])
    assert durations == expected
    assert len(out) < len(taken)  # step_sample 2: the odd steps' regions counted, not sent


def test_caches_cleared_in_the_middle_of_a_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """`FastPath.body` and `FastPath.step` clear their caches past `_CACHE_MAX`, here on almost every
    miss: the loop must hold what it took from them, and write what it would with full caches."""
    batch = mixed_records() + _edge_records()
    expected = [_fast(batch, rank, 1, 0) for rank in (0, 1)]
    monkeypatch.setattr(fast_path, "_CACHE_MAX", 2)
    monkeypatch.setattr(span_ids, "_CACHE_MAX", 2)
    assert [_fast(batch, rank, 1, 0) for rank in (0, 1)] == expected


def test_an_all_zero_span_id_becomes_one() -> None:
    """A salt that maps one region's sequence number to 0, an invalid OTLP id: it goes out as 1."""
    from otel_train.wire.ids import MASK64, REGION_ID_MULTIPLIER

    batch = mixed_records()
    seq = next(r[2] for r in batch if r[0] == schema.KIND_SPAN and r[1] == "inner")
    salt = (seq * REGION_ID_MULTIPLIER) & MASK64
    out = _fast(batch, 0, 1, 0, salt)[0]
    assert sum(b"\x12\x08" + (1).to_bytes(8, "little") in field for field in out) == 1


def test_the_fast_path_writes_the_one_definition_s_span_ids() -> None:
    """The loop writes span and parent ids inline; they are `region_span_id`'s."""
    from opentelemetry.proto.trace.v1.trace_pb2 import ScopeSpans

    from otel_train.wire.ids import region_span_id

    salt = 0x0123456789ABCDEF
    batch = mixed_records()
    out, rest, _ = _fast(batch, 0, 1, 0, salt)
    written = [span for field in out for span in ScopeSpans.FromString(field).spans]
    sent = [r for r in batch if r[0] == schema.KIND_SPAN and r not in rest]
    assert written and len(written) == len(sent)
    assert [s.span_id for s in written] == [region_span_id(salt, r[schema.REC_SEQ]).to_bytes(8, "big") for r in sent]
    parented = [(s, r[schema.REC_PARENT]) for s, r in zip(written, sent) if r[schema.REC_PARENT] is not None]
    assert parented and all(s.parent_span_id == region_span_id(salt, p).to_bytes(8, "big") for s, p in parented)


def test_a_wall_time_out_of_range_raises() -> None:
    batch = [r for r in mixed_records() if r[0] == schema.KIND_SPAN]
    with pytest.raises(struct.error):
        _fast(batch, 0, 1, -(10**18))


def test_many_bodies_in_one_batch_are_each_their_own() -> None:
    """More distinct name and attribute pairs than one step repeats, interleaved: each span keeps its own."""
    clock = FakeClock()
    recorder = _recorder.Recorder(4096, clock)
    _recorder.install(recorder)
    try:
        for n in range(40):
            with _recorder.Step(n, None):
                for i in range(23):
                    value = [i, float(i) / 4, i % 2 == 0, f"v{i % 5}", None][i % 5]
                    with _recorder.Region(f"r{(i * 7 + n) % 19}", **({} if value is None else {f"k{i % 3}": value})):
                        clock.advance(i + 1)
    finally:
        _recorder.install(None)
    records = list(recorder.buf)
    fast, general = _assemble(records, 10**18, fast=True, rank=0), _assemble(records, 10**18, fast=False, rank=0)
    assert fast[2] > len(records) // 2  # mostly the fast path
    assert fast[:2] == general[:2]



# --- packed drains --------------------------------------------------------------------------
def _packed(records: list) -> tuple[int, bytes, list, list]:
    """`records` through a packing recorder, as the exporter process gets them: the drain's
    slots and side records, and the string table."""
    recorder = _recorder.Recorder(len(records) + 1)
    recorder.packing = True
    for record in records:
        recorder.append(record)
    count, slots, side = recorder.drain_packed(len(records) + 1)
    assert count == len(records) and len(side) < count  # some slots, some side records
    return count, slots, side, list(recorder.strings)


class _Fed:
    """What `ExportPipeline.feed_packed` hands its records on to: the pipeline's `feed`, here
    straight to an assembler."""

    def __init__(self, assembler: SpanAssembler) -> None:
        self.assembler = assembler
        self.received = 0

    def feed(self, segments: Any, offset: int, dropped: Any, export: bool = True) -> None:
        for is_wire, records in segments:
            self.received += len(records)
            self.assembler.feed(records) if is_wire else self.assembler.feed_raw(records, offset)


def _fed(records: list, packed: bool, rank: int, step_sample: int) -> tuple[list, object, int, int]:
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from otel_train.export.metrics import TrainMetrics

    reader = InMemoryMetricReader()
    metrics = TrainMetrics(Resource(RESOURCE), None, 60_000, [reader], "1.2", time_ns=lambda: 5)
    out: list = []
    assembler = SpanAssembler(RunInfo(run_id="r", rank=rank), 0xDEADBEEF12345678, Resource(RESOURCE),
                              AttributeCleaner(16), out.extend, step_sample=step_sample, metrics=metrics,
                              encoder=LeanEncoder(RESOURCE, "otel_train", "1.2"))
    if packed:
        count, slots, side, strings = _packed(records)
        fed = _Fed(assembler)
        ExportPipeline.feed_packed(fed, slots, side, None, strings, 10**18, {})  # type: ignore[arg-type]
        assert fed.received == count
    else:
        count = len(records)
        assembler.feed_raw(records, 10**18)
    assembler.flush()
    return out, reader.get_metrics_data(), assembler.spans_built, count


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("step_sample", [1, 2])
def test_a_packed_drain_is_encoded_as_its_records_would_be(rank: int, step_sample: int) -> None:
    """The exporter unpacks a drain (the hot path's C `unpack`, the one reader of `wire/slots.h`)
    and encodes it: the same spans in the same order, the same metrics, as the records the
    recorder was given."""
    records = mixed_records() + _edge_records()
    packed = _fed(records, True, rank, step_sample)
    assert packed == _fed(records, False, rank, step_sample)
    assert sum(type(s) is bytes for s in packed[0]) > len(packed[0]) // 2  # mostly the fast path
