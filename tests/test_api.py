"""The public API is fixed at import: each name imported before `init()` is the object the package
uses after it, and records what `otel_train.<name>` records, device time included.

The names are imported here at module level, so before any test of the session has initialised
anything (`_STATE_AT_IMPORT` says so).
"""

from __future__ import annotations

import pytest
from support.fake_device import MS, FakeDevice
from support.harness import Harness, by_name

import otel_train
from otel_train import RunInfo, _runtime, event, init, inject, link, semconv, shutdown, span, step, tag
from otel_train.record import device

_STATE_AT_IMPORT = _runtime.state()
_AT_IMPORT = {name: getattr(otel_train, name) for name in otel_train.__all__}
_IMPORTED = {"init": init, "span": span, "step": step, "tag": tag, "event": event, "inject": inject,
             "link": link, "shutdown": shutdown, "RunInfo": RunInfo}


def _unchanged() -> None:
    assert set(_IMPORTED) == set(otel_train.__all__)
    for name in otel_train.__all__:
        assert getattr(otel_train, name) is _AT_IMPORT[name] is _IMPORTED[name], name


def test_names_imported_before_init_record_device_time_after_it() -> None:
    assert _STATE_AT_IMPORT is None  # imported before anything was initialised
    harness = Harness()
    fake = FakeDevice(harness.clock)
    device.active().use(fake.event, "cuda")  # an accelerator is in use from here
    _unchanged()
    with step():
        with span(semconv.SPAN_FORWARD):
            fake.launch(5 * MS)
            harness.clock.advance(MS)
            event("loss.spike", value=3.0)
        assert inject()["traceparent"]
        link(None)
        tag("checked")
    fake.drain()
    spans = harness.finish()
    (forward,) = by_name(spans, semconv.SPAN_FORWARD)
    assert forward.attributes[semconv.DEVICE_DURATION_S] == pytest.approx(0.005, rel=1e-6)
    assert [e.name for e in forward.events] == ["loss.spike"]
    (train_step,) = by_name(spans, semconv.SPAN_STEP)
    assert train_step.attributes[semconv.DEVICE_TYPE] == "cuda"  # its end event: the device boundary
    assert "checked" in train_step.attributes[semconv.TRAIN_STEP_TAGS]
    _unchanged()


def test_one_span_factory_in_every_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """Disabled, plain and device-timed: `otel_train.span` is the one object, and what it makes
    follows the mode."""
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert Harness().run is None
    from otel_train.record.span import NOOP

    for made in (span("x"), span("x", device_time=True, k=1)):
        with made as region:
            pass
        assert region is NOOP
    otel_train.shutdown()
    monkeypatch.delenv("OTEL_SDK_DISABLED")
    harness = Harness()
    assert type(span("x")).__name__ != "_NoopRegion"
    fake = FakeDevice(harness.clock)
    device.active().use(fake.event, "cuda")
    with span("x", device_time=True) as timed:  # the C region records its events itself
        pass
    assert timed.dev is not None and fake.created == 2
    harness.finish()
    _unchanged()
