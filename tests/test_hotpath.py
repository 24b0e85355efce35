"""The C hot path (`otel_train/_hotpath.c`) against the pure-Python regions it replaces.

Both must leave exactly the same records in the buffer for the same calls: the worker and the
exporter cannot tell which one made a record. The whole recorder test module also runs once
more with the C module hidden (`test_the_recorder_tests_pass_with_the_python_fallback`).
"""

from __future__ import annotations

import asyncio
import contextvars
import importlib
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support.procs import pytest_without

from otel_train.record import direct
from otel_train.record import attach as _attach
from otel_train.record import recorder as _recorder
from otel_train.record.clock import FakeClock
from otel_train.wire import schema

_REPO = Path(__file__).resolve().parent.parent

try:
    import tomllib
except ImportError:  # Python 3.10: the build checks below are skipped
    tomllib = None  # type: ignore[assignment]


def _c_region() -> type:
    hotpath = pytest.importorskip("otel_train.record._hotpath")
    assert _recorder.Region is hotpath.Region
    return hotpath.Region


def _normalised(records: list[Any]) -> list[Any]:
    """Records with their sequence numbers renumbered by first appearance (the counter is shared)."""
    seen: dict[int, int] = {}

    def seq(n: Any) -> Any:
        return n if n is None else seen.setdefault(n, len(seen))

    out = []
    for rec in records:
        if rec[0] == schema.KIND_SPAN:
            kind, name, s, parent, (step_n, step_seq), t0, t1, attrs, exc, events = rec
            out.append((kind, name, seq(s), seq(parent), (step_n, seq(step_seq)), t0, t1, attrs, exc, events))
        elif rec[0] == schema.KIND_STEP:
            out.append((rec[0], seq(rec[1]), *rec[2:]))
        else:  # a tag or an event: its step's reference
            kind, (step_n, step_seq), payload = rec
            out.append((kind, (step_n, seq(step_seq)), payload))
    return out


def _unpacked(rec: Any) -> list[Any]:
    """Everything in a packing recorder, as the exporter process gets it: slots as bytes, unpacked."""
    count, slots, side = rec.drain_packed(sys.maxsize)
    records = [r for _, records in _recorder._hotpath.unpack(slots, side, None, rec.strings) for r in records]
    assert len(records) == count
    return records


def _script(region: type, capacity: int = 64, packing: str | None = None) -> tuple[list[Any], int, Any]:
    """One run of everything a region does, on a recorder with a fake clock; what it left.

    `packing` ("drain" or "packed"): the recorder packs plain regions into its ring, and the
    records are read back with `drain` or with `drain_packed` and `unpack`."""
    clock = FakeClock()
    rec = _recorder.Recorder(capacity, clock)
    rec.packing = packing is not None
    _recorder.install(rec)
    try:
        with region("before.steps"):
            clock.advance(3)
        step = _recorder.Step(0, None)
        with step:
            clock.advance(5)
            with region("outer", lr=0.1, phase="fwd") as outer:
                assert outer.attrs == {"lr": 0.1, "phase": "fwd"}
                clock.advance(7)
                with region("inner", device_time=False):
                    _attach.event("inside", {"k": 1})
                    clock.advance(11)
            with pytest.raises(ValueError):
                with region("fails"):
                    clock.advance(13)
                    raise ValueError("boom")
        with region("after.step"):
            clock.advance(17)
        _attach.tag("late")  # between steps: for the step just ended
        _attach.event("between", {"x": 1})
        _attach.link({"traceparent": "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"})  # for the next step
        with _recorder.new_step(epoch=2, lr=0.5):  # number 1, by default
            _attach.tag("eval")
            _attach.tag("checkpoint")
            clock.advance(2)
            reopened = _recorder.new_step()  # begins while step 1 is open: closes it first
            reopened.__enter__()
            clock.advance(3)
            reopened.__exit__(None, None, None)
        # Entered in another context, left here: the parent is put back here.
        ctx = contextvars.copy_context()
        moved = region("moved")
        ctx.run(moved.__enter__)
        clock.advance(19)
        moved.__exit__(None, None, None)
        # Entered and left (the optimizer phase between its calls), then current again, and left.
        update = region("update").__enter__()
        direct.leave(update)
        with region("not.nested"):
            clock.advance(1)
        direct.make_current(update)
        with region("nested.again"):
            clock.advance(1)
        direct.leave(update)
        direct.finish(rec, update, clock.perf_ns(), None)
        left_open = _attach.current_region()
        # Tasks of an event loop run inside a sync region: each nests in its own task's regions.
        async def task(i: int) -> None:
            with region("task", i=i):
                await asyncio.sleep(0)
                with region("task.inner", i=i):
                    clock.advance(23)
                    await asyncio.sleep(0)

        async def main() -> None:
            await asyncio.gather(task(0), task(1))

        with region("sync.outer"):
            asyncio.run(main())
            with region("after.loop"):
                pass
        # Another thread starts outside any region, whatever this one has open.
        with region("main.open"):
            worker = threading.Thread(target=lambda: region("in.thread").__enter__().__exit__(None, None, None))
            worker.start()
            worker.join()
        direct.record(rec, "recorded", {"k": "v"}, 5, 6)  # detection's region that already happened
        for i in range(70):  # past a small buffer: the oldest go, counted
            with region("fill", i=i):
                clock.advance(1)
        if packing is None:
            return _normalised(list(rec.buf)), rec.dropped, left_open
        assert len(rec.buf) < rec.pending() <= capacity  # some records are slots, not objects
        records = rec.drain(sys.maxsize) if packing == "drain" else _unpacked(rec)
        assert rec.pending() == len(rec.buf) == 0  # every side object went with its slot
        return _normalised(records), rec.dropped, left_open
    finally:
        _recorder.install(None)


