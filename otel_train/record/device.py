"""Device time without synchronisation: events on the current stream, resolved by the worker.

What it does
------------
With device timing on (`OTEL_TRAIN_DEVICE_TIMING=auto`, the default), a timed region
(`train.forward`, `train.backward`, `train.optimizer`, `train.collective`, `train.checkpoint`,
`train.eval`, any `otel_train.span(..., device_time=True)`) records one device event on the
current stream when it is entered and one when it is left, and every `train.step` records one
event when it ends. Recording is all the training thread does: `event.record()`, which only
enqueues a marker behind the work already queued, called by the C region and step themselves
(`_hotpath_device.c`, from this module's pool; `_DeviceRegion` where C was not built). The worker thread polls the events with
`query()` and reads `elapsed_time` only once both have completed; until then the record is
parked (and everything recorded after it, so a step never overtakes its phases). Then the span
gets `device.duration_s` (device time between its two events), `device.lag_s` (how long after
the host dispatched the region the device started it: the queue in front of it) and
`device.type`; the step's end event becomes the boundary `train.step.time_s` is measured from
(`export.step_timeline`). No `synchronize()`, `Event.synchronize()`, `.item()` or blocking
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
The events and their pool: `device_events`; the worker's side: `device_resolver`.

Known limits: events are recorded on the *current* stream of the *current* device, so work on
other streams is timed only as far as the current stream waits for it, and a process driving
several devices without `set_device` times the current one. Regions are skipped while a CUDA
graph is being captured.
"""

from __future__ import annotations

import logging
import sys
from collections import deque
from collections.abc import Callable
from typing import Any

from otel_train import _compat, semconv
from otel_train.record import recorder as _recorder
from otel_train.record import span
from otel_train.record.device_events import _POOL_SIZE, DeviceEvent, EventFactory, EventPool, torch_events
from otel_train.record.device_resolver import MAX_PARKED, MAX_WAIT_NS, DeviceResolver
from otel_train.record.recorder import Step, _PyRegion

_log = logging.getLogger("otel_train")

_REGION_PROBES = 64  # regions that look for an accelerator before steps alone keep looking


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
                or (xpu is not None and _compat.xpu_compiled(xpu)))


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


# --- the hot path -----------------------------------------------------------------
_timing: DeviceTiming | None = None
_pool: EventPool | None = None  # read by `_DeviceRegion`; None until a device is chosen


class _DeviceRegion(_PyRegion):
    """The pure-Python region that also records device events at entry and exit, where the C
    hot path was not built (the C region records them itself: `_hotpath_device.c`).

    `timed` says whether this one asks for device time: `device_time=` when given, else
    whether its name is one of `semconv.DEVICE_TIMED_SPANS`.
    """

    __slots__ = ()  # `ev1`, its end event, is a slot of `_PyRegion` (a region becomes this in place)

    def __init__(self, name: str, *, device_time: bool | None = None, **attrs: Any) -> None:
        self.name = name
        self.attrs = attrs
        self.events = self.dev = None  # as `Region.__init__`, without its extra call
        self.timed = name in _DEVICE_TIMED if device_time is None else device_time

    def drop_events(self) -> None:
        """`direct.abandon`: the region will never be recorded; its start event goes back."""
        event = getattr(self, "dev", None)
        if event is not None:
            self.dev = None
            timing = _timing
            if timing is not None:
                timing.dropped.append(event)  # the worker returns it once complete

    def __enter__(self) -> _DeviceRegion:
        # Open already (`with sp: with sp:`): `_PyRegion` ignores it, and no event is taken
        # for it either (it would never go back to the pool).
        reentry = getattr(self, "rec", None) is not None and not hasattr(self, "t1")
        _PyRegion.__enter__(self)  # reads t0 before the event is recorded (the anchor relies on it)
        if reentry:
            return self
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
        # Only the exit that ends the region takes its end event: not a re-entry's, not a second one.
        if (self.timed and self.rec is not None and self.dev is not None and not getattr(self, "reentered", 0)
                and not hasattr(self, "t1")):
            pool = _pool
            # Recorded before the record is appended: the worker must never see half of it.
            self.ev1 = pool.take() if pool is not None else None
        _PyRegion.__exit__(self, exc_type, exc, tb)


_DEVICE_TIMED = frozenset(semconv.DEVICE_TIMED_SPANS)


def _py_end_event(region: Any) -> None:
    """The end event of a region recorded later than it ends (`direct.finish`: the optimizer
    phase, which ends with the last of its calls): recorded now, in place of an earlier one.
    `end_event`: the C one (`_hotpath.end_event`) where the hot path is built."""
    pool = _pool
    if pool is None or not getattr(region, "timed", False) or region.dev is None:
        return
    old = getattr(region, "ev1", None)
    region.ev1 = pool.take()
    timing = _timing
    if old is not None and timing is not None:
        timing.dropped.append(old)  # the worker returns it to the pool once complete


_hotpath = _recorder._hotpath
end_event: Callable[[Any], None] = _hotpath.end_event if _hotpath is not None else _py_end_event


def drop_events(region: Any) -> None:
    """The region will never be recorded (`direct.abandon`): its device events go back through
    the worker once complete."""
    if _hotpath is not None and isinstance(region, _hotpath.Region):
        _hotpath.drop_events(region)
        return
    drop = getattr(region, "drop_events", None)
    if drop is not None:
        drop()


def _publish() -> None:
    """Tell `otel_train.span` (and functions decorated with it) which regions to make now.

    `_DeviceRegion` while a device is timed or the first regions may still find one; the
    plain `Region` otherwise, so a CPU-only run pays nothing for device timing (`span.py`).
    Likewise the recorder's `step_end` hook: none once no device can be timed (a Python call a
    step saved).
    """
    timing = _timing
    pool = timing.pool if timing is not None else None
    probing = timing is not None and pool is None and not timing.settled and timing.region_probes > 0
    if _hotpath is not None:  # the C region and step record the events themselves
        _hotpath.set_device(pool.free if pool is not None else None, pool.take if pool is not None else None,
                            pool._fail if pool is not None else None, pool.skip_if if pool is not None else None,
                            _DEVICE_TIMED, timing.region_probe if probing else None,
                            timing.dropped.append if timing is not None else None)
    if timing is not None and timing.recorder is not None:
        # With C the step's end event is the C step's own, while a device is timed; until one
        # is (or none can be), steps look for one here.
        looking = pool is None and not timing.settled
        timing.recorder.step_end = timing.on_step_end if looking or (pool is not None and _hotpath is None) else None
    cls = _DeviceRegion if _hotpath is None and (pool is not None or probing) else None
    if span.device_region() is not cls:
        span.set_device_region(cls)


def use_device(where: Any) -> None:
    """Tell device timing where the model lives (a module, tensor, torch.device or "cuda:0")."""
    timing = _timing
    if timing is not None:
        timing.use_device(where)


def active() -> DeviceTiming | None:
    return _timing


def install(recorder: _recorder.Recorder, pool_size: int = _POOL_SIZE, max_parked: int = MAX_PARKED,
            max_wait_s: float = MAX_WAIT_NS / 1e9) -> DeviceResolver:
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
