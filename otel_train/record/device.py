"""Device time without synchronisation: events on the current stream, resolved by the worker.

What it does
------------
With device timing on (`OTEL_TRAIN_DEVICE_TIMING=auto`, the default), a timed region
(`train.forward`, `train.backward`, `train.optimizer`, `train.collective`, `train.checkpoint`,
`train.eval`, any `otel_train.span(..., device_time=True)`) records one device event on the
current stream when it is entered and one when it is left, and every `train.step` records one
event when it ends. Recording is all the training thread does: `event.record()`, which only
enqueues a marker behind the work already queued. The worker thread polls the events with
`query()` and reads `elapsed_time` only once both have completed; until then the record is
parked (and everything recorded after it, so a step never overtakes its phases). Then the span
gets `device.duration_s` (device time between its two events), `device.lag_s` (how long after
the host dispatched the region the device started it: the queue in front of it) and
`device.type`; the step's end event becomes the boundary `train.step.time_s` is measured from
(`_spans.SpanAssembler`). No `synchronize()`, `Event.synchronize()`, `.item()` or blocking
`elapsed_time` is ever called on the training thread.

Which device: the first accelerator the process has initialised (`torch.cuda`, `torch.xpu`,
then MPS when it holds memory; torch is looked up in `sys.modules`, never imported here), or
the device an integration names with `use_device(model or tensor or "cuda:0")`. The choice is
made lazily: while no accelerator is in use, the first regions and every step end look again,
so `init()` may run before `model.cuda()`. On CPU, work runs synchronously with the host, so
host durations already are device durations and host step boundaries already are honest:
no events are recorded and no `device.*` attribute is added (identical numbers would only
cost bytes), and `train.step.time_s` keeps its host definition. Other accelerators get the
generic `torch.Event(device, enable_timing=True)` when their backend supports timing.

Events come from a bounded pool and go back to it once read, so a steady state allocates
none. When the pool is empty (a hung kernel keeps every event pending), new regions get no
device time (`skipped` counts them); parked records beyond `max_parked`, or parked longer than
`max_wait_s`, are released without device attributes (`unresolved` counts them) and their
events wait in a limbo list until they complete. Nothing grows without bound and nothing waits.

Anchoring (how device times become host times)
----------------------------------------------
Device events only give differences (`elapsed_time`, ms). The resolver keeps one *reference
event* `ref` and an estimate `ref_host` of the host `perf_counter_ns` at which it completed;
an event `e` then completed at `ref_host + elapsed(ref, e)`. Every resolved event bounds
`ref_host`: an event cannot complete before the host recorded it, and the host reads its
timestamp (region start, step end) *before* calling `record()`, so
`ref_host >= t_record - elapsed(ref, e)`; and it had completed when the worker saw `query()`
return True, so `ref_host <= t_seen - elapsed(ref, e)`. The estimate is the tightest lower
bound seen, clamped by the upper bounds. The lower bound is exact (up to the launch latency,
a few microseconds) for any event recorded while the device was idle: the first event of a
run, and every event after a natural sync (a logged `loss.item()`, the copies of a checkpoint,
an evaluation), which re-anchor it for free. Consequences:

- `device.duration_s` is exact to the event resolution (CUDA: about 0.5 us); it does not depend
  on the anchor.
- `device.lag_s` and the device boundaries are lower bounds of the truth, off by at most the
  launch latency plus the drift between the device and host clocks (tens of ppm) accumulated
  since the device was last idle; they are never negative.
- `ref` is moved to a recent event every `_REBASE_NS` (10 s), so `elapsed_time`, a float32 of
  milliseconds in CUDA, keeps microsecond precision however long the run.

Known limits: events are recorded on the *current* stream of the *current* device, so work on
other streams is timed only as far as the current stream waits for it, and a process driving
several devices without `set_device` times the current one. Regions are skipped while a CUDA
graph is being captured.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from otel_train import semconv
from otel_train.record import recorder as _recorder
from otel_train.record.clock import Clock
from otel_train.record.recorder import Region, Step

_log = logging.getLogger("otel_train")

_POOL_SIZE = 4096  # events alive at most (pooled, parked, in limbo or the reference)
_MAX_PARKED = 16384  # records waiting for their events before the oldest goes without
_MAX_WAIT_NS = 60_000_000_000  # a record waits this long (host time) for its device
_REBASE_NS = 10_000_000_000  # keep the reference event this recent (float32 ms precision)
_REGION_PROBES = 64  # regions that look for an accelerator before steps alone keep looking
_FLUSH_WAIT_S = 2.0  # at shutdown, how long the final drain waits for pending events


class DeviceEvent(Protocol):
    """The event API the resolver needs; torch.cuda/xpu/mps.Event and torch.Event have it."""

    def record(self) -> None: ...

    def query(self) -> bool: ...

    def elapsed_time(self, end_event: Any) -> float: ...


EventFactory = Callable[[], DeviceEvent]


# --- event factories ---------------------------------------------------------------
def torch_events(device_type: str, index: int | None = None) -> tuple[EventFactory, Callable[[], bool] | None] | None:
    """(factory, skip_if) for timing events on `device_type`, or None when it has none."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    if device_type == "cuda":
        if not torch.cuda.is_available():
            return None
        event_cls = torch.cuda.Event
        return (lambda: event_cls(enable_timing=True)), torch.cuda.is_current_stream_capturing
    if device_type == "xpu":
        if not (hasattr(torch, "xpu") and torch.xpu.is_available()):
            return None
        event_cls = torch.xpu.Event
        return (lambda: event_cls(enable_timing=True)), None
    if device_type == "mps":
        event_cls = torch.mps.event.Event
        return (lambda: event_cls(enable_timing=True)), None
    if device_type in ("cpu", "meta") or not hasattr(torch, "Event"):
        return None
    device = torch.device(device_type, index) if index is not None else torch.device(device_type)
    try:
        probe = torch.Event(device=device, enable_timing=True)
        del probe
    except Exception as err:  # noqa: BLE001 - a backend without timing events
        _log.info("otel_train: %s has no timing events (%s); its spans carry host time only.", device_type, err)
        return None
    generic = torch.Event
    return (lambda: generic(device=device, enable_timing=True)), None


