"""The hot-path recorder and span emission, in-process, with a fake clock and an in-memory exporter."""

from __future__ import annotations

import asyncio
import logging
import os

import pytest
from support.harness import Harness, by_name

import otel_train
from otel_train import semconv
from otel_train.record import recorder as _recorder
from otel_train.record.span import NOOP
from otel_train.wire.ids import parse_traceparent, step_span_id, trace_id_for


def test_nested_spans_have_exact_times_and_parents(harness: Harness) -> None:
    clock = harness.clock
    t_start = clock.now_ns
    with otel_train.step(0):
        clock.advance(10)
        with otel_train.span("outer", a=1):
            clock.advance(5)
            with otel_train.span("inner"):
                clock.advance(7)
            clock.advance(1)
        clock.advance(2)
    spans = harness.finish()
    (step,), (outer,), (inner,) = by_name(spans, "train.step"), by_name(spans, "outer"), by_name(spans, "inner")
    wall = clock.wall_offset_ns
    assert (step.start_time, step.end_time) == (t_start + wall, t_start + 25 + wall)
    assert (outer.start_time, outer.end_time) == (t_start + 10 + wall, t_start + 23 + wall)
    assert inner.end_time - inner.start_time == 7
    assert inner.parent.span_id == outer.context.span_id
    assert outer.parent.span_id == step.context.span_id
    assert step.parent is None  # rank 0: the step is the root of its trace
    assert step.context.span_id == step_span_id("test-run", 0, 0, launch=harness.run.launch)
    assert {s.context.trace_id for s in spans} == {trace_id_for("test-run", 0)}
    assert outer.attributes == {"a": 1, semconv.TRAIN_STEP: 0}


def test_steps_number_themselves_and_get_one_trace_each(harness: Harness) -> None:
    for _ in range(3):
        with otel_train.step():
            with otel_train.span(semconv.SPAN_FORWARD):
                harness.clock.advance(100)
    spans = harness.finish()
    steps = by_name(spans, semconv.SPAN_STEP)
    assert [s.attributes[semconv.TRAIN_STEP] for s in steps] == [0, 1, 2]
    assert len({s.context.trace_id for s in steps}) == 3
    for fwd in by_name(spans, semconv.SPAN_FORWARD):
        n = fwd.attributes[semconv.TRAIN_STEP]
        assert fwd.context.trace_id == trace_id_for("test-run", n)
        assert fwd.parent.span_id == step_span_id("test-run", n, 0, launch=harness.run.launch)


def test_step_time_is_between_boundaries_minus_siblings(harness: Harness) -> None:
    clock = harness.clock
    with otel_train.step(0, epoch=3):
        clock.advance(1_000)
    clock.advance(500)  # data wait between steps belongs to the next step
    with otel_train.span(semconv.SPAN_CHECKPOINT):
        clock.advance(4_000)  # ... but a checkpoint is its own work, not step 1's
    with otel_train.step(1):
        clock.advance(2_000)
    spans = harness.finish()
    step0, step1 = by_name(spans, semconv.SPAN_STEP)
    assert step0.attributes[semconv.TRAIN_STEP_TIME_S] == pytest.approx(1_000e-9)
    assert step1.attributes[semconv.TRAIN_STEP_TIME_S] == pytest.approx(2_500e-9)
    assert step0.attributes[semconv.TRAIN_EPOCH] == 3


def test_checkpoint_eval_gc_are_siblings_of_steps_and_tag_them(harness: Harness) -> None:
    with otel_train.step(0):
        with otel_train.span(semconv.SPAN_EVAL):  # inside the step block, still not inside the step
            harness.clock.advance(10)
    with otel_train.span(semconv.SPAN_CHECKPOINT):  # after step 0: joins step 0's trace
        harness.clock.advance(10)
    with otel_train.step(1):
        with otel_train.span(semconv.SPAN_GC):
            pass
    spans = harness.finish()
    step0, step1 = by_name(spans, semconv.SPAN_STEP)
    (ev,), (ck,), (gc,) = (by_name(spans, n) for n in (semconv.SPAN_EVAL, semconv.SPAN_CHECKPOINT,
                                                        semconv.SPAN_GC))
    for sibling, step in ((ev, step0), (ck, step0), (gc, step1)):
        assert sibling.parent is None
        assert sibling.context.trace_id == step.context.trace_id
        assert sibling.attributes[semconv.TRAIN_STEP] == step.attributes[semconv.TRAIN_STEP]
    assert step0.attributes[semconv.TRAIN_STEP_TAGS] == ("checkpoint", "eval")
    assert step1.attributes[semconv.TRAIN_STEP_TAGS] == ("gc",)


