"""Span assembly: records in, spans out (the trace shape of docs/trace-shape.md), metrics on the way.

Two kinds of input, one output:

- `feed_raw(records, offset)`: the hot path's tuples as the recorder appended them (the usual
  case). The usual regions go by the fast path (`fast_path.FastPath`: straight to OTLP bytes),
  usual steps by its lean step form, everything else the general way below.
  A packed drain arrives unpacked into these tuples (`pipeline.ExportPipeline.feed_packed`).
- `feed(wire records)`: wire tuples (`wire.schema`), records the worker converted already
  (device time, force-ended at shutdown): the general way.

The general way turns a record into a span with its final ids, parent and timestamps: a plain
tuple the encoder (`otlp.LeanEncoder`) encodes at export, for every destination alike. Regions are
emitted at once; a step is held until the next one (`step_timeline.StepTimeline`: late tags and
events, its siblings, its own time). Every record, sampled out or not, feeds the metrics and
the run's goodput account (`goodput.RunAccount`), whose slow-step rule tags a step `slow`.
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from contextlib import nullcontext
from itertools import repeat
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import StatusCode

from otel_train import semconv
from otel_train._distributed import RunInfo
from otel_train.export.actor_traces import ActorTraces
from otel_train.export.attributes import AttributeCleaner, add_device
from otel_train.export.fast_path import FastPath
from otel_train.export.goodput import DATA_SPANS, SLOW_TAG, RunAccount
from otel_train.export.metrics import TrainMetrics
from otel_train.export.otlp import LeanEncoder
from otel_train.export.pipeline_metrics import PIPELINE_SPANS
from otel_train.export.restarts import RestartProgress
from otel_train.export.span_ids import SpanIds
from otel_train.export.step_timeline import SIBLING_TAGS, HeldStep, StepTimeline, late_events
from otel_train.wire import sampling
from otel_train.wire.ids import parse_traceparent
from otel_train.wire.schema import (KIND_EVENT, KIND_SAMPLE, KIND_SPAN, KIND_STEP, KIND_TAG, W_ATTRS, W_DEV,
                                    W_ERROR, W_EVENTS, W_LINKS, W_NAME, W_PARENT, W_SEQ, W_STEP, W_STEP_SEQ, W_T0,
                                    W_T1, W_TRUNC, NO_UPDATE, tuple_to_wire)

_log = logging.getLogger("otel_train")
#: Links kept per step span: OpenTelemetry's default span link count limit.
MAX_LINKS = 128
_NO_LOCK = nullcontext()


def sibling_interval(wire: tuple[Any, ...], dev: Any) -> tuple[int, int]:
    """A checkpoint / eval / GC span's hold on the timeline: with device time, from when the
    device started it (before that it was finishing the step's work) until both host and device
    are done with it (async eval work may outlive its host span); else its host interval."""
    s0, s1 = wire[W_T0], wire[W_T1]
    if dev:
        s0 += max(0, dev.get(semconv.WIRE_DEV_START_NS, 0))
        s1 += max(0, dev.get(semconv.WIRE_DEV_END_NS, 0))
    return s0, s1


def _device_times(wire: tuple[Any, ...], attrs: dict[str, Any], start: int, end: int) -> tuple[Any, ...]:
    """`wire` drawn from `start` to `end` (the device's timeline); the host's interval kept as
    `host.offset_s` (from `start`) and `host.duration_s`."""
    t0, t1 = wire[W_T0], wire[W_T1]
    attrs[semconv.HOST_OFFSET_S] = (t0 - start) / 1e9
    attrs[semconv.HOST_DURATION_S] = (t1 - t0) / 1e9
    return (*wire[:W_T0], start, max(end, start), *wire[W_T1 + 1:])


class SpanAssembler:
    """Records in, spans out through `emit`; metrics observed on the way.

    What comes out is a plain tuple the encoder encodes at export or, for the usual region and
    step (`fast` on), its encoded bytes already (`fast_path`).
    """

    def __init__(self, run: RunInfo, salt: int, resource: Resource, cleaner: AttributeCleaner,
                 emit: Callable[[list[Any]], None], step_sample: int = 1, metrics: TrainMetrics | None = None,
                 version: str = "", encoder: LeanEncoder | None = None, account: RunAccount | None = None,
                 ranks: str = sampling.ALL, step_spans: str = "all", span_time: str = "device") -> None:
        encoder = encoder or LeanEncoder(dict(resource.attributes), semconv.SCOPE_NAME, version)
        self.run = run
        self.salt = salt
        self.resource = resource
        self.cleaner = cleaner
        self.emit = emit
        self.step_sample = step_sample
        # Rank sampling is for trainers; an inference actor's spans always go out.
        self.sampling = sampling.RankSampling(ranks if run.role == semconv.ROLE_TRAINER else sampling.ALL,
                                              run.run_id, run.rank, run.local_rank, run.world_size, step_sample,
                                              step_spans if run.role == semconv.ROLE_TRAINER else "all")
        self.metrics = metrics
        self.encoder = encoder
        self.account = account  # goodput and slow steps, fed under the metrics lock (collect reads it)
        self.ids = SpanIds(run, salt)
        self.timeline = StepTimeline()
        #: "device": spans with device time are drawn where the device worked (`_device_times`).
        self.device_view = span_time == "device"
        self.fast_path = FastPath(encoder, cleaner, self.ids, self.phases_sampled)
        # An inference actor's spans wait for their call's trace (`actor_traces`): the general way.
        self.actors = ActorTraces(run.run_id, salt) if run.role != semconv.ROLE_TRAINER else None
        #: The fast path may take usual records, which then come out as bytes (off where span
        #: processors need every span as a tuple, for an inference actor, and in tests).
        self.fast = self.actors is None
        self.lean_steps = True  # usual step records by the fast path's lean form (tests turn it off)
        self._windows: dict[str, tuple[Any, list[Any]]] = {}
        self.spans_built = 0
        #: Set by the pipeline where the run may restart: steps noted, redone ones tagged.
        self.progress: RestartProgress | None = None
        self._links_capped = False

    # -- in ----------------------------------------------------------------------------
    def feed(self, records: Iterable[tuple[Any, ...]]) -> None:
        """Wire tuples (`wire.schema`)."""
        out: list[Any] = []
        with self.metrics.lock if self.metrics is not None else _NO_LOCK:
            for wire in records:
                self._dispatch(wire, out)
        self._emit_all(out)

    def feed_raw(self, records: Iterable[tuple[Any, ...]], offset: int) -> None:
        """Hot-path tuples as the recorder appended them, with the perf-to-wall `offset`."""
        out: list[Any] = []
        # One lock for the batch: the fast path adds to metric windows itself.
        with self.metrics.lock if self.metrics is not None else _NO_LOCK:
            if self.fast:
                durations: dict[str, list[int]] = {}
                records = self.fast_path.regions(records, offset, out, durations)  # type: ignore[union-attr]
                self._observe_durations(durations)
            self._dispatch_records(records, offset, out)
        self._emit_all(out)

    def flush(self) -> None:
        """Emit every held step (at shutdown, or when a caller must see everything now)."""
        out: list[Any] = []
        for held in self.timeline.release_all():
            self._emit_step(held, out)
        if self.actors is not None:
            self.actors.flush(out)
        self._emit_all(out)

    def _emit_all(self, out: list[Any]) -> None:
        if out:
            self.spans_built += len(out)
            self.emit(out)

    # -- records -----------------------------------------------------------------------
    def _dispatch_records(self, records: Iterable[Any], offset: int, out: list[Any]) -> None:
        """Hot-path records the fast path left: a usual step record the lean way, the rest as wire tuples."""
        lean = self.fast_path if self.fast and self.lean_steps else None
        for record in records:
            if lean is not None and type(record) is tuple and record[0] == KIND_STEP:
                found = lean.lean_step(record, offset)
                if found is not None:
                    self._hold(*found, out)
                    continue
            self._dispatch(tuple_to_wire(record, offset), out)

    def _dispatch(self, wire: tuple[Any, ...], out: list[Any]) -> None:
        kind = wire[0]
        if kind == KIND_SPAN:
            self._on_span(wire, out)
        elif kind == KIND_STEP:
            self._on_step(wire, out)
        elif kind == KIND_TAG:
            self.timeline.tag(wire[W_STEP], wire[W_STEP_SEQ], wire[W_NAME])
        elif kind == KIND_EVENT:
            self.timeline.event(wire[W_STEP_SEQ], (wire[W_NAME], wire[W_T0], wire[W_ATTRS]))
        elif kind == KIND_SAMPLE and self.metrics is not None:
            self.metrics.sample(wire[W_ATTRS], wire[W_T0])

    def _on_span(self, wire: tuple[Any, ...], out: list[Any]) -> None:
        name, step_n, step_seq = wire[W_NAME], wire[W_STEP], wire[W_STEP_SEQ]
        attrs = self.cleaner.clean(name, wire[W_ATTRS])
        dev = wire[W_DEV]
        if dev:
            add_device(attrs, dev)
        if step_n is not None:
            attrs[semconv.TRAIN_STEP] = step_n
        sibling_tag = SIBLING_TAGS.get(name)
        parent_seq = wire[W_PARENT]
        if dev and sibling_tag is None and step_seq is not None and semconv.WIRE_DEV_END_NS in dev:
            self.timeline.device_work(step_seq, wire[W_T1] + dev[semconv.WIRE_DEV_END_NS])
        if sibling_tag is not None:
            # Checkpoint / eval / GC: never inside a step; the step they belong to is tagged.
            # With device time, the sibling holds the timeline from when the device started it
            # (before that the device was finishing the step's work) until both host and device
            # are done with it (async eval work may outlive its host span).
            s0, s1 = sibling_interval(wire, dev)
            self._sibling(name, s0, s1, step_n, step_seq, sibling_tag)
        remote = False
        if parent_seq is not None:
            parent_id = self.ids.region(parent_seq)
        elif step_seq is not None and sibling_tag is None:
            parent_id = self.ids.step_span(step_n)
        elif (sibling_tag is not None or name == semconv.SPAN_OTHER) and step_n is not None:
            # A sibling of its step (and the script's own time between steps, `train.other`)
            # has the step's parent: rank 0's step span (none on rank 0).
            # So a step's trace has one root, rank 0's step, whatever the ranks' clocks say;
            # Jaeger names a trace after its earliest root, and another rank's eval is not it.
            parent_id = self.ids.root_step(step_n)
            remote = parent_id is not None
        else:
            parent_id = None
        if self.metrics is not None:
            self.metrics.observe(name, (wire[W_T1] - wire[W_T0]) / 1e9, attrs)
            if name in PIPELINE_SPANS:
                self.metrics.pipeline.span(name, (wire[W_T1] - wire[W_T0]) / 1e9, attrs, step_n)
        if self.account is not None:
            if name in DATA_SPANS:
                self.account.data(wire[W_T1] - wire[W_T0])
            self.account.seen(wire[W_T1])
        if not (self.sampled(step_n) if sibling_tag is not None else self.phases_sampled(step_n)):
            return
        span_id = self.ids.region(wire[W_SEQ])
        if self.actors is not None and step_n is None:
            self.actors.place(wire[W_SEQ], parent_seq, lambda trace: self._build(
                name, trace, span_id, parent_id, False, wire, attrs, wire[W_EVENTS], None), out)
            return
        if dev and self.device_view and semconv.WIRE_DEV_START_NS in dev:
            start, end = sibling_interval(wire, dev) if sibling_tag is not None else (
                wire[W_T0] + max(0, dev[semconv.WIRE_DEV_START_NS]), wire[W_T1] + dev[semconv.WIRE_DEV_END_NS])
            wire = _device_times(wire, attrs, start, end)
        out.append(self._build(name, self.ids.trace(step_n), span_id, parent_id, remote, wire, attrs,
                               wire[W_EVENTS], None))

    def _on_step(self, wire: tuple[Any, ...], out: list[Any]) -> None:
        if NO_UPDATE in wire[W_ATTRS]:
            self._no_update(wire, out)
            return
        t1 = wire[W_T1]
        # The step's boundary is when the device finished its last work (its end event, mapped
        # to the host clock), not when the host finished dispatching it: under asynchronous
        # dispatch the host runs ahead (MaxText #4270). Without device time (CPU, or no event
        # to spare), the host end is the boundary, which on CPU is the same thing.
        dev = wire[W_DEV]
        end = t1
        if dev and semconv.WIRE_DEV_END_NS in dev:
            end = self.timeline.device_end(wire[W_SEQ], t1, t1 + dev[semconv.WIRE_DEV_END_NS],
                                           bool(dev.get(semconv.WIRE_DEV_LATE)))
        self._hold(wire, end, None, out)

    def _no_update(self, wire: tuple[Any, ...], out: list[Any]) -> None:
        """A step detection opened for forwards that no update followed (`NO_UPDATE`: the run's
        last, a final `predict()` with gradients) is no step: no step metric, no step time, not
        counted. Its forwards were sent under its span id already, so that span stays, as the
        evaluation pass it was: a `train.eval`, a sibling of the steps that tags the one before."""
        step_n, t0, t1 = wire[W_STEP], wire[W_T0], wire[W_T1]
        self.timeline.work_ends.pop(wire[W_SEQ], None)
        before = step_n - 1 if type(step_n) is int and step_n else None
        self._sibling(semconv.SPAN_EVAL, t0, t1, before, None, semconv.TAG_EVAL)
        attrs = {semconv.TRAIN_STEP: step_n}
        if self.metrics is not None:
            self.metrics.observe(semconv.SPAN_EVAL, (t1 - t0) / 1e9, attrs)
        if self.sampled(step_n):
            parent = self.ids.root_step(step_n)
            out.append(self._build(semconv.SPAN_EVAL, self.ids.trace(step_n), self.ids.step_span(step_n), parent,
                                   parent is not None, wire, attrs, None, None))

    def _sibling(self, name: str, s0: int, s1: int, step_n: Any, step_seq: Any, tag: str) -> None:
        """A step's sibling (checkpoint, eval, GC) holds the timeline from `s0` to `s1`, counts in
        the goodput account under `name`, and tags step `step_n` (none: no step to tag)."""
        self.timeline.sibling(s0, s1)
        if self.account is not None:
            self.account.sibling(name, s0, s1)
        if step_n is not None:
            self.timeline.tag(step_n, step_seq, tag)

    def _hold(self, wire: tuple[Any, ...], end: int, lean: bytes | None, out: list[Any]) -> None:
        if self.progress is not None and type(wire[W_STEP]) is int:
            self.progress.note(wire[W_STEP])
        held, done = self.timeline.hold(wire, end, lean)
        for earlier in done:
            self._emit_step(earlier, out)
        if self.account is not None and self.account.step(wire[W_T0], end, held.time_s, held.tags):
            held.tags.append(SLOW_TAG)  # one search away: `train.step.tags` contains "slow"

    def _emit_step(self, held: HeldStep, out: list[Any]) -> None:
        wire = held.wire
        step_n = wire[W_STEP]
        if self.progress is not None and type(step_n) is int and self.progress.redone(step_n):
            held.tags.append(semconv.TAG_REDONE)  # an earlier attempt ran this step (`restarts.py`)
        if held.lean is not None and not held.tags and not held.events:
            self._emit_lean_step(held, out)
            return
        attrs = self.cleaner.clean(semconv.SPAN_STEP, wire[W_ATTRS])
        if wire[W_DEV]:
            add_device(attrs, wire[W_DEV])
        attrs[semconv.TRAIN_STEP] = step_n
        attrs[semconv.TRAIN_STEP_TIME_S] = held.time_s
        if held.tags:
            attrs[semconv.TRAIN_STEP_TAGS] = tuple(sorted(set(held.tags)))
        if self.metrics is not None:
            self.metrics.observe_step(held.time_s, attrs)
            if self.metrics.pipeline.active:
                self.metrics.pipeline.step(step_n, held.time_s, attrs)
        if not self.sampled(step_n):
            return
        if wire[W_DEV] and self.device_view and held.end is not None:
            # Between its device boundaries: from the previous step's (its siblings' time left
            # out, so the span lasts `train.step.time_s`) to its own.
            wire = _device_times(wire, attrs, held.end - round(held.time_s * 1e9), held.end)
        if self.fast and not (held.events or wire[W_LINKS] or wire[W_ERROR] or wire[W_TRUNC]):
            out.append(self.fast_path.step_span(step_n, wire[W_T0], wire[W_T1], attrs))  # type: ignore[union-attr]
            return
        parent = self.ids.root_step(step_n)
        events = late_events(held.events, wire[W_T1]) if held.events else held.events
        out.append(self._build(semconv.SPAN_STEP, self.ids.trace(step_n), self.ids.step_span(step_n), parent,
                               parent is not None, wire, attrs, events, wire[W_LINKS]))

    def _emit_lean_step(self, held: HeldStep, out: list[Any]) -> None:
        """`_emit_step` for a step the fast path held (`FastPath.lean_step`) that nothing was added
        to since: the same metric and the same bytes, from its encoded fields."""
        wire = held.wire
        metrics = self.metrics
        if metrics is not None:
            attrs = wire[W_ATTRS]
            if semconv.TRAIN_SAMPLES in attrs or semconv.TRAIN_TOKENS in attrs:  # throughput, MFU
                metrics.observe_step(held.time_s, attrs, wire[W_STEP])
            else:
                metrics.observe_step_time(held.time_s, wire[W_STEP])
            if metrics.pipeline.active:
                metrics.pipeline.step(wire[W_STEP], held.time_s, None)
        if self.sampled(wire[W_STEP]):
            out.append(self.fast_path.lean_step_span(held))  # type: ignore[union-attr]

    # -- helpers -----------------------------------------------------------------------
    def sampled(self, step_n: int | None) -> bool:
        """Whether step `step_n`'s step span and its siblings are exported (OTEL_TRAIN_STEP_SAMPLE,
        and OTEL_TRAIN_STEP_SPANS); metrics see every step."""
        return self.sampling.step(step_n)

    def phases_sampled(self, step_n: int | None) -> bool:
        """Whether this rank's phase spans of step `step_n` are exported (OTEL_TRAIN_STEP_SAMPLE
        and OTEL_TRAIN_RANKS, `wire/sampling.py`); metrics see every step."""
        return self.sampling.phases(step_n)

    def _build(self, name: str, trace_id: int, span_id: int, parent_id: int | None, parent_remote: bool,
               wire: tuple[Any, ...], attrs: dict[str, Any], events: Any, links: Any) -> tuple[Any, ...]:
        """The plain tuple `otlp.LeanEncoder` encodes (`pipeline.readable_span` makes a
        `ReadableSpan` of it where the user installed span processors). A span that ended by an
        exception, or was force-ended by a signal or an uncaught exception, has status ERROR and
        an `exception` event at its end, so the backend shows where the rank stopped."""
        if wire[W_TRUNC]:
            attrs[semconv.TRUNCATED] = True
        error = wire[W_ERROR]
        events = [(n, t, self.cleaner.clean(n, a)) for n, t, a in events] if events else None
        if error:
            attrs[semconv.ERROR_TYPE] = error
            events = [*(events or ()), (semconv.EVENT_EXCEPTION, wire[W_T1], {semconv.EXCEPTION_TYPE: error})]
        return (name, trace_id, span_id, parent_id, parent_remote, wire[W_T0], wire[W_T1], attrs, events,
                self._link_ids(links), StatusCode.ERROR.value if error else 0, error)

    def _link_ids(self, carriers: Any) -> list[tuple[int, int]]:
        """The spans `carriers` name, each once: a step consuming a batch links every sample's
        carrier, and samples of one generate call share theirs."""
        if not carriers:
            return []
        links: dict[tuple[int, int], None] = {}
        for carrier in carriers:
            ids = parse_traceparent(carrier)
            if ids is None:
                _log.warning("otel_train: link(%r) is not a W3C trace context (a dict with 'traceparent' "
                             "as made by otel_train.inject()); it is ignored.", carrier)
                continue
            links[ids] = None
        if len(links) > MAX_LINKS:
            if not self._links_capped:
                self._links_capped = True
                _log.warning("otel_train: a step linked %d producer spans; each step keeps the first %d "
                             "(OpenTelemetry's default span link limit).", len(links), MAX_LINKS)
            return list(links)[:MAX_LINKS]
        return list(links)

    def _observe_durations(self, durations: Mapping[str, list[int]]) -> None:
        """The host durations of a batch's fast regions, by name, into their metric windows."""
        for name, durations_ns in durations.items():
            if self.account is not None and name in DATA_SPANS:
                self.account.data(sum(durations_ns))
            try:
                bounds, windows = self._windows[name]
            except KeyError:
                bounds, windows = self._windows[name] = (self.metrics.span_windows(name) if self.metrics is not None
                                                         else ((), []))
            if windows:
                seconds = [ns / 1e9 for ns in durations_ns]
                buckets = Counter(map(bisect_left, repeat(bounds), seconds))
                for window in windows:
                    window.add_all(buckets, seconds)