class EventPool:
    """A bounded free list of timing events; `take` records one on the current stream."""

    __slots__ = ("factory", "size", "free", "created", "skipped", "skip_if", "failed")

    def __init__(self, factory: EventFactory, size: int = _POOL_SIZE,
                 skip_if: Callable[[], bool] | None = None) -> None:
        self.factory = factory
        self.size = size
        self.free: list[DeviceEvent] = []  # list.pop/append are atomic: no lock between threads
        self.created = 0
        self.skipped = 0
        self.skip_if = skip_if
        self.failed = False

    def take(self) -> DeviceEvent | None:
        """An event recorded on the current stream now, or None (pool empty, capture, error)."""
        skip_if = self.skip_if
        if skip_if is not None and skip_if():
            self.skipped += 1
            return None
        try:
            event = self.free.pop()
        except IndexError:
            if self.created >= self.size or self.failed:
                self.skipped += 1
                return None
            self.created += 1
            try:
                event = self.factory()
            except Exception as err:  # noqa: BLE001 - never raise into the training loop
                self._fail(err)
                return None
        try:
            event.record()
        except Exception as err:  # noqa: BLE001
            self._fail(err)
            return None
        return event

    def give(self, event: DeviceEvent) -> None:
        if not self.failed:
            self.free.append(event)

    def _fail(self, err: Exception) -> None:
        self.skipped += 1
        if not self.failed:
            self.failed = True
            self.free.clear()  # with nothing to pop and nothing given back, `take` stops recording
            _log.warning("otel_train: recording a device event failed (%s); device timing is off from here.", err)


