"""A region's record is defined once (`wire.schema.RegionRecord`): the C's field indices
(`wire/record.h`) are its fields in its order, and every builder, C or Python, packed or not,
puts each field where the definition says."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

from otel_train.record import direct
from otel_train.record import recorder as _recorder
from otel_train.record.clock import FakeClock
from otel_train.wire import schema
from otel_train.wire.schema import RegionRecord

HEADER = Path(schema.__file__).with_name("record.h")


def test_the_c_header_indexes_the_python_definition_s_fields_in_order() -> None:
    enum = re.search(r"enum\s*\{(.*?)\};", HEADER.read_text(), re.S)
    assert enum is not None
    names = re.findall(r"^\s*(REC_[A-Z0-9_]+)\b", enum[1], re.M)
    assert names == [f"REC_{field.upper()}" for field in RegionRecord._fields] + ["REC_FIELDS"]
    assert [getattr(schema, name) for name in names[:-1]] == list(range(len(RegionRecord._fields)))


def _records(region: type, packed: bool) -> list[Any]:
    """A region of `region`'s type, one `direct.record` and one `direct.finish` in step 7."""
    clock = FakeClock()
    rec = _recorder.Recorder(64, clock)
    rec.packing = packed
    _recorder.install(rec)
    try:
        with _recorder.Step(7, None) as step:
            clock.advance(5)
            with region("made", k=1):
                clock.advance(10)
            direct.record(rec, "direct", {"d": 2}, 100, 200)
            later = region("finished")
            later.__enter__()
            direct.leave(later)
            direct.finish(rec, later, clock.now_ns + 30, {"f": 3})
    finally:
        _recorder.install(None)
    if packed:
        _, slots, side = rec.drain_packed(sys.maxsize)
        records = [r for _, run in _recorder._hotpath.unpack(slots, side, None, rec.strings) for r in run]
    else:
        records = list(rec.buf)
    regions = [RegionRecord._make(r) for r in records if r[0] == schema.KIND_SPAN]
    assert all(r.step == step.ref for r in regions)
    return regions


REGIONS = [pytest.param(_recorder._PyRegion, False, id="python")]
if _recorder._hotpath is not None:
    REGIONS += [pytest.param(_recorder._hotpath.Region, False, id="c"),
                pytest.param(_recorder._hotpath.Region, True, id="c-packed")]


@pytest.mark.parametrize(("region", "packed"), REGIONS)
def test_every_builder_puts_each_field_where_the_definition_says(region: type, packed: bool) -> None:
    made, built, finished = sorted(_records(region, packed), key=lambda r: r.seq)
    start = made.t0 - 5  # the step began at `start`; nothing else advanced the clock
    assert (made.kind, made.name, made.parent, made.t1 - made.t0, made.attrs, made.exc, made.events) == (
        schema.KIND_SPAN, "made", None, 10, {"k": 1}, None, None)
    assert (built.name, built.t0, built.t1, built.attrs, built.exc, built.events) == (
        "direct", 100, 200, {"d": 2}, None, None)
    assert (finished.name, finished.t1 - start, finished.attrs) == ("finished", 45, {"f": 3})
