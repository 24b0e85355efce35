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

from otel_train import _recorder
from otel_train._clock import FakeClock

_REPO = Path(__file__).resolve().parent.parent


def _c_region() -> type:
    hotpath = pytest.importorskip("otel_train._hotpath")
    assert _recorder._Region is hotpath.Region
    return hotpath.Region


def _normalised(records: list[Any]) -> list[Any]:
    """Records with their sequence numbers renumbered by first appearance (the counter is shared)."""
    seen: dict[int, int] = {}

    def seq(n: Any) -> Any:
        return n if n is None else seen.setdefault(n, len(seen))

    out = []
    for rec in records:
        if rec[0] == _recorder.KIND_SPAN:
            kind, name, s, parent, (step_n, step_seq), t0, t1, attrs, exc, events = rec
            out.append((kind, name, seq(s), seq(parent), (step_n, seq(step_seq)), t0, t1, attrs, exc, events))
        elif rec[0] == _recorder.KIND_STEP:
            out.append((rec[0], seq(rec[1]), *rec[2:]))
        else:
            out.append(rec)
    return out


def _script(region: type, capacity: int = 64) -> tuple[list[Any], int, Any]:
    """One run of everything a region does, on a recorder with a fake clock; what it left."""
    clock = FakeClock()
    rec = _recorder.Recorder(capacity, clock)
    _recorder.install(rec)
    try:
        with region("before.steps"):
            clock.advance(3)
        step = _recorder._Step(0, None)
        with step:
            clock.advance(5)
            with region("outer", lr=0.1, phase="fwd") as outer:
                assert outer.attrs == {"lr": 0.1, "phase": "fwd"}
                clock.advance(7)
                with region("inner", device_time=False):
                    _recorder.event("inside", {"k": 1})
                    clock.advance(11)
            with pytest.raises(ValueError):
                with region("fails"):
                    clock.advance(13)
                    raise ValueError("boom")
        with region("after.step"):
            clock.advance(17)
        _recorder.tag("late")  # between steps: for the step just ended
        _recorder.event("between", {"x": 1})
        _recorder.link({"traceparent": "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"})  # for the next step
        with _recorder.new_step(epoch=2, lr=0.5):  # number 1, by default
            _recorder.tag("eval")
            _recorder.tag("checkpoint")
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
        left_open = _recorder.current_region()
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
        for i in range(70):  # past a small buffer: the oldest go, counted
            with region("fill", i=i):
                clock.advance(1)
        return _normalised(list(rec.buf)), rec.dropped, left_open
    finally:
        _recorder.install(None)


def test_c_and_python_regions_leave_the_same_records() -> None:
    c_region = _c_region()
    assert _script(c_region) == _script(_recorder._PyRegion)
    records, dropped, left_open = _script(c_region, capacity=8)
    assert dropped == 19 + 70 - 8 and left_open is None  # 19 records before the 70 that fill it
    assert [r[1] for r in records] == ["fill"] * 8
    full = _script(c_region, capacity=1000)[0]
    names = [r[1] for r in full if r[0] == _recorder.KIND_SPAN]
    assert names[:6] == ["before.steps", "inner", "outer", "fails", "after.step", "moved"]
    inner, outer, fails = full[1], full[2], full[3]
    assert inner[3] == outer[2] and outer[3] is None  # parent seq; the outer one's parent is the step
    assert inner[9] == [("inside", inner[5], {"k": 1})]  # the event, at its time
    assert fails[8] is ValueError and outer[7] == {"lr": 0.1, "phase": "fwd"} and inner[7] is None
    by_name: dict[str, list[Any]] = {}
    for rec in full:
        by_name.setdefault(rec[1], []).append(rec)
    (sync_outer,), (after_loop,) = by_name["sync.outer"], by_name["after.loop"]
    tasks, inners = by_name["task"], by_name["task.inner"]
    assert {t[3] for t in tasks} == {sync_outer[2]} and after_loop[3] == sync_outer[2]
    assert sorted((i[7]["i"], i[3]) for i in inners) == sorted((t[7]["i"], t[2]) for t in tasks)
    assert by_name["in.thread"][0][3] is None and by_name["main.open"][0][3] is None
    steps = [r for r in full if r[0] == _recorder.KIND_STEP]
    assert [(st[2], st[6], st[5], st[8], st[11]) for st in steps] == [
        (0, None, None, None, None), (1, 2, {"lr": 0.5}, ("eval", "checkpoint"), None), (2, None, None, None, None)]
    assert steps[1][10] and steps[0][10] is None and steps[2][10] is None  # the link went to step 1 alone
    assert [(r[0], r[2]) for r in full if r[0] in (_recorder.KIND_TAG, _recorder.KIND_EVENT)] == [
        (_recorder.KIND_TAG, "late"), (_recorder.KIND_EVENT, ("between", 1_000_000_056, {"x": 1}))]


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
            assert _recorder.current_region() is not handed_off
        assert _recorder.current_region() is None
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
            assert _recorder.current_region() is dropped
            _recorder.abandon(dropped)
            assert _recorder.current_region() is enclosing
        assert [r[1] for r in rec.buf] == ["enclosing"]
    finally:
        _recorder.install(None)


