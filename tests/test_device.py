"""Device timing (`otel_train.record.device`) against a fake asynchronous device: scripted completion
times, a FakeClock, and a log of every event call and every synchronisation."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from support.fake_device import MS, FakeDevice
from support.harness import Harness, by_name

import otel_train
from otel_train import _runtime, semconv
from otel_train.export.worker import Worker
from otel_train.record import device as _device
from otel_train.record import direct
from otel_train.record import recorder as _recorder
from otel_train.record import span as span_mode
from otel_train.record.clock import FakeClock
from otel_train.record.recorder import Recorder
from otel_train.wire import schema

DUR, LAG, TYPE = semconv.DEVICE_DURATION_S, semconv.DEVICE_LAG_S, semconv.DEVICE_TYPE


def drain_off_thread() -> None:
    """One worker drain, on a thread of its own (as the worker does), never the training thread."""
    worker = _runtime.state().worker
    thread = threading.Thread(target=worker.drain, name="otel_train-worker-test")
    thread.start()
    thread.join()


@pytest.fixture
def fake(harness: Harness) -> FakeDevice:
    device = FakeDevice(harness.clock)
    _device.active().use(device.event, "cuda")
    return device


def test_span_is_emitted_only_after_its_events_complete(harness: Harness, fake: FakeDevice) -> None:
    clock = harness.clock
    with otel_train.step():
        with otel_train.span(semconv.SPAN_FORWARD):
            fake.launch(100 * MS)
            clock.advance(2 * MS)  # host dispatch cost
    drain_off_thread()
    assert by_name(harness.exporter.get_finished_spans(), semconv.SPAN_FORWARD) == []  # device still busy
    clock.advance(50 * MS)
    drain_off_thread()
    assert by_name(harness.exporter.get_finished_spans(), semconv.SPAN_FORWARD) == []  # still busy
    clock.advance(50 * MS)  # now the forward's end event has completed
    drain_off_thread()
    (forward,) = by_name(harness.exporter.get_finished_spans(), semconv.SPAN_FORWARD)
    assert forward.attributes[DUR] == pytest.approx(0.100, rel=1e-6)
    assert forward.attributes[LAG] == 0.0  # the device was idle: it started at once
    assert forward.attributes[TYPE] == "cuda"
    # Drawn where the device worked (OTEL_TRAIN_SPAN_TIME=device, the default); the host's
    # dispatch is in attributes.
    assert forward.end_time - forward.start_time == 100 * MS
    assert forward.attributes[semconv.HOST_DURATION_S] == pytest.approx(0.002)
    assert forward.attributes[semconv.HOST_OFFSET_S] == 0.0
    assert not any(key.startswith("_") for key in forward.attributes)  # private wire keys stripped
    harness.finish()


def test_exact_durations_and_lag_with_a_deep_queue(harness: Harness, fake: FakeDevice) -> None:
    clock = harness.clock
    fake.launch(1)  # the first event (the anchor) lands on an idle device
    with otel_train.step():
        with otel_train.span(semconv.SPAN_FORWARD):
            fake.launch(300 * MS)  # the device is busy 300 ms from here
            clock.advance(1 * MS)
        with otel_train.span(semconv.SPAN_BACKWARD):
            fake.launch(40 * MS)
            clock.advance(3 * MS)
        with otel_train.span(semconv.SPAN_OPTIMIZER):
            fake.launch(7 * MS)
            fake.launch(5 * MS)
            clock.advance(1 * MS)
    fake.drain()
    spans = harness.finish()
    (fwd,), (bwd,), (opt,) = (by_name(spans, n) for n in (semconv.SPAN_FORWARD, semconv.SPAN_BACKWARD,
                                                            semconv.SPAN_OPTIMIZER))
    assert fwd.attributes[DUR] == pytest.approx(0.300, rel=1e-6)
    assert bwd.attributes[DUR] == pytest.approx(0.040, rel=1e-6)
    assert opt.attributes[DUR] == pytest.approx(0.012, rel=1e-6)
    # Backward was dispatched 1 ms after the forward began; the device reached it 300 ms after that.
    assert fwd.attributes[LAG] == pytest.approx(0.0, abs=1e-6)
    assert bwd.attributes[LAG] == pytest.approx(0.299, rel=1e-5)
    assert opt.attributes[LAG] == pytest.approx(0.336, rel=1e-5)
    # Each phase drawn where the device worked on it: one after the other, the host's dispatch
    # (3 ms for the backward, 299 ms before the device reached it) in attributes.
    assert (bwd.end_time - bwd.start_time) == 40 * MS and bwd.start_time == fwd.end_time
    assert opt.start_time == bwd.end_time and opt.end_time - opt.start_time == 12 * MS
    assert bwd.attributes[semconv.HOST_DURATION_S] == pytest.approx(0.003)
    assert bwd.attributes[semconv.HOST_OFFSET_S] == pytest.approx(-0.299, rel=1e-5)
    (step,) = by_name(spans, semconv.SPAN_STEP)
    assert (step.start_time, step.end_time) == (fwd.start_time, opt.end_time)  # its device boundaries
    assert step.end_time - step.start_time == round(step.attributes[semconv.TRAIN_STEP_TIME_S] * 1e9)


def test_span_time_host_keeps_the_hosts_intervals(harness: Harness, fake: FakeDevice) -> None:
    from otel_train import _runtime

    _runtime.state().worker.sink.pipeline.assembler.device_view = False  # OTEL_TRAIN_SPAN_TIME=host
    clock = harness.clock
    with otel_train.step():
        with otel_train.span(semconv.SPAN_FORWARD):
            fake.launch(100 * MS)
            clock.advance(2 * MS)
    fake.drain()
    spans = harness.finish()
    (forward,), (step,) = by_name(spans, semconv.SPAN_FORWARD), by_name(spans, semconv.SPAN_STEP)
    assert forward.end_time - forward.start_time == 2 * MS and forward.attributes[DUR] == pytest.approx(0.1)
    assert step.end_time - step.start_time == 2 * MS
    assert semconv.HOST_DURATION_S not in forward.attributes


def test_training_thread_only_records_and_nothing_synchronises(harness: Harness, fake: FakeDevice) -> None:
    clock = harness.clock
    training = threading.get_ident()
    for n in range(40):
        with otel_train.step():
            for name, work in ((semconv.SPAN_FORWARD, 30), (semconv.SPAN_BACKWARD, 60), (semconv.SPAN_OPTIMIZER, 10)):
                with otel_train.span(name):
                    fake.launch(work * MS)
                    clock.advance(1 * MS)
        if n >= 2:
            clock.advance(20 * MS)
        if n % 3 == 0:
            drain_off_thread()  # polls while events are pending, completed, or half of each
    fake.drain()
    drain_off_thread()
    spans = harness.finish()
    assert fake.calls_on(training) == {"record": 40 * 7}  # 2 per phase, 1 per step end; nothing else
    assert fake.syncs == []  # no synchronize(), no elapsed_time before completion, on any thread
    forwards = by_name(spans, semconv.SPAN_FORWARD)
    assert len(forwards) == 40
    assert all(s.attributes[DUR] == pytest.approx(0.030, rel=1e-6) for s in forwards)


def test_events_are_pooled_and_reused(harness: Harness, fake: FakeDevice) -> None:
    clock = harness.clock

    def one_step() -> None:
        with otel_train.step():
            with otel_train.span(semconv.SPAN_FORWARD):
                fake.launch(5 * MS)
                clock.advance(1 * MS)
        fake.drain()
        drain_off_thread()

    for _ in range(5):
        one_step()
    created = fake.created
    for _ in range(200):
        one_step()
    assert fake.created == created  # steady state: no event is allocated per step
    assert created <= 4  # forward start + end, step end, and the anchor's reference
    harness.finish()


def test_user_spans_choose_device_time(harness: Harness, fake: FakeDevice) -> None:
    clock = harness.clock

    @otel_train.span("decorated.region", device_time=True)
    def decorated() -> None:
        fake.launch(4 * MS)
        clock.advance(1 * MS)

    with otel_train.step():
        with otel_train.span("my.region", device_time=True):
            fake.launch(9 * MS)
            clock.advance(1 * MS)
        with otel_train.span("plain.region"):
            clock.advance(1 * MS)
        with otel_train.span(semconv.SPAN_FORWARD, device_time=False):
            clock.advance(1 * MS)
        with otel_train.span(semconv.SPAN_DATA):
            clock.advance(1 * MS)
        decorated()
    fake.drain()
    spans = harness.finish()
    (mine,), (plain,), (fwd,), (data,), (dec,) = (by_name(spans, n) for n in (
        "my.region", "plain.region", semconv.SPAN_FORWARD, semconv.SPAN_DATA, "decorated.region"))
    assert mine.attributes[DUR] == pytest.approx(0.009, rel=1e-6)
    assert dec.attributes[DUR] == pytest.approx(0.004, rel=1e-6)
    for span in (plain, fwd, data):
        assert DUR not in span.attributes and LAG not in span.attributes
    assert "device_time" not in mine.attributes and "device_time" not in fwd.attributes


def test_function_decorated_before_init_gets_device_time() -> None:
    calls: list[int] = []

    @otel_train.span(semconv.SPAN_FORWARD)
    def forward() -> None:
        calls.append(1)

    harness = Harness()
    fake = FakeDevice(harness.clock)
    _device.active().use(fake.event, "cuda")
    with otel_train.step():
        fake.launch(3 * MS)
        forward()
    fake.drain()
    (span,) = by_name(harness.finish(), semconv.SPAN_FORWARD)
    assert semconv.DEVICE_DURATION_S in span.attributes


def test_cpu_run_has_no_device_attributes_and_host_step_time(harness: Harness) -> None:
    clock = harness.clock
    for n in range(70):  # more than the regions that look for an accelerator
        with otel_train.step():
            with otel_train.span(semconv.SPAN_FORWARD):
                clock.advance(10 * MS)
        clock.advance(5 * MS)
    assert _device.active().pool is None
    assert span_mode.device_region() is None  # no accelerator: nothing left to pay for
    assert type(otel_train.span(semconv.SPAN_FORWARD)) is _recorder.Region
    resolver = _runtime.state().worker.resolve
    batch = _recorder.active().drain(1 << 20)
    assert len(batch) >= 2 and resolver(batch) is batch  # handed on as drained: no per-record look
    _recorder.active().buf.extend(batch)
    spans = harness.finish()
    for span in spans:
        assert not any(key.startswith("device.") for key in span.attributes)
    steps = by_name(spans, semconv.SPAN_STEP)
    assert steps[0].attributes[semconv.TRAIN_STEP_TIME_S] == pytest.approx(0.010)
    assert {round(s.attributes[semconv.TRAIN_STEP_TIME_S], 9) for s in steps[1:]} == {0.015}


def test_device_timing_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(semconv.ENV_DEVICE_TIMING, "off")
    harness = Harness()
    assert _device.active() is None
    assert _runtime.state().worker.resolve is None
    assert _runtime.state().worker.recorder.step_end is None
    assert span_mode.device_region() is None
    with otel_train.step():
        with otel_train.span(semconv.SPAN_FORWARD, device_time=True):
            harness.clock.advance(MS)
    spans = harness.finish()
    assert all(not any(k.startswith("device.") or k == "device_time" for k in s.attributes) for s in spans)


def test_use_device_picks_the_model_device(harness: Harness) -> None:
    class Param:
        class device:  # noqa: N801 - shaped like torch.device
            type = "cpu"
            index = None

    class Module:
        def parameters(self) -> Any:
            return iter([Param()])

    _device.use_device(Module())
    timing = _device.active()
    assert timing.settled and timing.pool is None  # CPU: host time is the truth
    assert span_mode.device_region() is None
    harness.finish()


def _builds(monkeypatch: pytest.MonkeyPatch, cuda: bool) -> tuple[Any, list[int]]:
    """torch, made to say whether it was built with CUDA; the list counts how often it was asked."""
    torch = pytest.importorskip("torch")
    asked: list[int] = []
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: asked.append(1) or cuda)
    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: False)
    if hasattr(torch, "xpu"):
        monkeypatch.setattr(torch.xpu, "_is_compiled", lambda: False, raising=False)
    return torch, asked


def test_probe_stops_looking_on_a_build_without_accelerators(monkeypatch: pytest.MonkeyPatch) -> None:
    torch, _ = _builds(monkeypatch, cuda=False)
    looked: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: looked.append(1) or False)
    timing = _device.DeviceTiming()
    assert timing.probe() is False and timing.settled and timing.pool is None
    assert timing.probe() is False and looked == []  # settled: later steps do not look again


def test_probe_keeps_looking_on_a_cuda_build_until_cuda_is_initialised(monkeypatch: pytest.MonkeyPatch) -> None:
    torch, asked = _builds(monkeypatch, cuda=True)
    initialised = [False]
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: initialised[0])
    timing = _device.DeviceTiming()
    chosen: list[Any] = []
    monkeypatch.setattr(timing, "use_device", lambda where: chosen.append(where) or True)
    assert timing.probe() is False and not timing.settled
    initialised[0] = True  # the loop moved its model to the GPU
    assert timing.probe() is True and chosen == ["cuda"]
    assert asked == [1]  # what the build has is asked once, not at every step's probe


# --- the anchor: device times on the host clock -------------------------------------------
def test_anchor_is_exact_from_an_idle_device_and_tightens_at_a_natural_sync(harness: Harness,
                                                                              fake: FakeDevice) -> None:
    clock = harness.clock
    fake.launch(500 * MS)  # work queued before the first timed region: the first anchor is loose
    for n in range(6):
        with otel_train.step():
            with otel_train.span(semconv.SPAN_FORWARD):
                fake.launch(20 * MS)
                clock.advance(1 * MS)
        if n == 2:
            fake.drain()  # the loop's own sync (a logged loss.item()): the device goes idle
        drain_off_thread()
    fake.drain()
    spans = by_name(harness.finish(), semconv.SPAN_FORWARD)
    true_lag = [0.500, 0.519, 0.538, 0.0, 0.019, 0.038]
    got = [s.attributes[LAG] for s in spans]
    # Before the device was ever seen idle the lag is a lower bound (never negative, never more
    # than the truth); from the first idle moment on it is exact.
    for g, t in zip(got[:3], true_lag[:3]):
        assert 0.0 <= g <= t + 1e-9
    assert got[3:] == pytest.approx(true_lag[3:], abs=1e-6)


def test_anchor_error_is_bounded_by_launch_latency() -> None:
    harness = Harness()
    fake = FakeDevice(harness.clock, launch_latency_ns=7_000)
    _device.active().use(fake.event, "cuda")
    clock = harness.clock
    with otel_train.step():
        with otel_train.span(semconv.SPAN_FORWARD):
            fake.launch(100 * MS)
            clock.advance(1 * MS)
        with otel_train.span(semconv.SPAN_BACKWARD):
            fake.launch(10 * MS)
            clock.advance(1 * MS)
    fake.drain()
    spans = harness.finish()
    (bwd,) = by_name(spans, semconv.SPAN_BACKWARD)
    true_lag = (100 * MS + 7_000 - 1 * MS) / 1e9
    assert abs(bwd.attributes[LAG] - true_lag) <= 7_000 / 1e9 + 1e-12


def test_reference_event_is_rebased_and_durations_stay_exact(harness: Harness, fake: FakeDevice) -> None:
    clock = harness.clock
    resolver = _runtime.state().device
    start = clock.now_ns
    for _ in range(30):  # 30 steps of 1 s of host time each: past the 10 s rebase period twice
        with otel_train.step():
            with otel_train.span(semconv.SPAN_FORWARD):
                fake.launch(250 * MS)
                clock.advance(1 * MS)
        clock.advance(999 * MS)
        drain_off_thread()
    # The reference moved to a recent event (each move is >= 10 s later than the one before).
    assert resolver._ref_host >= start + 20 * 1_000_000_000
    spans = by_name(harness.finish(), semconv.SPAN_FORWARD)
    assert all(s.attributes[DUR] == pytest.approx(0.250, rel=1e-6) for s in spans)
    assert all(s.attributes[LAG] == pytest.approx(0.0, abs=1e-6) for s in spans)


# --- bounded: a device that never completes ------------------------------------------------
class ListSink:
    def __init__(self) -> None:
        self.records: list[tuple[Any, ...]] = []

    def send(self, segments: Any, offset: int, dropped: Any) -> None:
        for is_wire, records in segments:
            self.records.extend(records if is_wire else [_recorder.to_wire(r, offset) for r in records])

    def close(self, deadline: float) -> dict[str, int]:
        return {}


@pytest.fixture
def bare() -> Any:
    """A recorder, a worker (driven by hand) and device timing with small bounds."""
    clock = FakeClock()
    recorder = Recorder(1 << 16, clock)
    resolver = _device.install(recorder, pool_size=32, max_parked=100, max_wait_s=60.0)
    sink = ListSink()
    worker = Worker(recorder, sink, 1e9, resolve=resolver)
    fake = FakeDevice(clock)
    resolver.timing.use(fake.event, "cuda")
    _recorder.install(recorder)
    yield clock, recorder, resolver, worker, sink, fake
    _recorder.install(None)
    _device.uninstall()


def _step(clock: FakeClock, fake: FakeDevice) -> None:
    with _recorder.Step(None, None):
        with _device._DeviceRegion(semconv.SPAN_FORWARD):
            fake.launch(10 * MS)
            clock.advance(1 * MS)


def test_hung_device_keeps_memory_bounded_and_never_blocks(bare: Any) -> None:
    clock, recorder, resolver, worker, sink, fake = bare
    for _ in range(5):
        _step(clock, fake)
    fake.drain()
    worker.drain()
    fake.hang()
    for n in range(5000):
        _step(clock, fake)
        if n % 50 == 0:
            worker.drain()
            assert len(resolver.parked) <= resolver.max_parked
    worker.drain()
    timing = resolver.timing
    assert fake.created <= timing.pool_size  # events: bounded by the pool
    assert len(resolver.limbo) <= timing.pool_size
    assert len(resolver.parked) <= resolver.max_parked
    assert timing.skipped > 0 and resolver.unresolved > 0
    assert fake.syncs == []
    # Everything still reaches the sink, in order, without device time once the device hung.
    sent = len(sink.records) + len(resolver.parked)
    assert sent == 2 * 5005
    steps = [r[schema.W_STEP] for r in sink.records if r[schema.W_KIND] == schema.KIND_STEP]
    assert steps == sorted(steps)
    late = [r for r in sink.records[-50:] if r[schema.W_KIND] == schema.KIND_SPAN]
    assert late and all(not r[schema.W_DEV] for r in late)


def test_a_record_waits_at_most_max_wait(bare: Any) -> None:
    clock, recorder, resolver, worker, sink, fake = bare
    _step(clock, fake)
    fake.hang()
    _step(clock, fake)
    worker.drain()
    assert sink.records == [] and len(resolver.parked) == 4  # step 0's forward is still running
    clock.advance(61 * 1_000_000_000)
    worker.drain()
    assert not resolver.parked and len(sink.records) == 4
    assert resolver.unresolved >= 2


def test_limbo_events_return_to_the_pool_when_they_complete(bare: Any) -> None:
    clock, recorder, resolver, worker, sink, fake = bare
    fake.launch(10_000 * MS)  # a long stall, not a hang
    for _ in range(300):
        _step(clock, fake)
        worker.drain()
    assert resolver.limbo  # given up on (parked beyond the bound); events held in limbo
    fake.drain()
    worker.drain()
    assert not resolver.limbo
    held = 1 if resolver._ref is not None else 0  # the anchor's reference event
    assert len(resolver.timing.pool.free) + held == fake.created  # every event is back


def test_device_errors_release_records_without_device_time(bare: Any, caplog: pytest.LogCaptureFixture) -> None:
    clock, recorder, resolver, worker, sink, fake = bare
    _step(clock, fake)
    fake.errors = True
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        worker.drain()
    assert len(sink.records) == 2 and all(not r[schema.W_DEV] for r in sink.records)
    assert "reading device events failed" in caplog.text


def test_truncated_region_at_shutdown_is_released(harness: Harness, fake: FakeDevice) -> None:
    with otel_train.step():
        region = otel_train.span(semconv.SPAN_FORWARD)
        region.__enter__()
        fake.launch(MS)
    fake.drain()
    spans = harness.finish()
    region.__exit__(None, None, None)  # restore the context variable for the tests after this one
    (fwd,) = by_name(spans, semconv.SPAN_FORWARD)
    assert fwd.attributes.get(semconv.TRUNCATED) is True
    assert DUR not in fwd.attributes


def test_abandoned_region_gives_its_event_back(bare: Any) -> None:
    clock, recorder, resolver, worker, sink, fake = bare
    _step(clock, fake)
    region = _device._DeviceRegion(semconv.SPAN_OPTIMIZER)
    region.__enter__()
    fake.launch(5 * MS)
    direct.abandon(region)  # detection found it was not an optimizer update after all
    fake.drain()
    worker.drain()
    worker.drain()
    held = 1 if resolver._ref is not None else 0
    assert len(resolver.timing.pool.free) + held == fake.created
    assert not resolver.limbo and len(sink.records) == 2


def test_a_reentered_region_takes_no_extra_event(bare: Any) -> None:
    """`with sp: with sp:` on a device-timed region (issue 53, row 1): the re-entry and its exit
    are ignored, and so is a second exit; every event taken goes back to the pool."""
    clock, recorder, resolver, worker, sink, fake = bare
    with _recorder.Step(None, None):
        region = _device._DeviceRegion(semconv.SPAN_FORWARD)
        with region:
            with region:
                fake.launch(MS)
                clock.advance(MS)
        region.__exit__(None, None, None)  # a second exit: ignored, said once
    fake.drain()
    worker.drain()
    worker.drain()
    held = 1 if resolver._ref is not None else 0
    assert fake.created == 3  # the forward's two events and the step's end
    assert len(resolver.timing.pool.free) + held == fake.created
    assert len(sink.records) == 2  # the step and its forward, once each


def test_naming_an_unavailable_accelerator_keeps_host_time(harness: Harness) -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this checks a machine without CUDA")
    _device.use_device("cuda:0")
    assert _device.active().pool is None and _device.active().settled
    with otel_train.step():
        with otel_train.span(semconv.SPAN_FORWARD):
            harness.clock.advance(MS)
    assert all(DUR not in s.attributes for s in harness.finish())


def test_the_report_draws_host_and_device_lanes_from_device_drawn_spans(harness: Harness, fake: FakeDevice) -> None:
    """`otel-train report` and the Perfetto export (`analyze.model`) read a span drawn on the
    device's timeline back into the host's interval (`host.offset_s`, `host.duration_s`) and the
    device's: the same lanes as with `OTEL_TRAIN_SPAN_TIME=host`."""
    from otel_train.analyze import model
    from otel_train.analyze.reader import Process

    clock = harness.clock
    fake.launch(1)
    host = {}
    with otel_train.step():
        for name, work in ((semconv.SPAN_FORWARD, 300), (semconv.SPAN_BACKWARD, 40)):
            t0 = clock.now_ns
            with otel_train.span(name):
                fake.launch(work * MS)
                clock.advance(2 * MS)
            host[name] = (t0, clock.now_ns)
    fake.drain()
    spans = harness.finish()

    def otlp(span: Any) -> dict[str, Any]:
        def value(v: Any) -> dict[str, Any]:
            return {"intValue": str(v)} if isinstance(v, int) else {"doubleValue": v} if isinstance(v, float) \
                else {"stringValue": str(v)}
        return {"name": span.name, "startTimeUnixNano": str(span.start_time), "endTimeUnixNano": str(span.end_time),
                "spanId": f"{span.context.span_id:016x}",
                "attributes": [{"key": k, "value": value(v)} for k, v in span.attributes.items()]}

    proc = Process(0, 0, semconv.ROLE_TRAINER, 1, "svc", "i", "h", "test-run")
    data = model.build([(proc, [otlp(s) for s in spans])])
    (rs,) = data.steps[(0, 0)].values()
    offset = harness.clock.wall_offset_ns
    drawn = {name: (a - offset, b - offset) for name, a, b in rs.phases()}
    assert drawn[semconv.SPAN_FORWARD] == host[semconv.SPAN_FORWARD]  # the host lane: dispatch
    assert drawn[semconv.SPAN_BACKWARD] == host[semconv.SPAN_BACKWARD]
    device_lane = {name: (a, b) for name, a, b in rs.device_phases()}
    (bwd,) = by_name(spans, semconv.SPAN_BACKWARD)
    assert device_lane[semconv.SPAN_BACKWARD] == (bwd.start_time, bwd.end_time)  # the device lane: the span
