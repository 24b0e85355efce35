"""Span emission: wire records become real OpenTelemetry SDK spans with the trace shape of
CONVENTIONS.md §2, and feed the metrics derived from the same records.

Spans are built as `ReadableSpan`s directly with their final timestamps, ids and parents
(a pre-timed, pre-parented span needs none of the work `Tracer.start_span` does), then
handed to whatever consumes them: the SDK's span processors in thread mode, the exporter
in the exporter process. A step span is held until the next step arrives, so tags and
sibling spans (checkpoint, eval, GC) recorded after it still reach it.
"""

from __future__ import annotations

import logging
import numbers
from bisect import bisect_left
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import nullcontext
from itertools import repeat
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from otel_train import semconv
from otel_train._distributed import (MASK64, REGION_ID_MULTIPLIER, RunInfo, StepIds, parse_traceparent,
                                     region_span_id, step_span_id, trace_id_for, wire_id)
from otel_train._metrics import TrainMetrics
from otel_train._otlp import (KIND_INTERNAL, REGION_HEAD, REGION_HEAD_PARENT, REGION_PREFIXES, REGION_PREFIXES_MAX,
                              TAIL_LOCAL, LeanEncoder, region_prefix)
from otel_train._recorder import (KIND_EVENT, KIND_SPAN, KIND_STEP, KIND_TAG, W_ATTRS, W_DEV, W_ERROR,
                                  W_EVENTS, W_LINKS, W_NAME, W_PARENT, W_SEQ, W_STEP, W_STEP_SEQ, W_T0,
                                  W_T1, W_TRUNC, step_wire_attrs, to_wire)

try:  # the fast path in C (`_encode.c`); `SpanAssembler._fast_regions_python` is the fallback
    from otel_train import _encode
    _encode.bind(KIND_SPAN)
except ImportError:
    _encode = None  # type: ignore[assignment]

_log = logging.getLogger("otel_train")
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_SIBLING_TAGS = {semconv.SPAN_CHECKPOINT: semconv.TAG_CHECKPOINT, semconv.SPAN_EVAL: semconv.TAG_EVAL,
                 semconv.SPAN_GC: semconv.TAG_GC, semconv.SPAN_BENCH_LATENCY: semconv.TAG_BENCH}
_MAX_ORPHANS = 1024  # tags/events waiting for a step record that may never come
_SCALARS = (str, bool, int, float)
_CACHE_MAX = 4096  # per-step and per-attribute caches of the fast path are cleared past this
_NO_LOCK = nullcontext()
_NO_STEP_YET = object()  # `_fast_regions` before its first region: equal to no step number


class AttributeCleaner:
    """Makes user attributes valid OTel values; says once per (span, key) what it changed and why."""

    def __init__(self, value_limit: int) -> None:
        self.limit = value_limit
        self._warned: set[tuple[str, str]] = set()

    def clean(self, span_name: str, attrs: Mapping[Any, Any] | None) -> dict[str, Any]:
        if not attrs:
            return {}
        out: dict[str, Any] = {}
        for key, value in attrs.items():
            if not isinstance(key, str) or not key:
                self._warn(span_name, repr(key), "attribute keys must be non-empty strings; key made a string")
                key = str(key) or "_"
            out[key] = self._value(span_name, key, value)
        return out

    def _value(self, span_name: str, key: str, value: Any) -> Any:
        if isinstance(value, str):
            return self._cut(span_name, key, value)
        if isinstance(value, bool):
            return value
        if isinstance(value, int):
            if -(1 << 63) <= value < (1 << 63):
                return value
            self._warn(span_name, key, "integer does not fit in 64 bits; recorded as a string")
            return str(value)
        if isinstance(value, float):
            return value
        if isinstance(value, numbers.Integral):
            return int(value)
        if isinstance(value, numbers.Real):
            return float(value)
        if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
            items = list(value)
            kinds = {type(item) for item in items}
            if len(kinds) <= 1 and kinds <= set(_SCALARS):
                return tuple(self._cut(span_name, key, item) if isinstance(item, str) else item for item in items)
            self._warn(span_name, key, "a list attribute must hold one type of str, bool, int or float; "
                                       "recorded as a list of strings")
            return tuple(self._cut(span_name, key, _describe(item)) for item in items)
        self._warn(span_name, key, f"type {type(value).__name__} is not allowed (str, bool, int, float or "
                                   "a list of one of them); recorded as a string")
        return self._cut(span_name, key, _describe(value))

    def _cut(self, span_name: str, key: str, text: str) -> str:
        if len(text) <= self.limit:
            return text
        self._warn(span_name, key, f"value of {len(text)} characters cut to {self.limit} "
                                   "(OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT)")
        return text[: self.limit]

    def _warn(self, span_name: str, key: str, why: str) -> None:
        if (span_name, key) in self._warned:
            return
        self._warned.add((span_name, key))
        _log.warning("otel_train: span %r attribute %r: %s.", span_name, key, why)


