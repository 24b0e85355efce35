"""Delivery: encoded requests on their way to the collector, kept until it takes them.

The pipeline hands each encoded request to `Delivery.add`; a thread of its own sends them in
order through a transport (`transport`) or the file writer (`otlp_json`), so a slow or dead
collector never holds up the pipeline (nor, through it, the training process's worker).

- A request that fails in a way the OTLP specification calls retryable stays at the head of
  the queue and is tried again after a backoff (the server's delay if it gave one, else
  exponential with jitter: `_BACKOFF_S` doubling up to `_BACKOFF_MAX_S`). What waits is
  bounded by `capacity` spans (OTEL_TRAIN_BUFFER_SIZE): past it the oldest waiting requests
  are dropped, counted and said once. So a collector restart loses nothing up to that bound.
- A request that fails in a way that will not get better (UNAUTHENTICATED, HTTP 400, a
  read-only directory) is dropped and counted; each kind of failure is said once, with what to
  check.
- `close(deadline)` keeps trying until `deadline` and counts what is left as failed: shutdown
  is bounded, and every span is either exported or counted. From then on the backoff is
  `_SHUTDOWN_RETRY_S` (a server's delay is honoured while it ends before `_LAST_TRY_S` before the
  deadline), so a collector that comes back inside the bound gets everything: the exponential
  backoff of the run (up to 5 s) once left no time for a last try.
- A request sent and not answered in time (a timeout after it went out) may have reached the
  collector: it is retried with twice the timeout (the same collector answering in 1.5 s to a
  1 s timeout once received every span three times), and counted apart: `duplicated` when a
  retry succeeds (the collector may hold it twice), `unconfirmed` when none does (it may hold
  it once: counted as failed, said as unconfirmed). Whether it did is unknowable from here.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from otel_train.export.transport import Outcome, Transport

_log = logging.getLogger("otel_train")
_BACKOFF_S = 0.5
_BACKOFF_MAX_S = 5.0
_BACKOFF_DOUBLINGS = 16  # far past the cap
_SHUTDOWN_RETRY_S = 0.2  # the backoff once shutting down: a refused connect costs a millisecond
_LAST_TRY_S = 0.5  # no retry is put off past this long before the deadline
_MIN_RETRY_S = 0.05  # between two tries, at least: a collector that refuses at once is not spun on
_TIMEOUT_DOUBLINGS = 3  # an unanswered request's timeout grows to 8x at most


_said_lock = threading.Lock()
_said_anywhere: set[tuple[str, str]] = set()


def first_time(where: str, reason: str) -> bool:
    """True the first time this process meets `reason` at `where`: traces and metrics going to
    one collector that refuses them both make one message, not one per signal."""
    with _said_lock:
        if (where, reason) in _said_anywhere:
            return False
        _said_anywhere.add((where, reason))
        return True


class Delivery:
    """Sends encoded requests in order on its own thread; keeps what may yet succeed."""

    def __init__(self, transport: Transport, capacity: int, timeout_s: float, where: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.transport = transport
        self.capacity = capacity
        self.timeout_s = timeout_s
        self.where = where
        self.clock = clock
        self.exported = 0
        self.failed = 0  # refused, or still waiting at the shutdown deadline
        self.dropped = 0  # waited past the capacity
        self.rejected = 0  # accepted requests' partial-success rejections
        self.unconfirmed = 0  # in `failed`: sent, never answered (the collector may have them)
        self.duplicated = 0  # in `exported`: a retry succeeded after a try that was not answered
        # (payload, spans, tries that went out and were not answered)
        self._queue: deque[tuple[Any, int, int]] = deque()
        self._flight_unanswered = 0  # of the request in flight
        self._queued = 0
        self._in_flight = 0
        self._cond = threading.Condition()
        self._retry_at = 0.0
        self._failures = 0  # retryable failures in a row
        self._said: set[str] = set()
        self._outage_since: float | None = None
        self._deadline: float | None = None
        self._stopped = False
        self._abandoned = False  # the request in flight at the deadline was counted as failed
        self._thread: threading.Thread | None = threading.Thread(target=self._run, name="otel_train-delivery",
                                                                  daemon=True)
        try:
            self._thread.start()
        except RuntimeError:  # Python 3.12+ starts no thread at interpreter exit: `close` sends
            self._thread = None

    # -- the pipeline's side --------------------------------------------------------------
    def add(self, payload: Any, spans: int) -> None:
        """Queue one encoded request of `spans` spans."""
        with self._cond:
            if self._stopped:
                self.failed += spans
                return
            self._queue.append((payload, spans, 0))
            self._queued += spans
            self._trim()
            self._cond.notify_all()

    def pending(self) -> int:
        """Spans queued or being sent."""
        with self._cond:
            return self._queued + self._in_flight

    def wait_idle(self, timeout_s: float) -> bool:
        """True once nothing is queued or in flight (a failing collector: False at the timeout)."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._in_flight, timeout_s)

    def close(self, deadline: float) -> None:
        """Send what is queued until `deadline` (monotonic), then stop; the rest is counted as failed."""
        with self._cond:
            self._deadline = deadline
            self._retry_at = min(self._retry_at, self.clock())  # no backoff wait past the end: try now
            self._cond.notify_all()
        if self._thread is None:
            self._run(until_idle=True)
        with self._cond:
            self._cond.wait_for(lambda: not self._queue and not self._in_flight,
                                max(0.0, deadline - self.clock()))
            self._stopped = True
            self.failed += self._queued
            self.unconfirmed += sum(spans for _, spans, unanswered in self._queue if unanswered)
            self._queue.clear()
            self._queued = 0
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=max(0.0, deadline - self.clock()) + 0.1)
        with self._cond:
            if self._in_flight:  # still blocked in a send past the deadline: counted now, not later
                self.failed += self._in_flight
                self.unconfirmed += self._in_flight  # it went out: the collector may take it yet
                self._in_flight = 0
                self._abandoned = True
        try:
            self.transport.close()
        except Exception:  # noqa: BLE001 - closing a broken channel must not fail shutdown
            pass

    def stats(self) -> dict[str, int]:
        with self._cond:
            return {"exported": self.exported, "failed": self.failed + self.rejected, "overflow": self.dropped,
                    "queued": self._queued + self._in_flight, "unconfirmed": self.unconfirmed,
                    "duplicated": self.duplicated, "sending": self._in_flight}

    # -- the thread -----------------------------------------------------------------------
    def _trim(self) -> None:
        """Past the capacity, drop the oldest waiting requests (never the one being sent)."""
        dropped = 0
        while self._queued > self.capacity and len(self._queue) > 1:
            _, spans, _ = self._queue.popleft()
            self._queued -= spans
            dropped += spans
        if dropped:
            self.dropped += dropped
            self._say("capacity", "otel_train: %s has not taken exports for a while; the oldest waiting spans are "
                                  "being dropped past OTEL_TRAIN_BUFFER_SIZE=%d (counted, and reported at shutdown).",
                      self.where, self.capacity)

    def _run(self, until_idle: bool = False) -> None:
        """The thread's loop; `until_idle` (`close` without the thread): returns once nothing is
        queued or the deadline has passed, instead of waiting for more."""
        while True:
            with self._cond:
                while not self._stopped:
                    now = self.clock()
                    ended = self._deadline is not None and now >= self._deadline
                    if self._queue and now >= self._retry_at and not ended:
                        break
                    if until_idle and (not self._queue or ended):
                        return
                    # Past the deadline nothing more is tried: `close` counts what is left.
                    self._cond.wait(None if not self._queue or ended else self._retry_at - now)
                if self._stopped:
                    return
                payload, spans, unanswered = self._queue.popleft()
                self._queued -= spans
                self._in_flight = spans
                timeout = self.timeout_s * 2 ** min(unanswered, _TIMEOUT_DOUBLINGS)
                if self._deadline is not None:
                    timeout = min(timeout, self._deadline - self.clock())
            outcome = self._send(payload, timeout) if timeout > 0 else Outcome(False, True, None, "shutdown bound")
            with self._cond:
                self._in_flight = 0
                self._settle(payload, spans, unanswered + outcome.unanswered, outcome)
                self._cond.notify_all()

    def _send(self, payload: Any, timeout_s: float) -> Outcome:
        try:
            return self.transport.send(payload, timeout_s)
        except Exception as err:  # noqa: BLE001 - a transport bug must not kill delivery
            # Its type only: an error's text may quote what was being sent (a header's value).
            return Outcome(False, False, None, type(err).__name__, "an unexpected error in otel_train (a bug: please "
                           "report it)")

    def _settle(self, payload: Any, spans: int, unanswered: int, outcome: Outcome) -> None:
        """What became of one try; `unanswered`: its request's tries that went out and got no
        answer, this one included."""
        if self._abandoned:
            return  # counted as failed by `close`
        now = self.clock()
        if outcome.ok:
            self.exported += spans - min(spans, outcome.rejected)
            if unanswered:
                self.duplicated += spans - min(spans, outcome.rejected)
            if outcome.rejected:
                self.rejected += min(spans, outcome.rejected)
                self._say("rejected", "otel_train: %s accepted a request but rejected %d of its items (partial "
                                      "success); they are counted as dropped.", self.where, outcome.rejected)
            if self._outage_since is not None:
                _log.info("otel_train: %s takes exports again after %.1f s; what waited is being sent.",
                          self.where, now - self._outage_since)
                self._outage_since = None
            self._failures = 0
            self._retry_at = 0.0
            return
        if not outcome.retry or self._stopped:
            self.failed += spans
            if unanswered:
                self.unconfirmed += spans
            if first_time(self.where, outcome.reason):
                self._say(f"refused:{outcome.reason}", "otel_train: %s did not take an export (%s): %s; its spans are "
                                                       "dropped and counted (later exports are tried as usual).",
                          self.where, outcome.reason, outcome.hint)
            return
        # Retryable: back to the head of the queue, tried again after a backoff.
        self._queue.appendleft((payload, spans, unanswered))
        self._queued += spans
        self._trim()
        if self._outage_since is None:
            self._outage_since = now
        if first_time(self.where, outcome.reason):
            self._say(f"retry:{outcome.reason}", "otel_train: exporting to %s failed (%s: %s); what failed is kept "
                                                 "and sent when it answers (up to OTEL_TRAIN_BUFFER_SIZE=%d spans).",
                      self.where, outcome.reason, outcome.hint, self.capacity)
        # The exponent stops growing at the cap: an outage of hours must not overflow it.
        backoff = min(_BACKOFF_MAX_S, _BACKOFF_S * (2 ** min(self._failures, _BACKOFF_DOUBLINGS))) * \
            random.uniform(0.8, 1.2)
        self._failures += 1
        if self._deadline is None:
            self._retry_at = now + (outcome.delay_s if outcome.delay_s is not None else backoff)
            return
        # Shutting down: retried soon, and never put off past the last try's start, so that a
        # collector back inside the bound gets everything.
        delay = outcome.delay_s if outcome.delay_s is not None else _SHUTDOWN_RETRY_S
        self._retry_at = min(now + delay, max(now + _MIN_RETRY_S, self._deadline - _LAST_TRY_S))

    def _say(self, key: str, message: str, *args: Any) -> None:
        """Each kind of failure once per process: a dead collector is one line, not thousands."""
        if key in self._said:
            return
        self._said.add(key)
        _log.warning(message, *args)