def test_the_whole_script_records_the_same_without_the_c_module() -> None:
    """Steps, tags, links and events too: the pure-Python classes in a process without `_hotpath`."""
    c_region = _c_region()
    code = ("import sys; sys.modules['otel_train._hotpath'] = None; sys.path.insert(0, 'tests')\n"
            "from otel_train import _recorder\n"
            "assert _recorder._Step is _recorder._PyStep\n"
            "from test_hotpath import _script\n"
            "print(repr(_script(_recorder._Region)))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=_REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == repr(_script(c_region))


def test_an_event_loop_started_after_the_first_regions_is_still_seen() -> None:
    """The C module finds asyncio only once something imports it: regions before that, then a
    loop's tasks, each nesting in its own task's regions."""
    _c_region()
    code = ("import sys\n"
            "from otel_train import _recorder\n"
            "from otel_train._clock import FakeClock\n"
            "assert 'asyncio' not in sys.modules\n"
            "rec = _recorder.Recorder(64, FakeClock()); _recorder.install(rec)\n"
            "with _recorder._Region('before.asyncio'): pass\n"
            "import asyncio\n"
            "async def task(i):\n"
            "    with _recorder._Region('task', i=i):\n"
            "        await asyncio.sleep(0)\n"
            "        with _recorder._Region('inner', i=i):\n"
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


def test_the_c_hot_path_leaks_nothing() -> None:
    """Every path that allocates, run 20,000 times into a small buffer (old records dropped and
    freed): the interpreter's live block count must not grow with the iterations."""
    c_region = _c_region()
    clock = FakeClock()
    rec = _recorder.Recorder(64, clock)
    _recorder.install(rec)

    def once(i: int) -> None:
        _recorder.link({"traceparent": "x"})
        with _recorder.new_step(epoch=1, k=i):
            _recorder.tag("t")
            with c_region("outer", mb=i):
                _recorder.event("e", {"i": i})
                with c_region("inner", device_time=False):
                    clock.advance(1)
            try:
                with c_region("fails"):
                    raise KeyError(i)
            except KeyError:
                pass
            dropped = c_region("abandoned").__enter__()
            _recorder.abandon(dropped)
        with c_region("between"):
            pass
        _recorder.record("recorded", {"a": 1}, 1, 2)

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


@pytest.mark.parametrize("name", ["_hotpath", "_encode"])
def test_the_c_module_is_built_where_a_compiler_is(name: str) -> None:
    """The extensions are optional at install, so a broken build would pass silently: not here."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}): the pure-Python fallbacks are in use")
    module = importlib.import_module(f"otel_train.{name}")

    source = Path(_recorder.__file__).with_name(f"{name}.c")
    if source.exists():  # an editable install: the built module must not predate its source
        assert Path(module.__file__).stat().st_mtime >= source.stat().st_mtime, \
            f"otel_train/{name}.c changed since the extension was built: pip install -e . again"


def test_the_recorder_tests_pass_with_the_python_fallback() -> None:
    """No compiler at install time means no `_hotpath`: the package must work the same without it."""
    code = ("import sys; sys.modules['otel_train._hotpath'] = None\n"
            "from otel_train import _recorder\n"
            "assert _recorder._Region is _recorder._PyRegion, _recorder._Region\n"
            "import pytest\n"
            "raise SystemExit(pytest.main(['-q', '-p', 'no:cacheprovider', 'tests/test_recorder.py',"
            " 'tests/test_hotpath.py', '-k', 'not python_fallback and not compiler']))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=_REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" in proc.stdout  # the C-only tests skip there
