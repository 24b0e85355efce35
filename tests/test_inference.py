"""`otel_train.inference` in-process, with a fake clock: an actor's generate calls, their carriers
and traces, a trainer's dispatch waits and links, and the pipeline gauges they feed."""

from __future__ import annotations

import pytest
from support.harness import Harness, by_name

import otel_train
from otel_train import inference, semconv
from otel_train.wire.ids import parse_traceparent

MS = 1_000_000


def _gauge(harness: Harness, name: str) -> float:
    (point,) = harness.metric_points(name)
    return point.value


def test_each_generate_call_is_a_trace_its_carrier_names() -> None:
    harness = Harness(role="inference")
    carriers = []
    for n in (4, 8):
        with inference.generate(batch_size=n) as call:
            with otel_train.span("tokenize"):
                harness.clock.advance(MS)
                inner = otel_train.inject()
            harness.clock.advance(9 * MS)
            call.samples = n
        carriers.append(call.carrier)
    spans = harness.finish()
    calls = by_name(spans, semconv.SPAN_INFER_GENERATE)
    assert [dict(s.attributes) for s in calls] == [{"infer.batch_size": 4, "infer.samples": 4},
                                                   {"infer.batch_size": 8, "infer.samples": 8}]
    for call, carrier in zip(calls, carriers):
        assert parse_traceparent(carrier) == (call.context.trace_id, call.context.span_id)
        assert call.parent is None
    (first_tokenize, _) = by_name(spans, "tokenize")
    assert first_tokenize.context.trace_id == calls[0].context.trace_id  # inside the call's trace
    assert first_tokenize.parent.span_id == calls[0].context.span_id
    assert parse_traceparent(inner)[0] == calls[1].context.trace_id  # inject() deep inside names the call's trace
    assert calls[0].context.trace_id != calls[1].context.trace_id
    assert spans[0].resource.attributes[semconv.ML_ROLE] == "inference"
    # infer.capacity: 12 samples in 20 ms of generate time
    assert _gauge(harness, semconv.METRIC_INFER_CAPACITY) == pytest.approx(600.0)
    (batch,) = harness.metric_points(semconv.METRIC_INFER_BATCH_DURATION)
    assert batch.count == 2


def test_generate_as_a_decorator_counts_the_results() -> None:
    harness = Harness(role="inference")

    @inference.generate(batch_size=2)
    def make(n: int) -> list[int]:
        harness.clock.advance(5 * MS)
        return list(range(n))

    assert make(3) == [0, 1, 2]
    (call,) = by_name(harness.finish(), semconv.SPAN_INFER_GENERATE)
    assert call.attributes[semconv.INFER_SAMPLES] == 3 and call.attributes[semconv.INFER_BATCH_SIZE] == 2


def test_a_step_links_what_it_consumed_and_feeds_the_pipeline_gauges() -> None:
    harness = Harness()
    producer = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    other = "00-" + "12" * 16 + "-" + "34" * 8 + "-01"
    for pool in (3, 1):
        with otel_train.step():
            with inference.dispatch_wait(pool_size=pool) as wait:
                harness.clock.advance(10 * MS)
                wait.consumed({"traceparent": producer}, 4)
                wait.consumed({"traceparent": producer}, 2)  # the same call's samples: one link
                wait.consumed({"traceparent": other}, 2)
            harness.clock.advance(40 * MS)
    spans = harness.finish()
    steps = by_name(spans, semconv.SPAN_STEP)
    assert [[(link.context.trace_id, link.context.span_id) for link in s.links] for s in steps] == \
        [[(int("ab" * 16, 16), int("cd" * 8, 16)), (int("12" * 16, 16), int("34" * 8, 16))]] * 2
    waits = by_name(spans, semconv.SPAN_DISPATCH_WAIT)
    assert [dict(w.attributes) for w in waits] == [
        {"pipeline.pool.size": 3, "pipeline.samples": 8, "train.step": 0},
        {"pipeline.pool.size": 1, "pipeline.samples": 8, "train.step": 1}]
    # 16 samples in 100 ms of step time, 20 ms of it waiting
    assert _gauge(harness, semconv.METRIC_PIPELINE_THROUGHPUT) == pytest.approx(160.0)
    assert _gauge(harness, semconv.METRIC_TRAIN_CAPACITY) == pytest.approx(200.0)
    assert _gauge(harness, semconv.METRIC_POOL_SIZE) == 1
    (wait_histogram,) = harness.metric_points(semconv.METRIC_DISPATCH_WAIT)
    assert wait_histogram.count == 2 and wait_histogram.sum == pytest.approx(0.02)


def test_a_run_without_a_pipeline_exports_no_pipeline_gauges() -> None:
    harness = Harness()
    with otel_train.step(samples=8):
        harness.clock.advance(MS)
    harness.finish()
    for name in (semconv.METRIC_TRAIN_CAPACITY, semconv.METRIC_PIPELINE_THROUGHPUT, semconv.METRIC_POOL_SIZE,
                 semconv.METRIC_INFER_CAPACITY):
        assert harness.metric_points(name) == []


def test_disabled_helpers_do_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    Harness()
    with inference.generate(batch_size=1) as call:
        call.samples = 1
    assert call.carrier == {}
    with inference.dispatch_wait(pool_size=2) as wait:
        wait.consumed({"traceparent": "x"}, 1)
        wait.pool_size = 3