def _add_device(attrs: dict[str, Any], dev: Mapping[str, Any]) -> None:
    """Device attributes from the wire's device dict, minus its private ("_") keys."""
    for key, value in dev.items():
        if not key.startswith("_"):
            attrs[key] = value


def _describe(value: Any) -> str:
    # A tensor's str() would copy it to the host (a device sync): describe it instead.
    if type(value).__name__ in ("Tensor", "Parameter") and hasattr(value, "shape"):
        return f"<tensor shape={tuple(value.shape)} dtype={value.dtype} device={value.device}>"
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    return str(value)


class _HeldStep:
    """A step waiting for the next one (`SpanAssembler._on_step`). `lean`: the encoded
    `train.epoch` / `train.micro_batches` fields of a usual step (`SpanAssembler._lean_step`),
    which is emitted without cleaning or re-encoding those while nothing is added to it."""

    __slots__ = ("wire", "tags", "events", "time_s", "lean")

    def __init__(self, wire: tuple[Any, ...], time_s: float, lean: bytes | None = None) -> None:
        self.wire = wire
        self.tags: list[str] = list(wire[W_ATTRS].pop(semconv.TRAIN_STEP_TAGS, ()))
        self.events: list[tuple[str, int, Any]] = list(wire[W_EVENTS] or ())
        self.time_s = time_s
        self.lean = lean