def test_tags_and_events_reach_the_right_step(harness: Harness) -> None:
    with otel_train.step(0):
        otel_train.tag("warmup")
        otel_train.event("lr.change", lr=0.1)
        with otel_train.span("work"):
            otel_train.event("inside.work")
    otel_train.tag("custom")  # between steps: the step just ended
    otel_train.event("after.step", loss=2.5)
    with otel_train.step(1):
        pass
    spans = harness.finish()
    step0, step1 = by_name(spans, semconv.SPAN_STEP)
    (work,) = by_name(spans, "work")
    assert step0.attributes[semconv.TRAIN_STEP_TAGS] == ("custom", "warmup")
    assert semconv.TRAIN_STEP_TAGS not in step1.attributes
    assert [(e.name, dict(e.attributes)) for e in step0.events] == [("lr.change", {"lr": 0.1}),
                                                                     ("after.step", {"loss": 2.5})]
    assert [e.name for e in work.events] == ["inside.work"]


def test_decorator_sync_and_async_with_concurrent_tasks(harness: Harness) -> None:
    @otel_train.span("sync.work", kind="sync")
    def work(x: int) -> int:
        return x + 1

    @otel_train.span("task")
    async def task(i: int) -> None:
        with otel_train.span("task.inner", i=i):
            await asyncio.sleep(0)  # let the other task run between enter and exit
            await asyncio.sleep(0)

    async def main() -> None:
        async with otel_train.span("async.block"):
            await asyncio.gather(task(0), task(1))

    assert work(1) == 2
    asyncio.run(main())
    spans = harness.finish()
    (block,) = by_name(spans, "async.block")
    tasks = by_name(spans, "task")
    inners = by_name(spans, "task.inner")
    assert by_name(spans, "sync.work")[0].attributes["kind"] == "sync"
    assert {t.parent.span_id for t in tasks} == {block.context.span_id}
    task_ids = {t.context.span_id for t in tasks}
    assert len(task_ids) == 2 and {i.parent.span_id for i in inners} == task_ids
    assert len({i.parent.span_id for i in inners}) == 2  # each inner under its own task


def test_exception_marks_the_span_and_propagates(harness: Harness) -> None:
    with pytest.raises(KeyError):
        with otel_train.span("fails"):
            raise KeyError("boom")
    (span,) = by_name(harness.finish(), "fails")
    assert span.status.status_code.name == "ERROR"
    assert span.attributes[semconv.ERROR_TYPE] == "KeyError"


def test_full_buffer_drops_oldest_counts_and_reports(capsys: pytest.CaptureFixture[str]) -> None:
    h = Harness(buffer_size=64)
    for i in range(100):
        with otel_train.span("s", i=i):
            pass
    spans = h.finish()
    assert sorted(s.attributes["i"] for s in spans) == list(range(36, 100))  # the oldest went
    assert "dropped: 36 (buffer full)" in capsys.readouterr().err
    (point,) = h.metric_points(semconv.METRIC_SPANS_DROPPED)
    assert point.value == 36 and point.attributes[semconv.METRIC_ATTR_REASON] == "buffer_full"


def test_open_spans_are_truncated_at_shutdown(harness: Harness) -> None:
    otel_train.step(0).__enter__()
    outer = otel_train.span("outer")
    outer.__enter__()
    harness.clock.advance(50)
    spans = harness.finish()
    (step,), (span,) = by_name(spans, semconv.SPAN_STEP), by_name(spans, "outer")
    assert step.attributes[semconv.TRUNCATED] is True and span.attributes[semconv.TRUNCATED] is True
    assert span.end_time - span.start_time == 50
    outer.__exit__(None, None, None)  # exiting after shutdown is harmless


def test_inject_names_the_current_span_and_link_attaches_it(harness: Harness) -> None:
    with otel_train.step(0):
        with otel_train.span("produce"):
            carrier = otel_train.inject()
        step_carrier = otel_train.inject()
    otel_train.link(carrier)  # between steps: links the next step
    with otel_train.step(1):
        otel_train.link({"traceparent": "garbage"})
    spans = harness.finish()
    (produce,), steps = by_name(spans, "produce"), by_name(spans, semconv.SPAN_STEP)
    assert parse_traceparent(carrier) == (produce.context.trace_id, produce.context.span_id)
    assert parse_traceparent(step_carrier) == (steps[0].context.trace_id, steps[0].context.span_id)
    (link,) = steps[1].links
    assert (link.context.trace_id, link.context.span_id) == (produce.context.trace_id, produce.context.span_id)
    assert otel_train.inject() == {}


def test_bad_attribute_values_are_fixed_with_one_message(harness: Harness, caplog: pytest.LogCaptureFixture) -> None:
    for _ in range(3):
        with otel_train.span("attrs", big="x" * 5000, obj=object(), mixed=[1, "a"], huge=2**70, ok=[1, 2]):
            pass
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        spans = harness.finish()
    attrs = spans[0].attributes
    assert len(attrs["big"]) == 2048
    assert attrs["obj"].startswith("<object object")
    assert attrs["mixed"] == ("1", "a") and attrs["huge"] == str(2**70) and attrs["ok"] == (1, 2)
    messages = [r.getMessage() for r in caplog.records]
    for key in ("'big'", "'obj'", "'mixed'", "'huge'"):
        assert sum(key in m for m in messages) == 1, messages  # one message per attribute, not per span