# --- per-process state ------------------------------------------------------------
class DeviceTiming:
    """Which device is timed and with what events; the hot path sees only its pool."""

    def __init__(self, pool_size: int = _POOL_SIZE) -> None:
        self.pool_size = pool_size
        self.pool: EventPool | None = None
        self.device_type: str | None = None
        self.settled = False  # an explicit choice (or an accelerator) was made: stop probing
        self.built: bool | None = None  # this torch build has an accelerator (known at the first probe)
        self.region_probes = _REGION_PROBES
        self.dropped: deque[DeviceEvent] = deque()  # events of abandoned regions (training thread)
        self.recorder: _recorder.Recorder | None = None  # whose `step_end` this is (`install`)

    @property
    def skipped(self) -> int:
        return self.pool.skipped if self.pool is not None else 0

    def use(self, factory: EventFactory, device_type: str, skip_if: Callable[[], bool] | None = None) -> None:
        """Time with events from `factory` (integrations with their own events, and tests)."""
        global _pool
        self.pool = EventPool(factory, self.pool_size, skip_if)
        self.device_type = device_type
        self.settled = True
        if _timing is self:
            _pool = self.pool
            _publish()

    def use_device(self, where: Any) -> bool:
        """Time the device `where` lives on (a module, tensor, torch.device or string)."""
        device_type, index = _device_of(where)
        if device_type is None:
            return False
        if self.settled and self.device_type == device_type:
            return True
        events = torch_events(device_type, index)
        if events is None:
            # CPU (or no timing events): host time is the truth; stop looking.
            self.settled = True
            if _timing is self:
                _publish()
            return False
        self.use(events[0], device_type, events[1])
        return True

    def probe(self) -> bool:
        """Look for an accelerator the process has initialised; True once one is timed."""
        if self.settled:
            return self.pool is not None
        torch = sys.modules.get("torch")
        if torch is None:
            return False
        try:
            if self.built is None:
                self.built = _accelerator_built(torch)
            if not self.built:
                # A CPU-only build: nothing can ever be timed; stop paying for the look each step.
                self.settled = True
                if _timing is self:
                    _publish()
                return False
            if torch.cuda.is_initialized():
                return self.use_device("cuda")
            xpu = getattr(torch, "xpu", None)
            if xpu is not None and xpu.is_initialized():
                return self.use_device("xpu")
            if torch.backends.mps.is_available() and torch.mps.current_allocated_memory() > 0:
                return self.use_device("mps")
        except Exception as err:  # noqa: BLE001 - an odd build; never raise into training
            _log.debug("otel_train: device probe failed: %s", err)
            self.settled = True
            if _timing is self:
                _publish()
        return False

    def region_probe(self) -> bool:
        """A region looking for the device (only the first `_REGION_PROBES` do)."""
        if self.settled or self.region_probes <= 0:
            return False
        self.region_probes -= 1
        if self.probe():
            return True
        if self.region_probes <= 0 and _timing is self:
            _publish()  # steps keep looking; regions stop paying for it
        return False

    def on_step_end(self, step: Step) -> None:
        """`Recorder.step_end` hook: the step's end event, its device-synchronised boundary."""
        pool = self.pool
        if pool is None:
            if self.settled or not self.probe():
                return
            pool = self.pool
        step.dev = pool.take()  # type: ignore[union-attr]


def _accelerator_built(torch: Any) -> bool:
    """Whether this torch build has any accelerator `probe` looks for (compile-time facts)."""
    xpu = getattr(torch, "xpu", None)
    return bool(torch.backends.cuda.is_built() or torch.backends.mps.is_built()
                or (xpu is not None and getattr(xpu, "_is_compiled", lambda: True)()))


def _device_of(where: Any) -> tuple[str | None, int | None]:
    if isinstance(where, str):
        kind, _, index = where.partition(":")
        return kind, int(index) if index.isdigit() else None
    device = getattr(where, "device", None)
    if device is None and hasattr(where, "parameters"):  # an nn.Module: its first parameter
        for param in where.parameters():
            device = param.device
            break
    if device is None and hasattr(where, "type"):
        device = where
    if device is None:
        return None, None
    return device.type, device.index


# --- the worker side: resolve records whose events have completed -------------------
def _ns(ms: float) -> int:
    return round(ms * 1e6)