def test_c_and_python_regions_leave_the_same_records() -> None:
    c_region = _c_region()
    assert _script(c_region) == _script(_recorder._PyRegion)
    records, dropped, left_open = _script(c_region, capacity=8)
    assert dropped == 23 + 70 - 8 and left_open is None  # 23 records before the 70 that fill it
    assert [r[1] for r in records] == ["fill"] * 8
    full = _script(c_region, capacity=1000)[0]
    names = [r[1] for r in full if r[0] == schema.KIND_SPAN]
    assert names[:6] == ["before.steps", "inner", "outer", "fails", "after.step", "moved"]
    inner, outer, fails = full[1], full[2], full[3]
    assert inner[3] == outer[2] and outer[3] is None  # parent seq; the outer one's parent is the step
    assert inner[9] == [("inside", inner[5], {"k": 1})]  # the event, at its time
    assert fails[8] is ValueError and outer[7] == {"lr": 0.1, "phase": "fwd"} and inner[7] is None
    by_name: dict[str, list[Any]] = {}
    for rec in full:
        by_name.setdefault(rec[1], []).append(rec)
    (update,), (not_nested,), (nested_again,) = by_name["update"], by_name["not.nested"], by_name["nested.again"]
    assert nested_again[3] == update[2] and not_nested[3] is None and update[3] is None
    (sync_outer,), (after_loop,) = by_name["sync.outer"], by_name["after.loop"]
    tasks, inners = by_name["task"], by_name["task.inner"]
    assert {t[3] for t in tasks} == {sync_outer[2]} and after_loop[3] == sync_outer[2]
    assert sorted((i[7]["i"], i[3]) for i in inners) == sorted((t[7]["i"], t[2]) for t in tasks)
    assert by_name["in.thread"][0][3] is None and by_name["main.open"][0][3] is None
    steps = [r for r in full if r[0] == schema.KIND_STEP]
    assert [(st[2], st[6], st[5], st[8], st[11]) for st in steps] == [
        (0, None, None, None, None), (1, 2, {"lr": 0.5}, ("eval", "checkpoint"), None), (2, None, None, None, None)]
    assert steps[1][10] and steps[0][10] is None and steps[2][10] is None  # the link went to step 1 alone
    assert [(r[0], r[2]) for r in full if r[0] in (schema.KIND_TAG, schema.KIND_EVENT)] == [
        (schema.KIND_TAG, "late"), (schema.KIND_EVENT, ("between", 1_000_000_056, {"x": 1}))]


