"""delivery.Delivery: what is kept, retried, dropped and counted, with a fake transport and clock.

The delivery thread waits on real condition variables, but every decision (is a retry due, how
long the backoff is) reads the injected clock: a retry is never sent until the test moves the
clock past it, so nothing here depends on how fast the machine is.
"""

from __future__ import annotations

import logging
import threading
import uuid

import pytest

from otel_train.export.delivery import Delivery
from otel_train.export.transport import OK, Outcome

DOWN = Outcome(False, True, None, "UNAVAILABLE", "the collector is not reachable")
REFUSED = Outcome(False, False, None, "UNAUTHENTICATED", "check OTEL_EXPORTER_OTLP_HEADERS")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeTransport:
    """Answers each send with the next scripted outcome (then OK); records what it was sent."""

    def __init__(self, outcomes: list[Outcome] | None = None) -> None:
        self.outcomes = list(outcomes or [])
        self.sent: list[object] = []
        self.answers: list[Outcome] = []
        self.closed = False
        self.called = threading.Condition()

    def send(self, payload: object, timeout_s: float) -> Outcome:
        with self.called:
            outcome = self.outcomes.pop(0) if self.outcomes else OK
            self.sent.append(payload)
            self.answers.append(outcome)
            self.called.notify_all()
            return outcome

    def wait_sends(self, count: int) -> None:
        with self.called:
            assert self.called.wait_for(lambda: len(self.sent) >= count, 10.0), self.sent

    def close(self) -> None:
        self.closed = True


def _where() -> str:
    """A collector name of the test's own: each failure is said once per (collector, reason) per
    process (`delivery.first_time`), and the tests share the process."""
    return f"collector-{uuid.uuid4().hex[:6]}"


def _advance(delivery: Delivery, clock: FakeClock, seconds: float) -> None:
    clock.now += seconds
    with delivery._cond:
        delivery._cond.notify_all()


def _retry_in(delivery: Delivery, clock: FakeClock) -> float:
    with delivery._cond:
        return delivery._retry_at - clock()


def test_a_retryable_failure_keeps_the_request_until_the_collector_takes_it() -> None:
    clock = FakeClock()
    transport = FakeTransport([DOWN, DOWN, DOWN])
    delivery = Delivery(transport, capacity=1000, timeout_s=10.0, where=_where(), clock=clock)
    delivery.add("a", 5)
    delivery.add("b", 7)
    for attempt in range(1, 4):
        transport.wait_sends(attempt)
        assert not delivery.wait_idle(0.05)  # kept, not dropped: still pending
        assert delivery.pending() == 12
        _advance(delivery, clock, 10.0)  # past any backoff
    assert delivery.wait_idle(10.0)
    assert transport.sent == ["a", "a", "a", "a", "b"]  # in order, the failed one first
    assert delivery.stats() == {"exported": 12, "failed": 0, "overflow": 0, "queued": 0, "unconfirmed": 0, "duplicated": 0, "sending": 0}
    delivery.close(clock() + 1.0)


def test_the_backoff_doubles_to_its_cap_and_the_servers_delay_wins() -> None:
    clock = FakeClock()
    transport = FakeTransport([DOWN] * 6 + [Outcome(False, True, 7.5, "HTTP 503", "")])
    delivery = Delivery(transport, capacity=1000, timeout_s=10.0, where=_where(), clock=clock)
    delivery.add("a", 1)
    waits = []
    for attempt in range(1, 8):
        transport.wait_sends(attempt)
        with delivery._cond:
            assert delivery._cond.wait_for(lambda: delivery._retry_at > clock(), 10.0)
        waits.append(_retry_in(delivery, clock))
        _advance(delivery, clock, waits[-1] + 1e-6)  # past it: now + (due - now) may fall one ulp short
    for wait, nominal in zip(waits, (0.5, 1.0, 2.0, 4.0, 5.0, 5.0)):
        assert 0.8 * nominal <= wait <= 1.2 * nominal, waits  # jittered +-20 %
    assert waits[-1] == pytest.approx(7.5)  # Retry-After / RetryInfo exactly
    assert delivery.wait_idle(10.0) and delivery.stats()["exported"] == 1
    delivery.close(clock() + 1.0)