class DeviceResolver:
    """The Worker's `resolve` hook: records in (drain order), records ready to export out."""

    def __init__(self, timing: DeviceTiming, clock: Clock, max_parked: int = _MAX_PARKED,
                 max_wait_ns: int = _MAX_WAIT_NS) -> None:
        self.timing = timing
        self.now = clock.perf_ns
        self.max_parked = max_parked
        self.max_wait_ns = max_wait_ns
        self.parked: deque[Any] = deque()
        self.limbo: deque[tuple[EventPool, DeviceEvent]] = deque()
        self.unresolved = 0  # records released without device time (never completed in time)
        self._ref: DeviceEvent | None = None
        self._ref_pool: EventPool | None = None
        self._ref_host = 0  # estimated host perf ns at which `_ref` completed
        self._warned = False

    # -- Worker hooks --------------------------------------------------------------------
    def idle(self) -> bool:
        """No device chosen (yet, or ever: a CPU run) and nothing held: no record can carry an
        event, since events come from the pool, so records need no resolving."""
        return self.timing.pool is None and not self.parked and not self.limbo and not self.timing.dropped

    def __call__(self, batch: list[Any]) -> list[Any]:
        if self.idle():  # every record in `batch` was recorded before now, so none has an event
            return batch
        parked = self.parked
        parked.extend(batch)
        out: list[Any] = []
        now = self.now()
        while parked:
            record = parked[0]
            if not self._try(record):
                if len(parked) <= self.max_parked and now - _host_end(record) <= self.max_wait_ns:
                    break  # everything behind it waits: a step never overtakes its phases
                self._give_up(record)
            out.append(parked.popleft())
        dropped, pool = self.timing.dropped, self.timing.pool
        while dropped:
            event = dropped.popleft()
            if pool is not None:
                self.limbo.append((pool, event))
        self._drain_limbo()
        return out

    def flush(self, deadline: float) -> list[Any]:
        """Final drain (shutdown): wait briefly for pending events, then release everything."""
        out = self([])
        until = min(time.monotonic() + _FLUSH_WAIT_S, deadline - 0.25)
        while self.parked and time.monotonic() < until:
            time.sleep(0.001)
            out.extend(self([]))
        while self.parked:
            record = self.parked.popleft()
            if not self._try(record):
                self._give_up(record)
            out.append(record)
        return out

    # -- one record ----------------------------------------------------------------------
    def _try(self, record: Any) -> bool:
        try:
            return self._resolve(record)
        except Exception as err:  # noqa: BLE001 - a device error must not kill the worker
            if not self._warned:
                self._warned = True
                _log.warning("otel_train: reading device events failed (%s); the spans concerned carry "
                             "host time only.", err)
            self._give_up(record)
            return True

    def _resolve(self, record: Any) -> bool:
        """True when `record` is ready (its `dev` is now a dict or None); False: wait."""
        dev = getattr(record, "dev", None)
        if dev is None or type(dev) is dict:
            return True
        pool = self.timing.pool
        if isinstance(record, Step):
            if not dev.query():
                return False
            seen = self.now()
            d_end = self._since_ref(dev, record.t1, pool)
            # Bounds: recorded after t1 was read; complete by the time the worker saw it.
            self._bound(record.t1 - d_end, seen - d_end)
            end_host = self._ref_host + d_end
            record.dev = {semconv.DEVICE_TYPE: self.timing.device_type,
                          semconv.WIRE_DEV_END_NS: end_host - record.t1}
            self._done(dev, end_host, pool)
            return True
        end = getattr(record, "ev1", None)
        if end is None:  # no end event (pool empty at exit, or force-ended at shutdown)
            self._give_up(record)
            return True
        if not dev.query() or not end.query():
            return False
        seen = self.now()
        duration = _ns(dev.elapsed_time(end))
        d_start = self._since_ref(dev, record.t0, pool)
        self._bound(record.t0 - d_start, seen - d_start - duration)
        start_host = self._ref_host + d_start
        lag = start_host - record.t0
        record.dev = {semconv.DEVICE_DURATION_S: duration / 1e9, semconv.DEVICE_LAG_S: max(lag, 0) / 1e9,
                      semconv.DEVICE_TYPE: self.timing.device_type,
                      semconv.WIRE_DEV_START_NS: lag,
                      semconv.WIRE_DEV_END_NS: start_host + duration - record.t1}
        record.ev1 = None
        self._done(dev, start_host, pool)
        if pool is not None:
            pool.give(end)
        return True

    def _since_ref(self, event: DeviceEvent, t_record: int, pool: EventPool | None) -> int:
        """ns from the reference event to `event` (both complete); `event` becomes it if none."""
        if self._ref is None:
            self._ref, self._ref_pool, self._ref_host = event, pool, t_record
            return 0
        return _ns(self._ref.elapsed_time(event))

    def _bound(self, lower: int, upper: int) -> None:
        if lower > self._ref_host:
            self._ref_host = lower
        if upper < self._ref_host:
            self._ref_host = upper

    def _done(self, event: DeviceEvent, event_host: int, pool: EventPool | None) -> None:
        """Return `event` to its pool, or make it the new reference when the old one is stale."""
        if event is self._ref:
            return
        if event_host - self._ref_host > _REBASE_NS:
            old, old_pool = self._ref, self._ref_pool
            self._ref, self._ref_pool, self._ref_host = event, pool, event_host
            event, pool = old, old_pool  # type: ignore[assignment]
        if pool is not None and event is not None:
            pool.give(event)

    def _give_up(self, record: Any) -> None:
        """Release `record` without device time; its events go to limbo until they complete."""
        pool = self.timing.pool
        for name in ("dev", "ev1"):
            event = getattr(record, name, None)
            if event is not None and type(event) is not dict:
                if pool is not None and event is not self._ref:
                    self.limbo.append((pool, event))
                setattr(record, name, None)
        self.unresolved += 1

    def _drain_limbo(self) -> None:
        limbo = self.limbo
        while limbo:
            pool, event = limbo[0]
            try:
                done = event.query()
            except Exception:  # noqa: BLE001 - an event of a device that went away
                done = True
                pool = None  # type: ignore[assignment]
            if not done:
                return  # stream order: what comes after it is not done either
            limbo.popleft()
            if pool is not None:
                pool.give(event)