def test_attribute_limit_follows_the_otel_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "10")
    h = Harness()
    with otel_train.span("attrs", text="y" * 50):
        pass
    assert h.finish()[0].attributes["text"] == "y" * 10


def test_disabled_is_a_noop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert Harness().run is None
    assert otel_train.span is _recorder.Region  # the one factory, which now makes the no-op
    with otel_train.step():
        with otel_train.span("x") as region:
            otel_train.tag("t")
            otel_train.event("e")
    assert region is NOOP
    assert otel_train.inject() == {}
    with pytest.raises(ValueError):  # exceptions still propagate through a disabled span
        with otel_train.span("x"):
            raise ValueError


def test_rank_other_than_zero_parents_its_step_to_rank_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    h = Harness()
    with otel_train.step(4):
        pass
    (step,) = h.finish()
    assert step.parent.span_id == step_span_id("test-run", 4, 0, launch=h.run.launch) and step.parent.is_remote
    assert step.context.span_id == step_span_id("test-run", 4, 1, launch=h.run.launch)
    assert step.resource.attributes[semconv.ML_RANK] == 1
    assert step.resource.attributes[semconv.ML_WORLD_SIZE] == 2


def test_siblings_on_other_ranks_share_their_steps_parent(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank's checkpoint/eval/GC span is a sibling of its step: both children of rank 0's step,
    so every step trace has a single root (rank 0's step), the span Jaeger names the trace after."""
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    h = Harness()
    with otel_train.step(3):
        h.clock.advance(5)
    with otel_train.span(semconv.SPAN_EVAL):
        h.clock.advance(5)
    with otel_train.span(semconv.SPAN_CHECKPOINT):
        h.clock.advance(5)
    spans = h.finish()
    (step,) = by_name(spans, semconv.SPAN_STEP)
    siblings = by_name(spans, semconv.SPAN_EVAL) + by_name(spans, semconv.SPAN_CHECKPOINT)
    assert len(siblings) == 2
    for sibling in siblings:
        assert sibling.parent.span_id == step.parent.span_id == step_span_id("test-run", 3, 0, launch=h.run.launch)
        assert sibling.parent.is_remote and sibling.context.trace_id == step.context.trace_id


def test_step_sampling_keeps_metrics_for_every_step() -> None:
    h = Harness(step_sample=2)
    for _ in range(6):
        with otel_train.step():
            with otel_train.span(semconv.SPAN_FORWARD):
                h.clock.advance(1000)
    spans = h.finish()
    assert sorted({s.attributes[semconv.TRAIN_STEP] for s in spans}) == [0, 2, 4]
    (step_hist,) = h.metric_points(semconv.METRIC_STEP_DURATION)
    assert step_hist.count == 6
    (phase_hist,) = h.metric_points(semconv.METRIC_PHASE_DURATION)
    assert phase_hist.count == 6 and phase_hist.attributes == {semconv.METRIC_ATTR_PHASE: semconv.SPAN_FORWARD}


def test_tokens_and_samples_per_second_come_from_the_steps_own_time() -> None:
    h = Harness()
    for tokens in (4096, 2048):
        with otel_train.step(**{semconv.TRAIN_TOKENS: tokens, semconv.TRAIN_SAMPLES: 8}):
            h.clock.advance(500_000_000)  # 0.5 s
    with otel_train.step(**{semconv.TRAIN_TOKENS: True}):  # not a count: no gauge value from it
        h.clock.advance(500_000_000)
    h.finish()
    (tokens_per_s,) = h.metric_points(semconv.METRIC_THROUGHPUT_TOKENS)
    (samples_per_s,) = h.metric_points(semconv.METRIC_THROUGHPUT_SAMPLES)
    assert (tokens_per_s.value, samples_per_s.value) == (4096.0, 16.0)  # the last step that had them


def test_forked_child_records_nothing(harness: Harness) -> None:
    pid = os.fork()
    if pid == 0:  # the child: a DataLoader worker, say
        code = 0
        try:
            with otel_train.span("in.child"):
                pass
            code = 0 if _recorder.active() is None else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    with otel_train.span("in.parent"):
        pass
    assert [s.name for s in harness.finish()] == ["in.parent"]


def test_init_is_idempotent_and_reinit_after_shutdown_works() -> None:
    first = Harness()
    assert otel_train.init(run_id="other") is first.run
    first.finish()
    second = Harness(run_id="second")
    assert second.run is not None and second.run.run_id == "second"
    second.finish()
