"""Device time resolved on the worker thread: events polled, anchored to the host clock.

The worker hands every drained record to `DeviceResolver` (its `resolve` hook). A record whose
device events have not completed is parked, with everything recorded after it, so a step never
overtakes its phases; once both have completed, `elapsed_time` gives its device duration, and
the anchor below its place on the host clock. Nothing here runs on the training thread, and
nothing waits: `query()` only. What records events, and when: `device`.

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
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any, Protocol

from otel_train import semconv
from otel_train.record.clock import Clock
from otel_train.record.device_events import DeviceEvent, EventPool
from otel_train.record.recorder import Step

_log = logging.getLogger("otel_train")

MAX_PARKED = 16384  # records waiting for their events before the oldest goes without
MAX_WAIT_NS = 60_000_000_000  # a record waits this long (host time) for its device
_REBASE_NS = 10_000_000_000  # keep the reference event this recent (float32 ms precision)
_FLUSH_WAIT_S = 2.0  # at shutdown, how long the final drain waits for pending events


class DeviceTiming(Protocol):
    """What the resolver reads of the training thread's choice (`device.DeviceTiming`)."""

    pool: EventPool | None  # where events come from and go back to; None until a device is chosen
    device_type: str | None
    dropped: deque[DeviceEvent]  # events of abandoned regions, for limbo


def _ns(ms: float) -> int:
    return round(ms * 1e6)


class DeviceResolver:
    """The Worker's `resolve` hook: records in (drain order), records ready to export out."""

    def __init__(self, timing: DeviceTiming, clock: Clock, max_parked: int = MAX_PARKED,
                 max_wait_ns: int = MAX_WAIT_NS) -> None:
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
        self.tidy()
        return out

    def record_capacity(self) -> int:
        """Records with events that may be in flight before the pool runs dry (two events each):
        the worker drains before a quarter of them are (`DrainPacer`), so a fast loop's events
        come back to the pool in time (0: no device timed)."""
        pool = self.timing.pool
        return pool.size // 2 if pool is not None else 0

    def ready(self, side: list[Any], held: int) -> int:
        """The packed path's hook: how many of `side`'s leading records are ready to export,
        each resolved in place (its `dev` a dict), or released without device time when it
        waited past `max_wait_ns` or `held` records (the worker's count) wait behind the first
        that is not. The worker holds the rest, with every record after them."""
        now = self.now()
        for i, record in enumerate(side):
            if type(record) is tuple or self._try(record):
                continue
            if held <= self.max_parked and now - _host_end(record) <= self.max_wait_ns:
                return i
            self._give_up(record)
        return len(side)

    def release(self, side: list[Any]) -> int:
        """Shutdown, after the final wait: every record of `side` resolved or released."""
        for record in side:
            if type(record) is not tuple and not self._try(record):
                self._give_up(record)
        return len(side)

    def tidy(self) -> None:
        """Events of abandoned regions to limbo; limbo's completed events back to the pool."""
        dropped, pool = self.timing.dropped, self.timing.pool
        while dropped:
            event = dropped.popleft()
            if pool is not None:
                self.limbo.append((pool, event))
        self._drain_limbo()

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
            late = type(dev) is tuple  # (event, host time it was recorded at), recorded late
            event = dev[0] if late else dev
            if not event.query():
                return False
            seen = self.now()
            d_end = self._since_ref(event, record.t1, pool)
            # Bounds: recorded after t1 was read; complete by the time the worker saw it.
            self._bound((dev[1] if late else record.t1) - d_end, seen - d_end)
            end_host = self._ref_host + d_end
            record.dev = {semconv.DEVICE_TYPE: self.timing.device_type,
                          semconv.WIRE_DEV_END_NS: end_host - record.t1}
            if late:
                record.dev[semconv.WIRE_DEV_LATE] = True
            dev = event
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
            if type(event) is tuple:  # a step's late end event (`_hotpath_device.c`)
                event = event[0]
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
