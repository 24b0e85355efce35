"""Device timing on a real CUDA device: the properties test_device.py checks on a fake one.

Skipped as a whole without a GPU. Synchronising calls are counted by wrapping
`torch.cuda.synchronize`, `torch.cuda.Event.synchronize`, `torch.cuda.Stream.synchronize` and
`torch.Tensor.item` (`otel_train.bench.switches.SyncCounter`); event calls are logged per thread by wrapping
`torch.cuda.Event.query` / `elapsed_time` (and `torch.Event`'s, which device timing records on CUDA
from torch 2.4: `support.cuda.event_calls`).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

import otel_train  # noqa: E402
from otel_train import _runtime, semconv  # noqa: E402
from otel_train.bench.device import train_instrumented  # noqa: E402
from otel_train.record import device as _device  # noqa: E402
from otel_train.bench.switches import SyncCounter  # noqa: E402
from support.cuda import event_calls, started  # noqa: E402,F401 - event_calls: the fixture

PHASES = (semconv.SPAN_FORWARD, semconv.SPAN_BACKWARD, semconv.SPAN_OPTIMIZER)


@pytest.fixture
def session() -> Iterator[Any]:
    yield started("gpu")
    otel_train.shutdown(10.0)


def _model() -> tuple[Any, Any, Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 4096)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(8192, 4096, device="cuda")
    y = torch.randn(8192, 4096, device="cuda")
    return model, opt, x, y


def _train(model: Any, opt: Any, x: Any, y: Any, steps: int) -> None:
    train_instrumented(torch, model, opt, x, y, steps)


def test_no_synchronisation_is_added(session: Any, event_calls: Counter) -> None:
    model, opt, x, y = _model()
    torch.cuda.synchronize()  # CPU-GPU sync point: the test's own, before counting
    counter = SyncCounter()
    with counter.installed():
        counter.active = True  # any thread: the loop, the worker's polling, the final flush
        _train(model, opt, x, y, 30)
        otel_train.shutdown(10.0)
        counter.active = False
    assert counter.total() == 0, counter.calls
    assert any(method == "elapsed_time" for (_, method, _) in event_calls)
    assert all(done for (_, method, done) in event_calls if method == "elapsed_time")  # never blocking
    spans = [s for s in session.get_finished_spans() if s.name in PHASES]
    assert spans and all(s.attributes[semconv.DEVICE_TYPE] == "cuda" for s in spans)


def test_worker_thread_polls_and_training_thread_never_queries(session: Any, event_calls: Counter) -> None:
    model, opt, x, y = _model()
    training = threading.get_ident()
    _train(model, opt, x, y, 20)
    torch.cuda.synchronize()  # CPU-GPU sync point: the test's own, after the loop
    otel_train.shutdown(10.0)
    assert not [key for key in event_calls if key[0] == training]
    assert any(method == "query" for (_, method, _) in event_calls)


def test_device_durations_match_the_profiler(session: Any) -> None:
    from torch.profiler import ProfilerActivity, profile

    model, opt, x, y = _model()
    _train(model, opt, x, y, 3)  # warm-up: steps 0-2
    torch.cuda.synchronize()  # CPU-GPU sync point: the test's own
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        _train(model, opt, x, y, 10)  # steps 3-12
        torch.cuda.synchronize()  # CPU-GPU sync point: the test's own
    otel_train.shutdown(10.0)
    kernel_s = sum(e.self_device_time_total for e in prof.key_averages()) / 1e6
    spans = [s for s in session.get_finished_spans()
             if s.name in PHASES and s.attributes[semconv.TRAIN_STEP] >= 3]
    assert len(spans) == 30 and all(semconv.DEVICE_DURATION_S in s.attributes for s in spans)
    device_s = sum(s.attributes[semconv.DEVICE_DURATION_S] for s in spans)
    assert device_s == pytest.approx(kernel_s, rel=0.05)


def test_step_time_is_device_bounded_and_host_spans_are_dispatch(session: Any) -> None:
    import time

    model, opt, x, y = _model()
    _train(model, opt, x, y, 3)
    torch.cuda.synchronize()  # CPU-GPU sync point: the test's own
    t0 = time.perf_counter()
    _train(model, opt, x, y, 20)
    torch.cuda.synchronize()  # CPU-GPU sync point: the test's own
    wall_s = time.perf_counter() - t0
    otel_train.shutdown(10.0)
    spans = session.get_finished_spans()
    steps = [s for s in spans if s.name == semconv.SPAN_STEP][3:]
    total = sum(s.attributes[semconv.TRAIN_STEP_TIME_S] for s in steps)
    # The 20 steps' device-bounded times add up to the wall time of the synchronised loop.
    assert total == pytest.approx(wall_s, rel=0.05)
    forwards = [s for s in spans if s.name == semconv.SPAN_FORWARD][3:]
    host_s = sum((s.end_time - s.start_time) / 1e9 for s in forwards)
    device_s = sum(s.attributes[semconv.DEVICE_DURATION_S] for s in forwards)
    assert host_s < device_s  # GPU-bound: the host only dispatches
    assert all(s.attributes[semconv.DEVICE_LAG_S] >= 0 for s in forwards)
    assert max(s.attributes[semconv.DEVICE_LAG_S] for s in forwards) > 0.001  # the queue is visible


def test_events_are_pooled(session: Any) -> None:
    """Events go back to the pool once read and are taken again: after each round (synchronised,
    drained) the same few are out, and the pool holds no more than one round's worth."""
    model, opt, x, y = _model()
    out = []
    for _ in range(6):
        _train(model, opt, x, y, 5)
        torch.cuda.synchronize()  # CPU-GPU sync point: the test's own
        _runtime.state().worker.drain()
        pool = _device.active().pool
        out.append(pool.created - len(pool.free))
    assert len(set(out)) == 1, out  # none kept beyond what every round keeps: nothing leaks
    per_round = 5 * (2 * len(PHASES) + 1)  # an event at each phase's entry and exit, one at each step's end
    assert pool.created <= per_round + out[0] < 6 * per_round  # reused, not remade


