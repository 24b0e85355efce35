"""The hot path: entering and leaving a region appends one tuple to a bounded buffer.

Nothing here talks to the OpenTelemetry SDK, formats a string, allocates a dict per call or
takes a lock. `__enter__` stores the parent region, the step, a sequence number and a
`perf_counter_ns` reading on the (slotted) region object; `__exit__` appends one tuple of
those to a `deque(maxlen=capacity)`, so a full buffer drops the oldest record (counted in
`Recorder.dropped`). The worker drains the deque and does everything else. With the exporter
process taking the records, the C recorder packs (`packing`): a plain region's record is a
fixed-size slot in a C ring instead of a tuple, the deque keeps only the other records, and the
worker moves a drain's slots as one bytes object (`_hotpath_recorder.c`, "the packed ring"). The
region and step types are C (`_hotpath.c`) where that module was built, with `_PyRegion` /
`_PyStep` here as the fallback: both append the same tuples (their layout: `wire.schema`), and
`tests/test_hotpath.py` holds them to it. Tags, events and links on the open step or region:
`attach`; what a misused region or step becomes: `misuse`; recording from hooks without a
`with` block: `direct`; device events: `device`.

Why a tuple of plain values, not the region object itself: a record waits in the buffer for up
to a flush interval, and objects that the garbage collector tracks and that live that long are
promoted to its oldest generation, whose growth triggers full collections of the whole heap
(a model's every module and tensor). Measured on the benchmark's 2.5 ms step: keeping region
objects caused ~34x more collections than the uninstrumented loop, and a full one every few
thousand steps (8-76 µs a step on average). A tuple that holds only strings, numbers and
`None` is untracked by the first young collection that sees it, so buffered records never
reach the old generations. Region objects die when their `with` block ends. (Records with
device events stay objects: the worker resolves their events in place.)

Parentage: a `ContextVar` holds the innermost open region (so threads and asyncio tasks
each see their own); the C regions keep it in a thread-local pointer instead wherever no
event loop runs (`current_get` reads either). Regions opened outside any region belong to
the open `train.step`.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import logging
import weakref
from collections import deque
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, TypeVar

from otel_train.record.clock import Clock, SystemClock
from otel_train.record.misuse import STEP_MAX, misused, span_name, step_number
from otel_train.wire.schema import (KIND_SPAN, KIND_STEP, NO_STEP, error_of, region_record, step_wire, tuple_to_wire,
                                    wall_events)

_log = logging.getLogger("otel_train")
_F = TypeVar("_F", bound=Callable[..., Any])

_current: ContextVar[Region | None] = ContextVar("otel_train_region", default=None)


try:  # the hot path in C (`_hotpath.c`); the pure-Python classes below are the fallback
    from otel_train.record import _hotpath
except ImportError:  # built without a compiler, or an interpreter it was not built for
    _hotpath = None  # type: ignore[assignment]

_RecorderBase: type = _hotpath.RecorderBase if _hotpath is not None else object


class Recorder(_RecorderBase):  # type: ignore[misc,valid-type]
    """Per-process state of the hot path; one instance lives in `_rec` while enabled.

    With the C hot path, `buf`, `cap`, `dropped`, `step`, `now`, `next_step`, `pending_links`
    and `step_end` live in its `RecorderBase`, where the C region and step read them without
    an attribute lookup."""

    def __init__(self, capacity: int, clock: Clock | None = None) -> None:
        self.clock: Clock = clock or SystemClock()
        self.now: Callable[[], int] = self.clock.perf_ns
        self.cap = capacity
        self.buf: deque[Any] = deque(maxlen=capacity)
        self.dropped = 0
        self.step: Step | After | None = None
        self.next_step = 0
        self.pending_links: list[Any] = []
        #: Called with the step right after its end time is read (device timing records the
        #: step's end event here, before the step is appended); None when device timing is off.
        self.step_end: Callable[[Step], None] | None = None

    if _hotpath is None:  # else `RecorderBase`'s, which also know the packed ring
        packing = False

        def append(self, record: Any) -> None:
            buf = self.buf
            if len(buf) == self.cap:
                self.dropped += 1
            buf.append(record)

        def pending(self) -> int:
            return len(self.buf)

        def drain(self, limit: int) -> list[Any]:
            """Pop up to `limit` records, oldest first (called by the worker only).

            Only the worker pops and an append to a full buffer drops one as it adds one, so the
            buffer holds at least `count` records throughout: the pops run in C, with no check."""
            count = min(limit, len(self.buf))
            return list(itertools.islice(iter(self.buf.popleft, None), count))

    def open_records(self) -> list[Region | Step]:
        """Regions still open in the calling context, innermost first, then the open step."""
        out: list[Region | Step] = []
        region = current_get()
        seen: set[int] = set()  # regions exited out of order can be each other's parents
        while region is not None and id(region) not in seen:
            seen.add(id(region))
            if getattr(region, "rec", None) is self and not hasattr(region, "t1"):
                out.append(region)
            region = getattr(region, "parent", None)
        if isinstance(self.step, Step):
            out.append(self.step)
        return out


_rec: Recorder | None = None
#: Set by `_runtime`: initialise from the environment on first use (a region entered before
#: `init()`), returning the recorder or None when disabled / shut down.
auto_init: Callable[[], Recorder | None] = lambda: None


def install(recorder: Recorder | None) -> None:
    global _rec
    _rec = recorder
    if _hotpath is not None:
        _hotpath.install(recorder)


def active() -> Recorder | None:
    return _rec


#: Numbers that name span ids (`wire.ids.region_span_id`), for regions and steps alike.
#: `next()` on it is one C call, atomic under the GIL.
seq: Any = _hotpath.seq if _hotpath is not None else itertools.count(1)


async def _aenter(region: Any) -> Any:
    """`async with` a region or step (`__aenter__` of the Python and C types alike)."""
    return region.__enter__()


async def _aexit(region: Any, exc_type: Any, exc: Any, tb: Any) -> None:
    region.__exit__(exc_type, exc, tb)


class _PyRegion:
    """One timed region (`otel_train.span`); usable as a context manager or a decorator.

    The pure-Python region: `Region` is the C one (`_hotpath.Region`, the same behaviour
    and records) where that module was built, this class otherwise. The class is its own
    factory (`otel_train.span is Region`): one call per region, which makes what the mode says
    (`set_span_target`, `span.py`). `events` and `dev` are filled in only when an event or
    device timing needs them; `ev1` only by the device region (`device._DeviceRegion`), which
    a region made here becomes while a device is timed.
    """

    __slots__ = ("name", "attrs", "rec", "parent", "token", "step", "seq", "t0", "t1",
                 "exc", "events", "dev", "timed", "ev1", "reentered")

    def __init__(self, name: str, *, device_time: bool | None = None, **attrs: Any) -> None:
        self.name = name
        self.attrs = attrs
        self.events = self.dev = None  # set now: reading an unset slot later costs an exception
        if device_time is not None:  # kept for `__call__`; only `device._DeviceRegion` acts on it
            self.timed = device_time
        if _py_span_target is not None and type(self) is _PyRegion:  # one global read while plain
            _py_retarget(self, name, device_time, attrs)

    def __enter__(self) -> _PyRegion:
        if getattr(self, "rec", None) is not None and not hasattr(self, "t1"):
            # Open already (`with sp: with sp:`): ignored, with its exit, as the C region does.
            self.reentered = getattr(self, "reentered", 0) + 1
            misused("reentered", self.name)
            return self
        r = _rec
        if r is None:
            r = auto_init()
            if r is None:
                self.rec = None
                return self
        self.rec = r
        if hasattr(self, "t1"):
            del self.t1  # used again: open from here
        self.parent = _current.get()
        self.token = _current.set(self)
        self.step = r.step
        self.seq = next(seq)
        self.t0 = r.now()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        r = getattr(self, "rec", None)
        if r is None:
            return
        if getattr(self, "reentered", 0):
            self.reentered -= 1
            return
        if hasattr(self, "t1"):
            misused("exited", self.name)
            return
        if type(self.name) is not str:
            self.name = span_name(self.name)
        self.t1 = t1 = r.now()
        try:
            _current.reset(self.token)
        except ValueError:  # exited in another context (e.g. a different asyncio task)
            _current.set(self.parent)
        buf = r.buf
        if len(buf) == r.cap:
            r.dropped += 1
        if self.dev is None:
            # `_parent_seq` and `_step_ref` written out: two calls fewer on the hot path.
            parent, step = self.parent, self.step
            buf.append(region_record(self.name, self.seq, parent.seq if parent is not None and parent.rec is r
                                     else None, step.ref if step is not None else NO_STEP, self.t0, t1,
                                     self.attrs or None, exc_type, self.events))
        else:
            self.exc = exc_type
            buf.append(self)

    __aenter__ = _aenter
    __aexit__ = _aexit

    def __call__(self, fn: _F) -> _F:
        return _decorate(self, fn)


def _decorate(region: Any, fn: _F) -> _F:
    """`@otel_train.span(name)`: each call of `fn` (sync or async) runs in a fresh region of that name."""
    # A fresh region per call, from the factory (`Region`), which reads the mode: a function
    # decorated at import time gets device events once device timing has chosen a device.
    name, attrs, timed = region.name, region.attrs or {}, getattr(region, "timed", None)
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            with Region(name, device_time=timed, **attrs):
                return await fn(*args, **kwargs)
        return async_wrapper  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with Region(name, device_time=timed, **attrs):
            return fn(*args, **kwargs)
    return wrapper  # type: ignore[return-value]


def _auto_init() -> Recorder | None:
    return auto_init()  # looked up per call: `_runtime` sets `auto_init` after this module loads


class _PyAfter:
    """Marks "between steps, after step `step`": spans here join that step's trace as siblings."""

    __slots__ = ("step", "ref")

    def __init__(self, step: Step) -> None:
        self.step = step
        self.ref = (step.n, None)