@pytest.mark.parametrize("capacity", [8, 64, 75, 1000])
def test_packed_records_come_back_as_the_records_the_buffer_would_hold(capacity: int) -> None:
    """With packing, plain regions are slots and the rest side objects in their place: read
    back in the process (`drain`) or in the exporter's way (`drain_packed`, `unpack`), the
    records, their order, and what a full buffer dropped (side objects too) are the same."""
    c_region = _c_region()
    expected = _script(c_region, capacity)
    assert _script(c_region, capacity, packing="drain") == expected
    assert _script(c_region, capacity, packing="packed") == expected


def _packing_recorder(capacity: int = 256) -> Any:
    _c_region()
    rec = _recorder.Recorder(capacity, FakeClock())
    rec.packing = True
    return rec


def test_attribute_values_pack_by_type_and_come_back_the_same_type() -> None:
    hotpath = pytest.importorskip("otel_train.record._hotpath")
    rec = _packing_recorder()
    values: list[Any] = [1, -5, 2**63 - 1, -(2**63), 0.5, 1.0, True, False, "s", ""]
    aside: list[Any] = [2**63, 2**70, None, [1, 2], (1,), b"x"]  # no slot for these
    _recorder.install(rec)
    try:
        with _recorder.Step(0, None):
            for value in values + aside:
                with hotpath.Region("v", x=value):
                    pass
            with hotpath.Region("two", a=1, b=2):  # more than one attribute
                pass
    finally:
        _recorder.install(None)
    assert len(rec.buf) == len(aside) + 2  # and the step
    records = _unpacked(rec)
    got = [(type(r[7]["x"]), r[7]["x"]) for r in records if r[1] == "v"]
    assert got == [(type(v), v) for v in values + aside]
    assert [r[1] for r in records[:-1]] == ["v"] * len(values + aside) + ["two"]
    assert records[-2][7] == {"a": 1, "b": 2} and records[-1][0] == schema.KIND_STEP


def test_the_string_table_is_bounded_and_records_past_it_go_aside() -> None:
    hotpath = pytest.importorskip("otel_train.record._hotpath")
    rec = _packing_recorder(hotpath.MAX_STRINGS + 100)
    _recorder.install(rec)
    try:
        for i in range(hotpath.MAX_STRINGS + 10):
            with hotpath.Region(f"n{i}"):
                pass
        with hotpath.Region("n0", k="new"):  # a known name, but a new key: aside too
            pass
    finally:
        _recorder.install(None)
    assert len(rec.strings) == hotpath.MAX_STRINGS and len(rec.buf) == 11
    assert [(r[1], r[7]) for r in _unpacked(rec)] == [
        (f"n{i}", None) for i in range(hotpath.MAX_STRINGS + 10)] + [("n0", {"k": "new"})]


def test_a_string_id_follows_the_string_not_the_address_it_had() -> None:
    """Names made at run time and freed at once: the next one usually takes the same memory. An
    id cached by address alone would give the new name the old one's id."""
    hotpath = pytest.importorskip("otel_train.record._hotpath")
    rec = _packing_recorder(1000)
    _recorder.install(rec)
    try:
        for i in range(300):
            name = "".join(("made.", str(i)))  # a new object each time, freed after its region
            with hotpath.Region(name, **{"".join(("key.", str(i % 7))): i}):
                pass
            del name
    finally:
        _recorder.install(None)
    assert len(rec.buf) == 0  # every one a slot
    assert [(r[1], r[7]) for r in _unpacked(rec)] == [(f"made.{i}", {f"key.{i % 7}": i}) for i in range(300)]
    equal_not_same = "".join(("made.", "0"))
    _recorder.install(rec)
    try:
        with hotpath.Region(equal_not_same):
            pass
    finally:
        _recorder.install(None)
    assert len(rec.strings) == 307 and _unpacked(rec)[0][1] == "made.0"  # one id per text


