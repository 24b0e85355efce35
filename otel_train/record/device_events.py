"""Device timing events: what makes them (`torch_events`) and the bounded pool they come from.

Shared by the training thread's side (`device`, which records them) and the worker's
(`device_resolver`, which polls them and gives them back); torch is looked up in
`sys.modules`, never imported here.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any, Protocol

from otel_train import _compat

_log = logging.getLogger("otel_train")

_POOL_SIZE = 4096  # events alive at most (pooled, parked, in limbo or the reference)


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
        # The capture check in C where torch has it (`torch.cuda.is_current_stream_capturing` is a
        # Python function around it), and `torch.Event` (C: `record()` reads the current stream
        # in C) where it can time CUDA (torch 2.4 on): `torch.cuda.Event.record` calls
        # `torch.cuda.current_stream()`, which builds a `Stream` object in Python at every call.
        capturing = _compat.cuda_capturing_check(torch)
        if _torch_at_least(torch, 2, 4) and hasattr(torch, "Event"):
            generic, cuda = torch.Event, torch.device("cuda")
            return (lambda: generic(device=cuda, enable_timing=True)), capturing
        event_cls = torch.cuda.Event
        return (lambda: event_cls(enable_timing=True)), capturing
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


def _torch_at_least(torch: Any, major: int, minor: int) -> bool:
    try:
        found = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    except ValueError:
        return False
    return found >= (major, minor)


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