class _PyStep:
    """One training step (`otel_train.step`), explicit or driven by automatic detection.

    The pure-Python step: `Step` is the C one (`_hotpath.Step`) where that was built."""

    __slots__ = ("n", "epoch", "rec", "seq", "ref", "t0", "t1", "tags", "events", "links", "attrs",
                 "micro_batches", "exc", "dev")

    def __init__(self, n: int | None, epoch: int | None, attrs: dict[str, Any] | None = None) -> None:
        self.n = n
        self.epoch = epoch
        self.attrs = attrs
        self.micro_batches = 0
        self.dev: Any = None

    def __enter__(self) -> _PyStep:
        r = _rec
        if r is None:
            r = auto_init()
            if r is None:
                self.rec = None
                return self
        self.rec = r
        if isinstance(r.step, Step):
            _reopened(self, r)
        if self.n is None:
            self.n = r.next_step
        elif type(self.n) is not int or not 0 <= self.n <= STEP_MAX:
            self.n = step_number(self.n, r.next_step)
        r.next_step = self.n + 1
        self.seq = next(seq)
        self.ref = (self.n, self.seq)  # what a region records of the step it ran in
        self.tags: list[str] | None = None  # a list once tagged
        self.events = None
        self.links = r.pending_links or None
        r.pending_links = []
        r.step = self
        self.t0 = r.now()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        r = self.rec
        if r is None or r.step is not self:
            return
        close_step(r, self, r.now(), exc_type)

    __aenter__ = _aenter
    __aexit__ = _aexit