def _cycles_per_ms() -> float:
    """`torch.cuda._sleep` cycles a millisecond on this device (the test's own sync, before timing)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()  # CPU-GPU sync point: the test's own calibration
    return 10_000_000 / start.elapsed_time(end)


def test_a_no_sync_loop_reports_every_step_within_one_percent(session: Any) -> None:
    """The loop of issue 51: steps alternating ~5 and ~33 ms of device work, the host running far
    ahead (no per-step sync), an evaluation pass that reads its result back every 10 steps. Each
    step's `train.step.time_s` against the script's own events at its device boundaries."""
    per_ms = _cycles_per_ms()
    marks: list[Any] = []  # the script's own boundary events: one before the first step, one after each
    first = torch.cuda.Event(enable_timing=True)
    first.record()
    marks.append(first)
    x = torch.ones(1024, device="cuda")
    for i in range(41):
        work = (1, 3, 1) if i % 2 == 0 else (8, 20, 5)
        with otel_train.step():
            for name, ms in zip(PHASES, work):
                with otel_train.span(name):
                    torch.cuda._sleep(int(ms * per_ms))
        mark = torch.cuda.Event(enable_timing=True)
        mark.record()
        marks.append(mark)
        if i % 10 == 9:
            with otel_train.span(semconv.SPAN_EVAL):
                (x * 2).sum().item()  # the evaluation's own sync
            after = torch.cuda.Event(enable_timing=True)
            after.record()
            marks[-1] = (mark, after)  # the next step starts after the evaluation
    torch.cuda.synchronize()  # CPU-GPU sync point: the test's own, after the loop
    otel_train.shutdown(10.0)
    truth = []
    for i in range(1, len(marks)):
        prev, cur = marks[i - 1], marks[i]
        start = prev[1] if isinstance(prev, tuple) else prev
        end = cur[0] if isinstance(cur, tuple) else cur
        truth.append(start.elapsed_time(end) / 1e3)
    steps = [s for s in session.get_finished_spans() if s.name == semconv.SPAN_STEP]
    reported = [s.attributes[semconv.TRAIN_STEP_TIME_S] for s in steps]
    assert len(reported) == len(truth) == 41
    worst = max(abs(r - t) / t for r, t in zip(reported, truth))
    assert worst < 0.01, [(round(r * 1e3, 3), round(t * 1e3, 3)) for r, t in zip(reported, truth)]