def test_a_refusal_is_dropped_counted_and_said_once(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    transport = FakeTransport([REFUSED, REFUSED, REFUSED])
    delivery = Delivery(transport, capacity=1000, timeout_s=10.0, where=_where(), clock=clock)
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        for payload in "abcd":
            delivery.add(payload, 10)
        assert delivery.wait_idle(10.0)
    assert transport.sent == ["a", "b", "c", "d"]  # never tried again
    assert delivery.stats() == {"exported": 10, "failed": 30, "overflow": 0, "queued": 0, "unconfirmed": 0, "duplicated": 0, "sending": 0}
    (message,) = [r.getMessage() for r in caplog.records]
    assert "UNAUTHENTICATED" in message and "OTEL_EXPORTER_OTLP_HEADERS" in message
    delivery.close(clock() + 1.0)


def test_past_the_capacity_the_oldest_waiting_spans_are_dropped_and_counted(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    transport = FakeTransport([DOWN])
    delivery = Delivery(transport, capacity=100, timeout_s=10.0, where=_where(), clock=clock)
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        delivery.add(0, 40)
        transport.wait_sends(1)  # request 0 failed and waits at the head
        for n in range(1, 6):
            delivery.add(n, 40)  # 240 spans waiting, capacity 100
    assert delivery.stats()["overflow"] == 160 and delivery.pending() == 80
    _advance(delivery, clock, 10.0)
    assert delivery.wait_idle(10.0)
    assert transport.sent == [0, 4, 5]  # the newest kept
    stats = delivery.stats()
    assert stats["exported"] + stats["failed"] + stats["overflow"] == 240 and stats["exported"] == 80
    assert sum("OTEL_TRAIN_BUFFER_SIZE=100" in r.getMessage() for r in caplog.records) == 2  # retry + capacity
    delivery.close(clock() + 1.0)


def test_close_tries_once_more_then_counts_what_is_left_as_failed() -> None:
    clock = FakeClock()
    transport = FakeTransport([DOWN] * 100)
    delivery = Delivery(transport, capacity=1000, timeout_s=10.0, where=_where(), clock=clock)
    delivery.add("a", 3)
    transport.wait_sends(1)
    delivery.add("b", 4)
    assert _retry_in(delivery, clock) > 0.3  # backing off
    closer = threading.Thread(target=delivery.close, args=(clock() + 0.3,))
    closer.start()
    transport.wait_sends(2)  # the backoff is cut short: tried again at once
    _advance(delivery, clock, 0.3)  # the deadline passes
    closer.join(10.0)
    assert not closer.is_alive() and transport.closed
    stats = delivery.stats()
    assert stats["exported"] == 0 and stats["failed"] == 7 and stats["queued"] == 0
    delivery.add("late", 2)  # after close: counted, never sent
    assert delivery.stats()["failed"] == 9 and "late" not in transport.sent


def _threadless(monkeypatch: pytest.MonkeyPatch, transport: FakeTransport, clock: FakeClock) -> Delivery:
    """A delivery made where no thread can start (Python 3.12+ at interpreter exit: the fallback
    a shutdown makes when the exporter process never came up)."""
    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't create new thread at interpreter shutdown")

    with monkeypatch.context() as patched:
        patched.setattr(threading.Thread, "start", refuse)
        return Delivery(transport, capacity=1000, timeout_s=10.0, where=_where(), clock=clock)


def test_close_sends_on_the_closing_thread_where_no_thread_could_start(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    transport = FakeTransport([REFUSED])
    delivery = _threadless(monkeypatch, transport, clock)
    for payload, spans in (("a", 3), ("b", 4), ("c", 5)):
        delivery.add(payload, spans)
    assert transport.sent == []  # no thread: nothing is sent before the close
    delivery.close(clock() + 1.0)
    assert transport.sent == ["a", "b", "c"] and transport.closed
    assert delivery.stats() == {"exported": 9, "failed": 3, "overflow": 0, "queued": 0, "unconfirmed": 0, "duplicated": 0, "sending": 0}


def test_a_threadless_close_past_its_deadline_sends_nothing_and_counts_it(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    transport = FakeTransport()
    delivery = _threadless(monkeypatch, transport, clock)
    delivery.add("a", 3)
    delivery.close(clock() - 0.1)
    assert transport.sent == [] and delivery.stats() == {"exported": 0, "failed": 3, "overflow": 0, "queued": 0, "unconfirmed": 0, "duplicated": 0, "sending": 0}


def test_an_outage_of_hours_keeps_backing_off_at_the_cap() -> None:
    """Regression: the backoff's exponent grew with every failure and overflowed after ~1,000
    (85 minutes at the 5 s cap), killing the delivery thread."""
    clock = FakeClock()
    transport = FakeTransport()
    delivery = Delivery(transport, capacity=1000, timeout_s=10.0, where=_where(), clock=clock)
    with delivery._cond:
        delivery._failures = 5000
    transport.outcomes = [DOWN]
    delivery.add("a", 1)
    transport.wait_sends(1)
    with delivery._cond:
        assert delivery._cond.wait_for(lambda: delivery._retry_at > clock(), 10.0)
    assert 4.0 <= _retry_in(delivery, clock) <= 6.0
    _advance(delivery, clock, 6.0)
    assert delivery.wait_idle(10.0) and delivery.stats()["exported"] == 1
    delivery.close(clock() + 1.0)


def test_partial_success_counts_the_rejected_items() -> None:
    clock = FakeClock()
    transport = FakeTransport([Outcome(True, rejected=3)])
    delivery = Delivery(transport, capacity=1000, timeout_s=10.0, where=_where(), clock=clock)
    delivery.add("a", 10)
    assert delivery.wait_idle(10.0)
    assert delivery.stats() == {"exported": 7, "failed": 3, "overflow": 0, "queued": 0, "unconfirmed": 0, "duplicated": 0, "sending": 0}
    delivery.close(clock() + 1.0)