def _reopened(step: Any, r: Recorder) -> None:
    """A step begins while the last one is still open: say so, and close that one first."""
    _log.warning("otel_train: step %s began while step %s was still open; closing step %s first.",
                 step.n if step.n is not None else r.next_step, r.step.n, r.step.n)
    r.step.__exit__(None, None, None)


def _py_new_step(n: int | None = None, epoch: int | None = None, **attrs: Any) -> _PyStep:
    """Mark one training step: `with otel_train.step(n):` (n defaults to the previous step + 1)."""
    return _PyStep(n, epoch, attrs or None)


def _py_close_step(r: Recorder, step: _PyStep, t1: int, exc_type: Any) -> None:
    # The end must be in place before the record is appended: the worker may drain it at once.
    step.t1 = t1
    if r.step_end is not None:
        r.step_end(step)  # device timing: records the end event in `step.dev`
    step.exc = exc_type
    r.step = _PyAfter(step)
    if step.dev is not None:
        r.append(step)
    else:
        r.append((KIND_STEP, step.seq, step.n, step.t0, t1, step.attrs, step.epoch, step.micro_batches,
                  tuple(step.tags) if step.tags else None, step.events, step.links, exc_type))


if _hotpath is not None:
    Region: type = _hotpath.Region
    Step: type = _hotpath.Step
    After: type = _hotpath.After
    _hotpath.bind(_current, NO_STEP, KIND_SPAN, _auto_init, _decorate, _aenter, _aexit, misused, span_name)
    _hotpath.bind_steps(KIND_STEP, _reopened, step_number)
    #: `otel_train.step(n=None, epoch=None, **attrs)`
    new_step: Callable[..., Any] = _hotpath.step
    #: `close_step(recorder, step, t1, exc_type)`: end the open step at `t1`, append its record.
    close_step: Callable[[Recorder, Any, int, Any], None] = _hotpath.close_step
    #: The innermost open region here: the C regions keep it in a thread-local pointer outside
    #: an event loop and in `_current` inside one (`_hotpath.c`); the Python ones in `_current`.
    current_get: Callable[[], Any] = _hotpath.current