def _host_end(record: Any) -> int:
    return getattr(record, "t1", 0) or 0


# --- the hot path -----------------------------------------------------------------
_timing: DeviceTiming | None = None
_pool: EventPool | None = None  # read by `_DeviceRegion`; None until a device is chosen


class _DeviceRegion(Region):
    """A region that also records device events at entry and exit (cheap: `record()` only).

    `timed` says whether this one asks for device time: `device_time=` when given, else
    whether its name is one of `semconv.DEVICE_TIMED_SPANS`.
    """

    __slots__ = ("ev1",)

    def __init__(self, name: str, *, device_time: bool | None = None, **attrs: Any) -> None:
        self.name = name
        self.attrs = attrs
        self.events = self.dev = None  # as `Region.__init__`, without its extra call
        self.timed = name in _DEVICE_TIMED if device_time is None else device_time

    def drop_events(self) -> None:
        """`_recorder.abandon`: the region will never be recorded; its start event goes back."""
        event = getattr(self, "dev", None)
        if event is not None:
            self.dev = None
            timing = _timing
            if timing is not None:
                timing.dropped.append(event)  # the worker returns it once complete

    def __enter__(self) -> _DeviceRegion:
        Region.__enter__(self)  # reads t0 before the event is recorded (the anchor relies on it)
        if self.timed and self.rec is not None:
            pool = _pool
            if pool is None:
                timing = _timing
                if timing is None or not timing.region_probe():
                    self.dev = None
                    return self
                pool = _pool
            self.dev = pool.take()  # type: ignore[union-attr]
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self.timed and self.rec is not None and self.dev is not None:
            pool = _pool
            # Recorded before the record is appended: the worker must never see half of it.
            self.ev1 = pool.take() if pool is not None else None
        Region.__exit__(self, exc_type, exc, tb)


_DEVICE_TIMED = frozenset(semconv.DEVICE_TIMED_SPANS)


def _publish() -> None:
    """Point `otel_train.span` (and decorated functions) at the region class now in force.

    `_DeviceRegion` while a device is timed or the first regions may still find one; the
    plain `Region` otherwise, so a CPU-only run pays nothing for device timing. Likewise the
    recorder's `step_end` hook: none once no device can be timed (a Python call a step saved).
    """
    timing = _timing
    if timing is not None and timing.recorder is not None:
        timing.recorder.step_end = timing.on_step_end if timing.pool is not None or not timing.settled else None
    wanted = timing is not None and (timing.pool is not None or
                                     (not timing.settled and timing.region_probes > 0))
    cls: type[Region] = _DeviceRegion if wanted else Region
    if _recorder.region_factory is cls:
        return
    _recorder.region_factory = cls
    package = sys.modules.get("otel_train")
    if package is not None and isinstance(getattr(package, "span", None), type):  # not the disabled no-op
        package.span = cls  # type: ignore[attr-defined]


def use_device(where: Any) -> None:
    """Tell device timing where the model lives (a module, tensor, torch.device or "cuda:0")."""
    timing = _timing
    if timing is not None:
        timing.use_device(where)


def active() -> DeviceTiming | None:
    return _timing


def install(recorder: _recorder.Recorder, pool_size: int = _POOL_SIZE, max_parked: int = _MAX_PARKED,
            max_wait_s: float = _MAX_WAIT_NS / 1e9) -> DeviceResolver:
    """Turn device timing on for `recorder`; returns the Worker's `resolve` hook."""
    global _timing, _pool
    timing = DeviceTiming(pool_size)
    _timing, _pool = timing, None
    timing.recorder = recorder
    recorder.step_end = timing.on_step_end
    if not timing.probe():
        _publish()
    return DeviceResolver(timing, recorder.clock, max_parked, int(max_wait_s * 1e9))


def uninstall() -> None:
    """Turn device timing off (shutdown, or a forked child, which must not touch the parent's events)."""
    global _timing, _pool
    _timing, _pool = None, None
    _publish()
