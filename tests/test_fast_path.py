"""The exporter's fast path in C (`otel_train/export/_encode.c`) against the Python loop it replaces:
the same bytes, the same records left for the general path, the same metric durations."""

from __future__ import annotations

import sys

import pytest
from opentelemetry.sdk.resources import Resource

from otel_train._distributed import RunInfo
from otel_train.export import fast_path, span_ids
from otel_train.export.attributes import AttributeCleaner
from otel_train.export.otlp import LeanEncoder
from otel_train.export.spans import SpanAssembler
from otel_train.record import recorder as _recorder
from otel_train.record.clock import FakeClock
from otel_train.wire import schema

_encode = pytest.importorskip("otel_train.export._encode")
sys.path.insert(0, "tests")
from test_otlp import RESOURCE, mixed_records  # noqa: E402


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


def _fast(records: list, c_encode: bool, rank: int, step_sample: int, offset: int,
          salt: int = 0xDEADBEEF12345678) -> tuple[list, list, dict]:
    durations: dict[str, list[int]] = {}
    assembler = SpanAssembler(RunInfo(run_id="r", rank=rank), salt, Resource(RESOURCE),
                              AttributeCleaner(16), lambda spans: None, step_sample=step_sample,
                              encoder=LeanEncoder(RESOURCE, "otel_train", "1.2"))
    assembler.fast_path.c_encode = c_encode
    out: list = []
    rest = assembler.fast_path.regions(records, offset, out, durations)
    return out, rest, durations


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("step_sample", [1, 2])  # 2: the odd steps' regions are counted, not sent
@pytest.mark.parametrize("records", [mixed_records, _edge_records])
def test_c_and_python_encode_the_same_bytes(records, rank: int, step_sample: int) -> None:
    batch = records()
    c_out, c_rest, c_durations = _fast(batch, True, rank, step_sample, 10**18)
    py_out, py_rest, py_durations = _fast(batch, False, rank, step_sample, 10**18)
    assert c_out and c_rest  # both paths had work
    assert c_out == py_out
    assert c_rest == py_rest
    assert c_durations == py_durations


def test_caches_cleared_in_the_middle_of_a_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """`FastPath.body` and `FastPath.step` clear their caches past `_CACHE_MAX`, here on almost every
    miss: the C loop must hold what it took from them (a freed step tuple would corrupt ids)."""
    monkeypatch.setattr(fast_path, "_CACHE_MAX", 2)
    monkeypatch.setattr(span_ids, "_CACHE_MAX", 2)
    batch = mixed_records() + _edge_records()
    for rank in (0, 1):
        assert _fast(batch, True, rank, 1, 0) == _fast(batch, False, rank, 1, 0)


def test_an_all_zero_span_id_becomes_one() -> None:
    """A salt that maps one region's sequence number to 0, an invalid OTLP id: it goes out as 1."""
    from otel_train.wire.ids import MASK64, REGION_ID_MULTIPLIER

    batch = mixed_records()
    seq = next(r[2] for r in batch if r[0] == schema.KIND_SPAN and r[1] == "inner")
    salt = (seq * REGION_ID_MULTIPLIER) & MASK64
    c_out = _fast(batch, True, 0, 1, 0, salt)[0]
    assert c_out == _fast(batch, False, 0, 1, 0, salt)[0]
    assert sum(b"\x12\x08" + (1).to_bytes(8, "little") in field for field in c_out) == 1


def test_the_c_encoder_writes_the_one_definition_s_span_ids() -> None:
    """The C computes a region's span id for speed; the ids it writes are `region_wire_id`'s."""
    from opentelemetry.proto.trace.v1.trace_pb2 import ScopeSpans

    from otel_train.wire.ids import region_span_id

    salt = 0x0123456789ABCDEF
    batch = mixed_records()
    out, rest, _ = _fast(batch, True, 0, 1, 0, salt)
    written = [span for field in out for span in ScopeSpans.FromString(field).spans]
    sent = [r for r in batch if r[0] == schema.KIND_SPAN and r not in rest]
    assert written and len(written) == len(sent)
    assert [s.span_id for s in written] == [region_span_id(salt, r[schema.REC_SEQ]).to_bytes(8, "big") for r in sent]
    parented = [(s, r[schema.REC_PARENT]) for s, r in zip(written, sent) if r[schema.REC_PARENT] is not None]
    assert parented and all(s.parent_span_id == region_span_id(salt, p).to_bytes(8, "big") for s, p in parented)


def test_a_wall_time_out_of_range_raises_as_in_python() -> None:
    batch = [r for r in mixed_records() if r[0] == schema.KIND_SPAN]
    with pytest.raises(OverflowError):
        _fast(batch, True, 0, 1, -(10**18))
    with pytest.raises(Exception):  # noqa: B017 - struct.error from the Python loop
        _fast(batch, False, 0, 1, -(10**18))


def test_no_leak() -> None:
    batch = mixed_records()
    assembler = SpanAssembler(RunInfo(run_id="r"), 1, Resource(RESOURCE), AttributeCleaner(16), lambda spans: None,
                              encoder=LeanEncoder(RESOURCE, "otel_train", "1.2"))
    for _ in range(50):
        assembler.fast_path.regions(batch, 10**18, [], {})
    before = sys.getallocatedblocks()
    for _ in range(2_000):
        assembler.fast_path.regions(batch, 10**18, [], {})
    assert sys.getallocatedblocks() - before < 500