else:
    Region, Step, After = _PyRegion, _PyStep, _PyAfter
    new_step = _py_new_step
    close_step = _py_close_step
    current_get = _current.get

class _NoopRegion:
    """What `otel_train.span` hands out when disabled (`NOOP`, `span.py`).

    `__enter__` / `__exit__` are assigned C-level callables below (not Python methods), so a
    disabled `with otel_train.span(...)` costs the factory call and little more: `with` calls
    them unbound. `__enter__` is a weak reference to this object (calling it returns the
    object; the module keeps it alive). `__exit__` is `type.__prepare__`, which takes any
    arguments and returns a new empty dict: falsy, so exceptions propagate. These are the
    cheapest such callables measured here (about 20 ns a region below `repeat().__next__` with
    `"".format`).
    """

    __slots__ = ("__weakref__",)

    async def __aenter__(self) -> _NoopRegion:
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        return None

    def __call__(self, fn: _F) -> _F:
        return fn


NOOP = _NoopRegion()
_NoopRegion.__enter__ = weakref.ref(NOOP)  # type: ignore[attr-defined]
_NoopRegion.__exit__ = type.__prepare__  # type: ignore[attr-defined]


class _PyOff(_PyRegion):
    """A pure-Python region made while disabled: `NOOP`'s behaviour in a region's layout."""

    __slots__ = ()
    __enter__ = _NoopRegion.__enter__  # NOOP itself, as `with otel_train.span(...) as r` gives it in C
    __exit__ = _NoopRegion.__exit__

    def __call__(self, fn: _F) -> _F:
        return fn


#: The pure-Python regions' `set_span_target`: None while plain, else the `_PyRegion` subclass
#: a region made as `Region` becomes (`_py_retarget`). The C type hands out the target itself.
_py_span_target: Any = None


def _py_retarget(region: Any, name: str, device_time: bool | None, attrs: dict[str, Any]) -> None:
    """`Region(...)` while not plain, without C: the new region becomes the class the mode
    wants (the same layout, so `__class__` may change), initialised as that class is."""
    target = _py_span_target
    region.__class__ = target
    if target is not _PyOff:
        target.__init__(region, name, device_time=device_time, **attrs)


def set_span_target(target: Any) -> None:
    """What `Region(...)` (`otel_train.span(...)`) makes from now on: None (or `Region`), a
    `Region`; a `Region` subclass, an instance of it; `NOOP`, the disabled no-op. Set by
    `span.py`, which knows the mode; the public name stays `Region` whatever it is."""
    global _py_span_target
    if _hotpath is not None:
        _hotpath.set_span_target(target)
    else:
        _py_span_target = None if target is None or target is Region else _PyOff if target is NOOP else target


def settle() -> None:
    """Let detection's calls that wait (`detect.batch`) run first: before reading or changing
    the step, the current region or what they record."""
    if _hotpath is not None:
        _hotpath.settle()


def _step_ref(step: Step | After | None) -> tuple[int | None, int | None]:
    """(step number, step seq) of the step a region ran in; seq is None between steps."""
    return step.ref if step is not None else NO_STEP


def _parent_seq(parent: Region | None, rec: Recorder | None) -> int | None:
    """The seq of a region's parent, if that parent was recorded by the same recorder."""
    return parent.seq if parent is not None and parent.rec is rec else None


def to_wire(record: Any, offset: int) -> tuple[Any, ...]:
    """One drained record as a wire tuple (`wire.schema`); `offset` maps perf ns to wall ns.
    A hot-path tuple, or a record that stayed an object: with device time, or force-ended."""
    if type(record) is tuple:
        return tuple_to_wire(record, offset)
    if isinstance(record, Step):
        return step_wire(record.seq, record.n, record.t0, record.t1, record.attrs, record.epoch,
                         record.micro_batches, record.tags, record.events, record.links, record.exc,
                         record.dev, offset)
    step_n, step_seq = _step_ref(record.step)
    error, truncated = error_of(record.exc)
    return (KIND_SPAN, record.name, record.seq, _parent_seq(record.parent, record.rec), step_n, step_seq,
            record.t0 + offset, record.t1 + offset, record.attrs or None, wall_events(record.events, offset), None,
            error, truncated, record.dev)


def unpack(slots: bytes, side: list[Any], wire: list[bool] | None, strings: list[str]) -> Any:
    """What `RecorderBase.drain_packed` gave (side records made wire where `wire` says so), back
    as runs of records (`export.pipe.Segments`); `strings` is the recorder's table."""
    return _hotpath.unpack(slots, side, wire, strings)  # type: ignore[union-attr]