def test_a_c_region_keeps_its_numbers_as_python_sees_them() -> None:
    """`seq`, `t0` and `t1` are C integers inside the region: read, set and deleted from Python
    as the object fields they were, and drawn from the one counter the Python side uses."""
    c_region = _c_region()
    clock = FakeClock()
    rec = _recorder.Recorder(64, clock)
    _recorder.install(rec)
    try:
        region = c_region("numbers")
        for field in ("seq", "t0", "t1"):
            with pytest.raises(AttributeError, match=field):
                getattr(region, field)
        before = next(_recorder.seq)
        with region:
            clock.advance(5)
            with _recorder._PyRegion("python.inside"):  # the Python region draws from the same counter
                clock.advance(2)
        after = next(_recorder.seq)
        assert before < region.seq < after and region.t1 - region.t0 == 7
        python_record, c_record = list(rec.buf)
        assert c_record[2] == region.seq
        assert before < python_record[2] < after and python_record[2] != region.seq
        region.t1 = 2**63 - 1
        assert region.t1 == 2**63 - 1
        for bad in (2**63, 1.5, "1", None):
            with pytest.raises(TypeError, match="t1"):
                region.t1 = bad
        del region.t0
        assert not hasattr(region, "t0") and region.t1 == 2**63 - 1
        # Entered again, it is open again: no end time, and the parent of what it holds.
        with region:
            assert not hasattr(region, "t1")
            with c_region("again.inside"):
                pass
        inner, outer = list(rec.buf)[-2:]
        assert inner[1] == "again.inside" and inner[3] == region.seq and outer[2] == region.seq
    finally:
        _recorder.install(None)


def test_packing_switches_only_while_the_buffer_is_empty() -> None:
    rec = _packing_recorder()
    rec.append(("a side record",))
    with pytest.raises(ValueError, match="empty"):
        rec.packing = False
    assert rec.drain(10) == [("a side record",)]
    rec.packing = False
    rec.append(("kept",))
    with pytest.raises(ValueError, match="empty"):
        rec.packing = True
    with pytest.raises(ValueError, match="packing"):
        rec.drain_packed(10)


def test_unpack_refuses_what_drain_packed_cannot_have_made() -> None:
    """The exporter process unpacks what comes through its pipe: a mismatch is an error, never
    a crash or a record made of someone else's memory."""
    hotpath = pytest.importorskip("otel_train.record._hotpath")
    rec = _packing_recorder()
    _recorder.install(rec)
    try:
        with hotpath.Region("a", k=1):
            pass
        rec.append(("side",))
        with hotpath.Region("b"):
            pass
    finally:
        _recorder.install(None)
    count, slots, side = rec.drain_packed(10)
    assert count == 3 and side == [("side",)]
    strings = rec.strings
    segments = hotpath.unpack(slots, side, [True], strings)  # the side record made wire on the way
    assert [(wire, [r[1] if r[0] == schema.KIND_SPAN else r for r in records]) for wire, records in segments] == [
        (False, ["a"]), (True, [("side",)]), (False, ["b"])]
    for bad in [(slots[:-1], side, None, strings), (slots, [], None, strings), (slots, side * 2, None, strings),
                (slots, side, None, strings[:1]), (slots, side, [True, False], strings)]:
        with pytest.raises(ValueError):
            hotpath.unpack(*bad)


def test_a_c_region_left_on_another_thread_is_not_the_parent_of_later_ones() -> None:
    c_region = _c_region()
    rec = _recorder.Recorder(64, FakeClock())
    _recorder.install(rec)
    try:
        with c_region("enclosing"):
            handed_off = c_region("handed.off").__enter__()
            other = threading.Thread(target=handed_off.__exit__, args=(None, None, None))
            other.start()
            other.join()
            with c_region("next"):
                pass
            assert _attach.current_region() is not handed_off
        assert _attach.current_region() is None
        records = {r[1]: r for r in rec.buf}
    finally:
        _recorder.install(None)
    assert records["next"][3] == records["enclosing"][2] == records["handed.off"][3]


def test_an_abandoned_c_region_is_no_longer_current() -> None:
    c_region = _c_region()
    rec = _recorder.Recorder(64, FakeClock())
    _recorder.install(rec)
    try:
        with c_region("enclosing") as enclosing:
            dropped = c_region("dropped").__enter__()
            assert _attach.current_region() is dropped
            direct.abandon(dropped)
            assert _attach.current_region() is enclosing
        assert [r[1] for r in rec.buf] == ["enclosing"]
    finally:
        _recorder.install(None)