def test_bad_arguments_raise_instead_of_crashing() -> None:
    with pytest.raises(TypeError):
        _encode.regions([], 0, 0, {}, {}, None, None, {}, [])  # nine arguments
    with pytest.raises(TypeError):
        _encode.regions([], 0.5, 0, {}, {}, None, None, {}, [], [])
    with pytest.raises(TypeError):
        _encode.regions([], 0, 0, [], {}, None, None, {}, [], [])
    with pytest.raises(TypeError):
        _encode.regions(None, 0, 0, {}, {}, None, None, {}, [], [])


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


def test_the_exporter_unpacks_a_packed_drain_as_the_recorder_does() -> None:
    """The exporter process reads slots with `_encode.unpack`, never importing the hot path: the
    same code (`wire/slots.h`) as the recorder's own `unpack`, so the same records."""
    count, slots, side, strings = _packed(mixed_records())
    for wire in (None, [i % 2 == 0 for i in range(len(side))]):
        mine = _encode.unpack(slots, side, wire, strings)
        assert mine == _recorder._hotpath.unpack(slots, side, wire, strings)
        assert sum(len(records) for _, records in mine) == count
    with pytest.raises(ValueError, match="whole number"):
        _encode.unpack(slots[:-1], side, None, strings)


def _fed(records: list, packed: bool, rank: int, step_sample: int) -> tuple[list, object, int, int]:
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from otel_train.export.metrics import TrainMetrics

    reader = InMemoryMetricReader()
    metrics = TrainMetrics(Resource(RESOURCE), None, 60_000, [reader], "1.2", time_ns=lambda: 5)
    out: list = []
    assembler = SpanAssembler(RunInfo(run_id="r", rank=rank), 0xDEADBEEF12345678, Resource(RESOURCE),
                              AttributeCleaner(16), out.extend, step_sample=step_sample, metrics=metrics,
                              encoder=LeanEncoder(RESOURCE, "otel_train", "1.2"))
    assert assembler.can_feed_packed()
    if packed:
        count, slots, side, strings = _packed(records)
        assert assembler.feed_packed(slots, side, strings, 10**18) == count
    else:
        count = len(records)
        assembler.feed_raw(records, 10**18)
    assembler.flush()
    return out, reader.get_metrics_data(), assembler.spans_built, count


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("step_sample", [1, 2])
def test_a_packed_drain_is_encoded_as_its_records_would_be(rank: int, step_sample: int) -> None:
    """Slots encoded where they lie, side records and slots the fast path does not take (a
    sibling span, an unusual value) through the general path: the same spans in the same order,
    the same metrics, as the records the drain would unpack into."""
    records = mixed_records() + _edge_records()
    packed = _fed(records, True, rank, step_sample)
    assert packed == _fed(records, False, rank, step_sample)
    assert sum(type(s) is bytes for s in packed[0]) > len(packed[0]) // 2  # mostly the fast path


def test_many_bodies_in_one_drain_are_each_their_own() -> None:
    """More distinct name and attribute pairs than the loop keeps at hand, interleaved."""
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
    assert _fed(records, True, 0, 1) == _fed(records, False, 0, 1)


def test_packed_regions_refuses_what_a_recorder_cannot_have_packed() -> None:
    count, slots, side, strings = _packed(mixed_records())
    assembler = SpanAssembler(RunInfo(run_id="r"), 1, Resource(RESOURCE), AttributeCleaner(16), lambda spans: None,
                              encoder=LeanEncoder(RESOURCE, "otel_train", "1.2"))
    with pytest.raises(ValueError, match="whole number"):
        assembler.feed_packed(slots[:-1], side, strings, 0)
    with pytest.raises(ValueError, match="more side slots"):
        assembler.feed_packed(slots, side[:-1], strings, 0)
    with pytest.raises(ValueError, match="more side records"):
        assembler.feed_packed(slots, side + [side[0]], strings, 0)
    with pytest.raises(ValueError, match="cannot have packed"):
        assembler.feed_packed(slots, side, strings[:1], 0)
    with pytest.raises(TypeError):
        _encode.packed_regions(slots, side, strings, 0, 0, {}, {}, None, None, {}, [])  # eleven
    assert _encode.SLOT_SIZE == _recorder._hotpath.SLOT_SIZE  # one layout, in `_slots.h`


def test_packed_regions_leaks_nothing() -> None:
    count, slots, side, strings = _packed(mixed_records())
    assembler = SpanAssembler(RunInfo(run_id="r"), 1, Resource(RESOURCE), AttributeCleaner(16), lambda spans: None,
                              encoder=LeanEncoder(RESOURCE, "otel_train", "1.2"))

    def once() -> None:  # the C loop alone, as `test_no_leak` runs the tuple one
        fast = assembler.fast_path
        _encode.packed_regions(slots, side, strings, 10**18, 1, fast.bodies, fast.steps, fast.body, fast.step,
                               {}, [], [])

    for _ in range(50):
        once()
    before = sys.getallocatedblocks()
    for _ in range(2_000):
        once()
    assert sys.getallocatedblocks() - before < 500