class SpanAssembler:
    """Records in, spans out through `emit`; metrics observed on the way.

    What comes out is a `ReadableSpan`, or with an `encoder` (the lean OTLP/gRPC path) a plain
    tuple the encoder encodes at export, or, for the usual region, its encoded bytes already:
    `feed_raw` turns a hot-path tuple with no exception, event or device time straight into
    OTLP bytes and its metric observation in one pass (`_fast_region`), which is most of
    what this process does for a training loop.
    """

    def __init__(self, run: RunInfo, salt: int, resource: Resource, cleaner: AttributeCleaner,
                 emit: Callable[[list[Any]], None], step_sample: int = 1, metrics: TrainMetrics | None = None,
                 version: str = "", encoder: LeanEncoder | None = None) -> None:
        self.run = run
        self.salt = salt
        self.resource = resource
        self.cleaner = cleaner
        self.emit = emit
        self.step_sample = step_sample
        self.metrics = metrics
        self.scope = InstrumentationScope(semconv.SCOPE_NAME, version)
        self.encoder = encoder  # if set: plain tuples (or bytes) for it, not ReadableSpans
        self.fast = encoder is not None  # `feed_raw` may encode usual records directly (tests turn it off)
        self.c_encode = True  # `_fast_regions` in C where `_encode` was built (tests compare it with Python)
        self.lean_steps = True  # usual step records by `_lean_step` in fast mode (tests turn it off)
        self._windows: dict[str, tuple[Sequence[float], list[Any]]] = {}
        self._attr_kvs: dict[tuple[str, Any, type, Any], bytes] = {}
        self._fast_bodies: dict[Any, bytes] = {}  # `_fast_body`'s: name field + user attribute fields
        self._fast_steps: dict[int | None, tuple[bytes, int | None, bytes, bool, int | None]] = {}
        self._lean_kvs: dict[tuple[int | None, int], bytes] = {}  # `_lean_step`'s, by (epoch, micro-batches)
        self._held: dict[int, _HeldStep] = {}
        self._orphans: dict[int, list[tuple[int, Any]]] = {}
        self._siblings: deque[tuple[int, int]] = deque(maxlen=256)
        self._prev_step_end: int | None = None
        self._trace_ids: dict[int | None, int] = {}
        self._step_ids: dict[int, int] = {}
        self._ids = StepIds(run.run_id, run.rank, run.restart)
        self.spans_built = 0

    # -- public ------------------------------------------------------------------------
    def feed(self, records: Iterable[tuple[Any, ...]]) -> None:
        """Wire tuples (`_recorder.to_wire`)."""
        out: list[Any] = []
        for wire in records:
            self._dispatch(wire, out)
        self._emit_all(out)

    def feed_raw(self, records: Iterable[tuple[Any, ...]], offset: int) -> None:
        """Hot-path tuples as the recorder appended them, with the perf-to-wall `offset`."""
        out: list[Any] = []
        # One lock for the batch: the fast path adds to metric windows itself.
        with self.metrics.lock if self.metrics is not None else _NO_LOCK:
            self._dispatch_records(self._fast_regions(records, offset, out) if self.fast else records, offset, out)
        self._emit_all(out)

    def can_feed_packed(self) -> bool:
        """Whether `feed_packed` can take a packed drain (the C fast path is built and on)."""
        return self.fast and self.c_encode and _encode is not None

    def feed_packed(self, slots: bytes, side: list[Any], strings: list[str], offset: int) -> int:
        """`feed_raw` for a packed drain (`RecorderBase.drain_packed`'s slots and side records,
        `strings` the recorder's string table so far) with no tuple made for a usual region:
        `_encode.packed_regions` encodes those where they lie. Only where `can_feed_packed()`.
        Returns the number of records the drain held."""
        out: list[Any] = []
        rest: list[tuple[Any, ...]] = []
        durations: dict[str, list[int]] = {}
        with self.metrics.lock if self.metrics is not None else _NO_LOCK:
            count: int = _encode.packed_regions(slots, side, strings, offset, self.salt, self._fast_bodies,
                                                self._fast_steps, self._fast_body, self._fast_step, durations, out, rest)
            self._observe_all(durations)
            self._dispatch_records(rest, offset, out)
        self._emit_all(out)
        return count

    def flush(self) -> None:
        """Emit every held step (at shutdown, or when a caller must see everything now)."""
        out: list[ReadableSpan] = []
        for seq in sorted(self._held):
            self._emit_step(self._held.pop(seq), out)
        self._emit_all(out)

    def _emit_all(self, out: list[Any]) -> None:
        if out:
            self.spans_built += len(out)
            self.emit(out)

    # -- records -----------------------------------------------------------------------
    def _dispatch_records(self, records: Iterable[Any], offset: int, out: list[Any]) -> None:
        """Hot-path records the fast regions left: a usual step record the lean way, the rest as wire tuples."""
        lean = self.fast and self.lean_steps
        for record in records:
            if not (lean and type(record) is tuple and record[0] == KIND_STEP and self._lean_step(record, offset, out)):
                self._dispatch(to_wire(record, offset), out)

    def _dispatch(self, wire: tuple[Any, ...], out: list[Any]) -> None:
        kind = wire[0]
        if kind == KIND_SPAN:
            self._on_span(wire, out)
        elif kind == KIND_STEP:
            self._on_step(wire, out)
        else:
            self._on_step_note(wire)

    def _fast_regions(self, records: Iterable[tuple[Any, ...]], offset: int, out: list[Any]) -> list[tuple[Any, ...]]:
        """The usual regions among `records` straight to OTLP bytes (into `out`) and into their
        metric windows; returns the other records, in order, for the general path.

        One loop with `LeanEncoder.region` and `region_wire_id` written out, and the metric
        windows filled once per span name for the batch: this is most of what the exporter
        process does for a training loop, and every call here is paid per span. A span's name
        and user attribute fields come as one cached `body` (per name, or per name and its
        one attribute); the step's fields are looked up once per run of its regions. The loop is
        C (`_encode.regions`) where that was built, `_fast_regions_python` otherwise."""
        rest: list[tuple[Any, ...]] = []
        durations: dict[str, list[int]] = {}
        loop = _encode.regions if _encode is not None and self.c_encode else self._fast_regions_python
        loop(records, offset, self.salt, self._fast_bodies, self._fast_steps, self._fast_body, self._fast_step,
             durations, out, rest)
        self._observe_all(durations)
        return rest

    def _observe_all(self, durations: dict[str, list[int]]) -> None:
        for name, spans in durations.items():
            self._observe_regions(name, spans)

    @staticmethod
    def _fast_regions_python(records: Iterable[tuple[Any, ...]], offset: int, salt: int, bodies: dict[Any, bytes],
                             steps: dict[Any, tuple[Any, ...]], make_body: Callable[[str, Any], bytes | None],
                             make_step: Callable[[Any], tuple[Any, ...]], durations: dict[str, list[int]],
                             out: list[Any], rest: list[tuple[Any, ...]]) -> None:
        """`_encode.regions` in Python, the same arguments: the usual regions encoded into `out`,
        their host durations into `durations`, the other records into `rest`; cache misses
        call `make_body` (`_fast_body`) and `make_step` (`_fast_step`)."""
        keep, emit, join = rest.append, out.append, b"".join
        pack, pack_parent = REGION_HEAD.pack, REGION_HEAD_PARENT.pack
        head_len, head_parent_len = REGION_HEAD.size + len(TAIL_LOCAL), REGION_HEAD_PARENT.size + len(TAIL_LOCAL)
        last_step: Any = _NO_STEP_YET
        trace_field, step_wire, step_kv, sampled = b"", None, b"", True
        for record in records:
            if record[0] != KIND_SPAN or record[8] is not None or record[9] is not None:
                keep(record)  # a step or a note, an exception, an event
                continue
            _, name, seq, parent_seq, (step_n, step_seq), t0, t1, attrs, _, _ = record
            if not attrs:
                body = bodies.get(name)
            elif len(attrs) == 1:  # the usual user attribute
                ((key, value),) = attrs.items()
                try:
                    body = bodies.get((name, key, type(value), value))
                except TypeError:  # unhashable: a list value
                    keep(record)
                    continue
            else:
                body = None
            if body is None:
                body = make_body(name, attrs)
                if body is None:  # a checkpoint, eval or GC sibling, or an unusual attribute value
                    keep(record)
                    continue
            spans = durations.get(name)
            if spans is None:
                spans = durations[name] = []
            spans.append(t1 - t0)
            if step_n != last_step:
                last_step = step_n
                trace_field, step_wire, step_kv, sampled, _ = steps.get(step_n) or make_step(step_n)
            if not sampled:
                continue
            t0 += offset
            t1 += offset
            span_wire = ((seq * REGION_ID_MULTIPLIER) ^ salt) & MASK64 or 1
            if parent_seq is not None:
                parent_wire = ((parent_seq * REGION_ID_MULTIPLIER) ^ salt) & MASK64 or 1
            elif step_seq is not None:
                parent_wire = step_wire
            else:
                parent_wire = None
            if parent_wire:
                head = pack_parent(trace_field, b"\x12\x08", span_wire, b"\x22\x08", parent_wire, KIND_INTERNAL,
                                   0x39, t0, 0x41, t1)
                length = head_parent_len + len(body) + len(step_kv)
            else:
                head = pack(trace_field, b"\x12\x08", span_wire, KIND_INTERNAL, 0x39, t0, 0x41, t1)
                length = head_len + len(body) + len(step_kv)
            emit(join((REGION_PREFIXES[length] if length < REGION_PREFIXES_MAX else region_prefix(length),
                       head, body, step_kv, TAIL_LOCAL)))

    def _fast_body(self, name: str, attrs: Mapping[Any, Any] | None) -> bytes | None:
        """A fast region's name field and user attribute fields, cached in `_fast_bodies` when
        it has none or one attribute; None sends the record the general way."""
        if name in _SIBLING_TAGS:
            return None
        bodies = self._fast_bodies
        if len(bodies) >= _CACHE_MAX:
            bodies.clear()
        name_field = self.encoder.name_field(name)  # type: ignore[union-attr]
        if not attrs:
            bodies[name] = name_field
            return name_field
        user = self._fast_attrs(name, attrs)
        if user is None:
            return None
        body = name_field + user
        if len(attrs) == 1:  # hashable: `_fast_attrs` looked it up
            ((key, value),) = attrs.items()
            bodies[(name, key, type(value), value)] = body
        return body

    def _observe_regions(self, name: str, durations_ns: list[int]) -> None:
        """The host durations of a batch's fast regions of one name into its metric windows."""
        try:
            bounds, windows = self._windows[name]
        except KeyError:
            bounds, windows = self._windows_for(name)
        if windows:
            seconds = [ns / 1e9 for ns in durations_ns]
            buckets = Counter(map(bisect_left, repeat(bounds), seconds))
            for window in windows:
                window.add_all(buckets, seconds)

    def _fast_step(self, step_n: int | None) -> tuple[bytes, int | None, bytes, bool, int | None]:
        """What the fast path needs of step `step_n`: its trace id field, the step span's id
        (wire form), the encoded `train.step` attribute, whether the step is sampled, and the
        step span's parent id (rank 0's step span, wire form; None on rank 0)."""
        if len(self._fast_steps) >= _CACHE_MAX:
            self._fast_steps.clear()
        if step_n is None:
            found: tuple[bytes, int | None, bytes, bool, int | None] = (
                LeanEncoder.trace_field(self._trace_id(None)), None, b"", True, None)
        else:
            root = None if self.run.rank == 0 else self._root_step_id(step_n)
            root_wire = wire_id(root) if root else None
            trace, span = self._ids.both(step_n) if type(step_n) is int else (None, None)
            if trace is not None and span is not None:  # the usual step: the ids' bytes as they go on the wire
                found = (b"\x0a\x10" + trace, int.from_bytes(span, "little"), self._step_number(step_n),
                         self.step_sample == 1 or step_n % self.step_sample == 0, root_wire)
            else:
                found = (LeanEncoder.trace_field(self._trace_id(step_n)), wire_id(self._step_span_id(step_n)),
                         self._step_number(step_n), self._sampled(step_n), root_wire)
        self._fast_steps[step_n] = found
        return found

    def _step_number(self, step_n: Any) -> bytes:
        """The encoded `train.step` attribute."""
        if type(step_n) is int and -(1 << 63) <= step_n < (1 << 63):
            return self.encoder.int_attribute(semconv.TRAIN_STEP, step_n)  # type: ignore[union-attr]
        return self.encoder.attributes(self.cleaner.clean(semconv.SPAN_STEP, {semconv.TRAIN_STEP: step_n}))  # type: ignore[union-attr]

    def _step_attributes(self, attrs: Mapping[str, Any], step_kv: bytes) -> bytes:
        encoder = self.encoder
        kv = encoder.kv  # type: ignore[union-attr]
        parts = []
        for key, value in attrs.items():
            if key == semconv.TRAIN_STEP:
                parts.append(step_kv)
            elif key == semconv.TRAIN_STEP_TIME_S:
                parts.append(encoder.float_attribute(key, value))  # type: ignore[union-attr]
            else:
                parts.append(kv(key, value))
        return b"".join(parts)

    def _fast_attrs(self, name: str, attrs: Mapping[Any, Any]) -> bytes | None:
        """User attributes as encoded `KeyValue` fields, cached (`_attr_kvs`) per span name,
        key, type and value; None sends the record the general way (an unhashable or unusual
        value)."""
        cache = self._attr_kvs
        parts = []
        try:
            for key, value in attrs.items():
                encoded = cache.get((name, key, type(value), value))
                if encoded is None:
                    encoded = self._attr_kv(name, key, value)
                    if encoded is None:
                        return None
                parts.append(encoded)
        except TypeError:  # unhashable: a list value
            return None
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _attr_kv(self, name: str, key: Any, value: Any) -> bytes | None:
        if type(value) not in _SCALARS or not isinstance(key, str):
            return None  # the general path converts it and says so
        if len(self._attr_kvs) >= _CACHE_MAX:
            self._attr_kvs.clear()
        encoded = self.encoder.attributes(self.cleaner.clean(name, {key: value}))  # type: ignore[union-attr]
        self._attr_kvs[(name, key, type(value), value)] = encoded
        return encoded

    def _windows_for(self, name: str) -> tuple[Sequence[float], list[Any]]:
        found = self.metrics.span_windows(name) if self.metrics is not None else ((), [])
        self._windows[name] = found
        return found

    def _on_span(self, wire: tuple[Any, ...], out: list[ReadableSpan]) -> None:
        name, step_n, step_seq = wire[W_NAME], wire[W_STEP], wire[W_STEP_SEQ]
        attrs = self.cleaner.clean(name, wire[W_ATTRS])
        dev = wire[W_DEV]
        if dev:
            _add_device(attrs, dev)
        if step_n is not None:
            attrs[semconv.TRAIN_STEP] = step_n
        sibling_tag = _SIBLING_TAGS.get(name)
        parent_seq = wire[W_PARENT]
        if sibling_tag is not None:
            # Checkpoint / eval / GC: never inside a step; the step they belong to is tagged.
            # With device time, the sibling holds the timeline from when the device started it
            # (before that the device was finishing the step's work) until both host and device
            # are done with it (async eval work may outlive its host span).
            s0, s1 = wire[W_T0], wire[W_T1]
            if dev:
                s0 += max(0, dev.get(semconv.WIRE_DEV_START_NS, 0))
                s1 += max(0, dev.get(semconv.WIRE_DEV_END_NS, 0))
            self._siblings.append((s0, s1))
            if step_n is not None:
                self._add_tag(step_n, step_seq, sibling_tag)
        if parent_seq is not None:
            parent_id = region_span_id(self.salt, parent_seq)
        elif step_seq is not None and sibling_tag is None:
            parent_id = self._step_span_id(step_n)
        else:
            parent_id = None
        self._observe_span(name, wire, attrs)
        if not self._sampled(step_n):
            return
        out.append(self._build(name, self._trace_id(step_n), region_span_id(self.salt, wire[W_SEQ]),
                               parent_id, False, wire, attrs, wire[W_EVENTS], None))

    def _lean_step(self, record: tuple[Any, ...], offset: int, out: list[Any]) -> bool:
        """`_on_step` for a usual step record as the recorder appended it (`_recorder`'s KIND_STEP
        tuple): no user attributes, tags, events, links or exception, and int step number, epoch
        and micro-batch count. It is held (`_hold`) with its epoch and micro-batch fields encoded
        already, and emitted from them unless a note joins it (`_emit_step`). False, with
        nothing done: not such a record, the general way."""
        _, seq, n, t0, t1, attrs, epoch, micro_batches, tags, events, links, exc = record
        if (attrs or tags or events or links or exc is not None or type(n) is not int
                or type(micro_batches) is not int or (epoch is not None and type(epoch) is not int)):
            return False
        wire_attrs = step_wire_attrs(None, epoch, micro_batches)
        lean = self._lean_kvs.get((epoch, micro_batches))
        if lean is None:
            lean = self._lean_fields(epoch, micro_batches, wire_attrs)
            if lean is None:
                return False
        t1 += offset
        self._hold((KIND_STEP, semconv.SPAN_STEP, seq, None, n, seq, t0 + offset, t1, wire_attrs, None, None, None,
                    False, None), t1, out, lean)
        return True

    def _lean_fields(self, epoch: int | None, micro_batches: int, attrs: dict[str, Any]) -> bytes | None:
        """The encoded epoch and micro-batch fields (`attrs`) `_lean_step` holds a step with
        (cached), None where the cleaner would change a value (past 64 bits)."""
        if any(not -(1 << 63) <= value < (1 << 63) for value in attrs.values()):
            return None
        if len(self._lean_kvs) >= _CACHE_MAX:
            self._lean_kvs.clear()
        lean = self._lean_kvs[(epoch, micro_batches)] = self.encoder.attributes(attrs)  # type: ignore[union-attr]
        return lean

    def _on_step(self, wire: tuple[Any, ...], out: list[ReadableSpan]) -> None:
        t1 = wire[W_T1]
        # The step's boundary is when the device finished its last work (its end event, mapped
        # to the host clock), not when the host finished dispatching it: under asynchronous
        # dispatch the host runs ahead (MaxText #4270). Without device time (CPU, or no event
        # to spare), the host end is the boundary, which on CPU is the same thing.
        dev = wire[W_DEV]
        self._hold(wire, t1 + dev[semconv.WIRE_DEV_END_NS] if dev and semconv.WIRE_DEV_END_NS in dev else t1, out)

    def _hold(self, wire: tuple[Any, ...], end: int, out: list[Any], lean: bytes | None = None) -> None:
        """Hold step `wire`, whose boundary is `end`, until the next step: its own time runs from
        the previous step's boundary, less its siblings' time; the notes that came before it
        join it; the steps held before it are emitted."""
        prev = self._prev_step_end
        start = prev if prev is not None and prev < end else wire[W_T0]
        own_ns = (end - start) - self._sibling_ns(start, end)
        self._prev_step_end = end
        held = _HeldStep(wire, max(own_ns, 0) / 1e9, lean)
        seq = wire[W_SEQ]
        for kind, payload in self._orphans.pop(seq, ()):
            (held.tags if kind == KIND_TAG else held.events).append(payload)
        if self._held:
            for earlier in [s for s in self._held if s < seq]:
                self._emit_step(self._held.pop(earlier), out)
        self._held[seq] = held

    def _on_step_note(self, wire: tuple[Any, ...]) -> None:
        if wire[0] == KIND_TAG:
            self._add_tag(wire[W_STEP], wire[W_STEP_SEQ], wire[W_NAME])
        elif wire[0] == KIND_EVENT:
            payload = (wire[W_NAME], wire[W_T0], wire[W_ATTRS])
            held = self._held.get(wire[W_STEP_SEQ])
            if held is not None:
                held.events.append(payload)
            else:
                self._orphan(wire[W_STEP_SEQ], KIND_EVENT, payload)

    def _add_tag(self, step_n: int, step_seq: int | None, tag: str) -> None:
        held = self._held.get(step_seq) if step_seq is not None else None
        if held is None:
            held = next((h for h in self._held.values() if h.wire[W_STEP] == step_n), None)
        if held is not None:
            held.tags.append(tag)
        elif step_seq is not None:
            self._orphan(step_seq, KIND_TAG, tag)

    def _orphan(self, step_seq: int, kind: int, payload: Any) -> None:
        if len(self._orphans) >= _MAX_ORPHANS and step_seq not in self._orphans:
            self._orphans.pop(next(iter(self._orphans)))
        self._orphans.setdefault(step_seq, []).append((kind, payload))

    def _emit_step(self, held: _HeldStep, out: list[ReadableSpan]) -> None:
        if held.lean is not None and not held.tags and not held.events:
            self._emit_lean_step(held, out)
            return
        wire = held.wire
        step_n = wire[W_STEP]
        attrs = self.cleaner.clean(semconv.SPAN_STEP, wire[W_ATTRS])
        if wire[W_DEV]:
            _add_device(attrs, wire[W_DEV])
        attrs[semconv.TRAIN_STEP] = step_n
        attrs[semconv.TRAIN_STEP_TIME_S] = held.time_s
        if held.tags:
            attrs[semconv.TRAIN_STEP_TAGS] = tuple(sorted(set(held.tags)))
        self._observe_step(held.time_s, attrs)
        if not self._sampled(step_n):
            return
        if self.fast and not (held.events or wire[W_LINKS] or wire[W_ERROR] or wire[W_TRUNC]):
            trace_field, step_wire, step_kv, _, root_wire = self._fast_steps.get(step_n) or self._fast_step(step_n)
            out.append(self.encoder.region(semconv.SPAN_STEP, trace_field, step_wire, root_wire,  # type: ignore[union-attr]
                                           wire[W_T0], wire[W_T1], self._step_attributes(attrs, step_kv),
                                           remote=root_wire is not None))
            return
        parent = self._root_step_id(step_n)
        out.append(self._build(semconv.SPAN_STEP, self._trace_id(step_n), self._step_span_id(step_n), parent,
                               parent is not None, wire, attrs, held.events, wire[W_LINKS]))

    def _emit_lean_step(self, held: _HeldStep, out: list[Any]) -> None:
        """`_emit_step` for a step `_lean_step` held that nothing was added to since: the same
        metric and the same bytes, from its encoded fields."""
        wire = held.wire
        step_n, time_s = wire[W_STEP], held.time_s
        if self.metrics is not None:
            self.metrics.observe_step_time(time_s)
        if not self._sampled(step_n):
            return
        trace_field, step_wire, step_kv, _, root_wire = self._fast_steps.get(step_n) or self._fast_step(step_n)
        encoder = self.encoder
        out.append(encoder.region(semconv.SPAN_STEP, trace_field, step_wire, root_wire,  # type: ignore[union-attr]
                                  wire[W_T0], wire[W_T1],
                                  held.lean + step_kv + encoder.float_attribute(semconv.TRAIN_STEP_TIME_S, time_s),  # type: ignore[union-attr,operator]
                                  remote=root_wire is not None))

    # -- helpers -----------------------------------------------------------------------
    def _sampled(self, step_n: int | None) -> bool:
        return step_n is None or self.step_sample == 1 or step_n % self.step_sample == 0

    def _sibling_ns(self, start: int, end: int) -> int:
        """The time within [start, end] that checkpoint, eval and GC spans took. A sibling that
        ended by `start` is forgotten: steps arrive in order, so no later step can overlap it
        (kept, a long run's 256 of them were summed again at every step)."""
        siblings = self._siblings
        if not siblings:
            return 0
        if siblings[0][1] <= start:
            live = [(s0, s1) for s0, s1 in siblings if s1 > start]
            siblings.clear()
            siblings.extend(live)
        return sum(max(0, min(s1, end) - max(s0, start)) for s0, s1 in siblings)

    def _step_span_id(self, step_n: int) -> int:
        cached = self._step_ids.get(step_n)
        if cached is None:
            if len(self._step_ids) > _CACHE_MAX:
                self._step_ids.clear()
            run = self.run
            cached = self._step_ids[step_n] = step_span_id(run.run_id, step_n, run.rank, run.restart)
        return cached

    def _root_step_id(self, step_n: int) -> int | None:
        """The parent of this rank's step span: rank 0's step span (None on rank 0)."""
        run = self.run
        return None if run.rank == 0 else step_span_id(run.run_id, step_n, 0, run.restart)

    def _trace_id(self, step_n: int | None) -> int:
        trace_id = self._trace_ids.get(step_n)
        if trace_id is None:
            if len(self._trace_ids) > _CACHE_MAX:
                self._trace_ids.clear()
            trace_id = self._trace_ids[step_n] = trace_id_for(self.run.run_id, step_n)
        return trace_id

    def _build(self, name: str, trace_id: int, span_id: int, parent_id: int | None, parent_remote: bool,
               wire: tuple[Any, ...], attrs: dict[str, Any], events: Any, links: Any) -> Any:
        """A `ReadableSpan`, or in lean mode the plain tuple `_otlp.LeanEncoder` encodes."""
        if wire[W_TRUNC]:
            attrs[semconv.TRUNCATED] = True
        error = wire[W_ERROR]
        if error:
            attrs[semconv.ERROR_TYPE] = error
        link_ids = self._link_ids(links)
        if self.encoder is not None:
            return (name, trace_id, span_id, parent_id, parent_remote, wire[W_T0], wire[W_T1], attrs,
                    [(n, t, self.cleaner.clean(n, a)) for n, t, a in events] if events else None,
                    link_ids, StatusCode.ERROR.value if error else 0, error)
        return ReadableSpan(
            name=name,
            context=SpanContext(trace_id, span_id, False, _SAMPLED),
            parent=SpanContext(trace_id, parent_id, parent_remote, _SAMPLED) if parent_id else None,
            resource=self.resource,
            attributes=attrs,
            events=[Event(n, self.cleaner.clean(n, a), t) for n, t, a in events] if events else (),
            links=[Link(SpanContext(t, s, True, _SAMPLED)) for t, s in link_ids],
            kind=SpanKind.INTERNAL,
            status=Status(StatusCode.ERROR, error) if error else Status(StatusCode.UNSET),
            start_time=wire[W_T0],
            end_time=wire[W_T1],
            instrumentation_scope=self.scope,
        )

    def _link_ids(self, carriers: Any) -> list[tuple[int, int]]:
        if not carriers:
            return []
        links = []
        for carrier in carriers:
            ids = parse_traceparent(carrier)
            if ids is None:
                _log.warning("otel_train: link(%r) is not a W3C trace context (a dict with 'traceparent' "
                             "as made by otel_train.inject()); it is ignored.", carrier)
                continue
            links.append(ids)
        return links

    def _observe_span(self, name: str, wire: tuple[Any, ...], attrs: Mapping[str, Any]) -> None:
        if self.metrics is not None:
            self.metrics.observe(name, (wire[W_T1] - wire[W_T0]) / 1e9, attrs)

    def _observe_step(self, time_s: float, attrs: Mapping[str, Any]) -> None:
        if self.metrics is not None:
            self.metrics.observe_step(time_s, attrs)