def test_the_whole_script_records_the_same_without_the_c_module() -> None:
    """Steps, tags, links and events too: the pure-Python classes in a process without `_hotpath`."""
    c_region = _c_region()
    code = ("import sys; sys.modules['otel_train.record._hotpath'] = None; sys.path.insert(0, 'tests')\n"
            "from otel_train.record import recorder as _recorder\n"
            "assert _recorder.Step is _recorder._PyStep\n"
            "from test_hotpath import _script\n"
            "print(repr(_script(_recorder.Region)))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=_REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == repr(_script(c_region))


def test_an_event_loop_started_after_the_first_regions_is_still_seen() -> None:
    """The C module finds asyncio only once something imports it: regions before that, then a
    loop's tasks, each nesting in its own task's regions."""
    _c_region()
    code = ("import sys\n"
            "from otel_train.record import recorder as _recorder\n"
            "from otel_train.record.clock import FakeClock\n"
            "assert 'asyncio' not in sys.modules\n"
            "rec = _recorder.Recorder(64, FakeClock()); _recorder.install(rec)\n"
            "with _recorder.Region('before.asyncio'): pass\n"
            "import asyncio\n"
            "async def task(i):\n"
            "    with _recorder.Region('task', i=i):\n"
            "        await asyncio.sleep(0)\n"
            "        with _recorder.Region('inner', i=i):\n"
            "            await asyncio.sleep(0)\n"
            "async def main():\n"
            "    await asyncio.gather(task(0), task(1))\n"
            "asyncio.run(main())\n"
            "seq = {(r[1], (r[7] or {}).get('i')): r[2] for r in rec.buf}\n"
            "parent = {(r[1], (r[7] or {}).get('i')): r[3] for r in rec.buf}\n"
            "assert parent[('inner', 0)] == seq[('task', 0)] and parent[('inner', 1)] == seq[('task', 1)], list(rec.buf)\n"
            "print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=_REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_the_c_region_reads_the_same_clock_as_perf_counter_ns() -> None:
    c_region = _c_region()
    rec = _recorder.Recorder(16)  # the system clock: read in C, without a call
    _recorder.install(rec)
    try:
        before = time.perf_counter_ns()
        with c_region("timed") as region:
            pass
        after = time.perf_counter_ns()
    finally:
        _recorder.install(None)
    assert before <= region.t0 <= region.t1 <= after


def _capsule_pin() -> Any:
    """The hot path capsule's `pin(recorder, t)` (`_hotpath_api.h`), callable through ctypes."""
    import ctypes

    hotpath = pytest.importorskip("otel_train.record._hotpath")
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    api = get(hotpath._C_API, b"otel_train.record._hotpath._C_API")
    fields = (ctypes.c_void_p * 3).from_address(api)  # recorder_type, now_ns, pin
    return ctypes.CFUNCTYPE(None, ctypes.py_object, ctypes.c_int64)(fields[2])


def test_a_pinned_clock_reads_its_time_in_c_and_python_until_now_is_set() -> None:
    c_region, pin = _c_region(), _capsule_pin()
    rec = _recorder.Recorder(16)
    own = rec.now
    _recorder.install(rec)
    try:
        pin(rec, 123_456_789)
        with c_region("pinned") as pinned:  # read in C
            pass
        assert (pinned.t0, pinned.t1) == (123_456_789, 123_456_789)
        assert rec.now() == 123_456_789  # read as Python code reads it
        rec.now = own  # unpins: the system clock again, read in C
        before = time.perf_counter_ns()
        with c_region("after") as after:
            pass
        assert before <= after.t0 <= after.t1 <= time.perf_counter_ns()
        assert rec.now is own
        pin(rec, 5)
        fake = FakeClock()
        rec.now = fake.perf_ns  # a clock of the user's replaces a pinned time too
        fake.advance(7)
        with c_region("fake") as faked:
            pass
        assert faked.t0 == faked.t1 == fake.perf_ns() != 5
    finally:
        _recorder.install(None)


def test_the_c_region_rejects_what_the_python_one_rejects() -> None:
    c_region = _c_region()
    for region in (c_region, _recorder._PyRegion):
        with pytest.raises(TypeError):
            region()
        with pytest.raises(TypeError):
            region("a", "b")
    with pytest.raises(TypeError, match="span name as its one positional argument"):
        c_region("a", "b")
    unentered = c_region("never.entered")
    assert unentered.__exit__(None, None, None) is None  # leaving what was never entered records nothing
    assert not hasattr(unentered, "t1")


def test_the_c_region_decorates_like_the_python_one() -> None:
    c_region = _c_region()
    rec = _recorder.Recorder(16, FakeClock())
    _recorder.install(rec)
    try:
        @c_region("decorated", k="v")
        def work(x: int) -> int:
            return x * 2

        assert work(21) == 42 and work.__name__ == "work"
        (record,) = rec.buf
        assert record[1] == "decorated" and record[7] == {"k": "v"}
    finally:
        _recorder.install(None)


@pytest.mark.parametrize("packing", [False, True])
def test_the_c_hot_path_leaks_nothing(packing: bool) -> None:
    """Every path that allocates, run 20,000 times into a small buffer (old records dropped and
    freed): the interpreter's live block count must not grow with the iterations."""
    c_region = _c_region()
    clock = FakeClock()
    rec = _recorder.Recorder(64, clock)
    rec.packing = packing
    _recorder.install(rec)

    def once(i: int) -> None:
        _attach.link({"traceparent": "x"})
        with _recorder.new_step(epoch=1, k=i):
            _attach.tag("t")
            with c_region("outer", mb=i):
                _attach.event("e", {"i": i})
                with c_region("inner", device_time=False):
                    clock.advance(1)
            try:
                with c_region("fails"):
                    raise KeyError(i)
            except KeyError:
                pass
            dropped = c_region("abandoned").__enter__()
            direct.abandon(dropped)
        with c_region("between"):
            pass
        direct.record(rec, "recorded", {"a": 1}, 1, 2)
        if packing and i % 16 == 0:  # both ways of reading the ring back
            rec.drain(20)
            _, slots, side = rec.drain_packed(20)
            _recorder._hotpath.unpack(slots, side, None, rec.strings)

    try:
        for i in range(2_000):  # warm up: free lists, caches, the deque's blocks
            once(i)
        before = sys.getallocatedblocks()
        for i in range(20_000):
            once(i)
        grown = sys.getallocatedblocks() - before
    finally:
        _recorder.install(None)
    assert grown < 2_000, f"{grown} blocks more after 20,000 iterations: something leaks"


def _extensions() -> dict[str, list[str]]:
    """Each C extension pyproject.toml builds: its sources and the headers it depends on."""
    if tomllib is None:
        return {}
    config = tomllib.loads((_REPO / "pyproject.toml").read_text())
    return {ext["name"]: ext["sources"] + ext.get("depends", [])
            for ext in config["tool"]["setuptools"]["ext-modules"]}


@pytest.mark.parametrize("name", sorted(_extensions()))
def test_the_c_module_is_built_where_a_compiler_is(name: str) -> None:
    """The extensions are optional at install, so a broken build would pass silently: not here."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}): the pure-Python fallbacks are in use")
    if name.startswith("otel_train.detect."):
        pytest.importorskip("torch")  # detection's modules import it (`.ci/compat`'s legs have none)
    module = importlib.import_module(name)
    for source in _extensions()[name]:
        path = _REPO / source
        if path.exists():  # an editable install: the built module must not predate its sources
            assert Path(module.__file__).stat().st_mtime >= path.stat().st_mtime, \
                f"{source} changed since {name} was built: pip install -e . again"


def test_the_recorder_tests_pass_with_the_python_fallback() -> None:
    """No compiler at install time means no `_hotpath`: the package must work the same without it."""
    proc = pytest_without("otel_train.record._hotpath",
                          "from otel_train.record import recorder as _recorder\n"
                          "assert _recorder.Region is _recorder._PyRegion, _recorder.Region",
                          ["tests/test_recorder.py", "tests/test_api.py", "tests/test_hotpath.py",
                           "-k", "not python_fallback and not compiler"])
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" in proc.stdout  # the C-only tests skip there
