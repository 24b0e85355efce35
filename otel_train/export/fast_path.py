"""The fast path: the usual region and step straight to OTLP bytes, with no span object between.

A training run repeats itself: the same names, the same one or two attributes, one step after
another. So a usual record (a region with no exception, event or device time; a step with no
attributes but the batch sizes detection counts, no tags, events, links or exception) is encoded
from cached pieces: a span's name
and attribute fields as one `body` (per name, or per name and its one attribute), a step's
trace id, span id and `train.step` fields once per step. Everything else goes the general way
(`spans.SpanAssembler`), which builds the same message from cleaned attributes.

The region loop is Python, the one implementation (a C twin, `_encode.c`, saved ~0.7 µs of
exporter CPU a span off the training thread and was removed by issue 52); a packed drain reaches
it unpacked (`pipeline.ExportPipeline.feed_packed`). `tests/test_fast_path.py` holds its bytes,
durations and leftover records to the general path's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from otel_train import semconv
from otel_train.export.attributes import SCALARS, AttributeCleaner
from otel_train.export.pipeline_metrics import PIPELINE_SPANS
from otel_train.export.otlp import (KIND_INTERNAL, REGION_HEAD, REGION_HEAD_PARENT, REGION_PREFIXES,
                                    REGION_PREFIXES_MAX, TAIL_LOCAL, LeanEncoder, region_prefix)
from otel_train.export.span_ids import SpanIds
from otel_train.export.step_timeline import SIBLING_TAGS, HeldStep
from otel_train.wire.ids import region_wire_id, wire_id
from otel_train.wire.schema import (KIND_SPAN, KIND_STEP, REC_ATTRS, REC_EVENTS, REC_EXC, REC_KIND, REC_NAME,
                                    REC_PARENT, REC_SEQ, REC_STEP, REC_T0, REC_T1, W_STEP, W_T0, W_T1,
                                    step_wire_attrs)

#: Names the general path takes between steps only (no parent, no step seq): `train.other`
#: there is parented by rank 0's step (`SpanAssembler._on_span`); inside a step (its usual
#: place, several a step) it is a usual region.
BETWEEN_GENERAL = frozenset({semconv.SPAN_OTHER})

#: Names the general path always takes: step siblings (their step gets a tag), and the
#: benchmark's timed batches and the pipeline's spans, whose metrics need their attributes
#: (`metrics.TrainMetrics.observe`, `pipeline_metrics`).
_GENERAL_ONLY = (frozenset(SIBLING_TAGS) | frozenset(semconv.BENCH_TIMED_SPANS) | frozenset(PIPELINE_SPANS))
_CACHE_MAX = 4096  # bodies, steps and attribute fields remembered; each cache is cleared past this
#: The only step attributes a lean step may carry: what automatic detection counts from the
#: batches' shape (`detect.batch_size`), the same most steps of a run.
_SIZES = frozenset({semconv.TRAIN_SAMPLES, semconv.TRAIN_TOKENS})
_UNCOVERED = semconv.TRAIN_STEP_UNCOVERED_S
_NO_STEP_YET = object()  # `regions` before its first region: equal to no step number

#: What the fast path keeps of a step: its trace id field, the step span's id (wire form), the
#: encoded `train.step` attribute, whether this rank's phase spans of the step are sampled
#: (`wire/sampling.py`), and the step span's parent id
#: (rank 0's step span, wire form; None on rank 0).
StepFields = tuple[bytes, int | None, bytes, bool, int | None]


class FastPath:
    """Encodes usual records for one run and rank, caching what repeats."""

    def __init__(self, encoder: LeanEncoder, cleaner: AttributeCleaner, ids: SpanIds,
                 sampled: Callable[[int | None], bool]) -> None:
        self.encoder = encoder
        self.cleaner = cleaner
        self.ids = ids
        self.sampled = sampled
        self.bodies: dict[Any, bytes] = {}  # `body`'s: name field + user attribute fields
        self.steps: dict[int | None, StepFields] = {}  # `step`'s
        self._attr_kvs: dict[tuple[str, Any, type, Any], bytes] = {}
        # `lean_step`'s, by (epoch, micro-batches, batch sizes as (key, value) pairs in order)
        self._lean_kvs: dict[tuple[Any, ...], bytes] = {}

    # -- regions -----------------------------------------------------------------------
    def regions(self, records: Iterable[tuple[Any, ...]], offset: int, out: list[Any],
                durations: dict[str, list[int]]) -> list[tuple[Any, ...]]:
        """The usual regions among `records` (hot-path tuples, `offset` their perf-to-wall
        offset) straight to OTLP bytes into `out`, their host durations into `durations` (name
        -> ns); returns the other records, in order, for the general path. Cache misses call
        `body` and `step`. `LeanEncoder.region` written out (every line here is paid per span);
        the span ids are `wire.ids.region_wire_id`'s."""
        rest: list[tuple[Any, ...]] = []
        salt, bodies, steps, make_body, make_step = self.ids.salt, self.bodies, self.steps, self.body, self.step
        keep, emit, join = rest.append, out.append, b"".join
        pack, pack_parent = REGION_HEAD.pack, REGION_HEAD_PARENT.pack
        head_len, head_parent_len = REGION_HEAD.size + len(TAIL_LOCAL), REGION_HEAD_PARENT.size + len(TAIL_LOCAL)
        last_step: Any = _NO_STEP_YET
        trace_field, step_wire, step_kv, sampled = b"", None, b"", True
        for record in records:
            if record[REC_KIND] != KIND_SPAN or record[REC_EXC] is not None or record[REC_EVENTS] is not None:
                keep(record)  # a step or a note, an exception, an event
                continue
            name, seq, parent_seq, t0, t1, attrs = (record[REC_NAME], record[REC_SEQ], record[REC_PARENT],
                                                    record[REC_T0], record[REC_T1], record[REC_ATTRS])
            step_n, step_seq = record[REC_STEP]
            if parent_seq is None and step_seq is None and name in BETWEEN_GENERAL:
                keep(record)  # parented by rank 0's step: the general path
                continue
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
            span_wire = region_wire_id(salt, seq)
            if parent_seq is not None:
                parent_wire = region_wire_id(salt, parent_seq)
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
        return rest

    def body(self, name: str, attrs: Mapping[Any, Any] | None) -> bytes | None:
        """A fast region's name field and user attribute fields, cached in `bodies` when it has
        none or one attribute; None sends the record the general way."""
        if name in _GENERAL_ONLY:  # a sibling (its step gets a tag) or metrics that need attributes
            return None
        bodies = self.bodies
        if len(bodies) >= _CACHE_MAX:
            bodies.clear()
        name_field = self.encoder.name_field(name)
        if not attrs:
            bodies[name] = name_field
            return name_field
        user = self._attrs(name, attrs)
        if user is None:
            return None
        body = name_field + user
        if len(attrs) == 1:  # hashable: `_attrs` looked it up
            ((key, value),) = attrs.items()
            bodies[(name, key, type(value), value)] = body
        return body

    def _attrs(self, name: str, attrs: Mapping[Any, Any]) -> bytes | None:
        """User attributes as encoded `KeyValue` fields, cached per span name, key, type and
        value; None sends the record the general way (an unhashable or unusual value)."""
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
        if not isinstance(key, str) or type(value) not in SCALARS and not _str_tuple(value):
            return None  # the general path converts it and says so
        if len(self._attr_kvs) >= _CACHE_MAX:
            self._attr_kvs.clear()
        encoded = self.encoder.attributes(self.cleaner.clean(name, {key: value}))
        self._attr_kvs[(name, key, type(value), value)] = encoded
        return encoded

    # -- steps -------------------------------------------------------------------------
    def step(self, step_n: int | None) -> StepFields:
        """What the fast path needs of step `step_n` (`StepFields`), cached in `steps`."""
        if len(self.steps) >= _CACHE_MAX:
            self.steps.clear()
        ids = self.ids
        if step_n is None:
            found: StepFields = (LeanEncoder.trace_field(ids.trace(None)), None, b"", self.sampled(None), None)
        else:
            root = None if ids.run.rank == 0 else ids.root_step(step_n)
            root_wire = wire_id(root) if root else None
            trace, span = ids.step_bytes.both(step_n) if type(step_n) is int else (None, None)
            if trace is not None and span is not None:  # the usual step: the ids' bytes as they go on the wire
                found = (b"\x0a\x10" + trace, int.from_bytes(span, "little"), self._step_number(step_n),
                         self.sampled(step_n), root_wire)
            else:
                found = (LeanEncoder.trace_field(ids.trace(step_n)), wire_id(ids.step_span(step_n)),
                         self._step_number(step_n), self.sampled(step_n), root_wire)
        self.steps[step_n] = found
        return found

    def _step_number(self, step_n: Any) -> bytes:
        """The encoded `train.step` attribute."""
        if type(step_n) is int and -(1 << 63) <= step_n < (1 << 63):
            return self.encoder.int_attribute(semconv.TRAIN_STEP, step_n)
        return self.encoder.attributes(self.cleaner.clean(semconv.SPAN_STEP, {semconv.TRAIN_STEP: step_n}))

    def lean_step(self, record: tuple[Any, ...], offset: int) -> tuple[tuple[Any, ...], int, bytes] | None:
        """A usual step record as the recorder appended it (the hot path's KIND_STEP tuple): no
        attributes but int `train.samples` / `train.tokens` and a float `train.step.uncovered_s`
        (what detection leaves on every step), no tags, events, links or exception, and int step
        number, epoch and micro-batch count. Returns its wire tuple, its end (wall ns) and its
        attribute fields encoded already (cached but for `uncovered_s`), in the order the
        general path writes them, to be held with them (`HeldStep.lean`) and emitted from them
        unless a note joins it (`lean_step_span`). None: not such a record."""
        _, seq, n, t0, t1, attrs, epoch, micro_batches, tags, events, links, exc = record
        if (tags or events or links or exc is not None or type(n) is not int
                or type(micro_batches) is not int or (epoch is not None and type(epoch) is not int)):
            return None
        sizes: tuple[Any, ...] = ()
        uncovered = None
        if attrs:
            for key, value in attrs.items():
                if key == _UNCOVERED:
                    if type(value) is not float:
                        return None
                    uncovered = value
                elif key not in _SIZES or type(value) is not int:
                    return None
                elif uncovered is not None:
                    return None  # a size after it: the general path's order differs
            if uncovered is None:
                sizes = tuple(attrs.items())  # in order: the general path encodes them in this order
            else:
                sizes = tuple(item for item in attrs.items() if item[0] != _UNCOVERED)
        key = (epoch, micro_batches, sizes)
        wire_attrs = step_wire_attrs(attrs, epoch, micro_batches)
        lean = self._lean_kvs.get(key)
        if lean is None:
            lean = self._lean_fields(key, dict(sizes), epoch, micro_batches)
            if lean is None:
                return None
        head, tail = lean
        if uncovered is not None:
            head += self.encoder.float_attribute(_UNCOVERED, uncovered)
        t1 += offset
        return (KIND_STEP, semconv.SPAN_STEP, seq, None, n, seq, t0 + offset, t1, wire_attrs, None, None, None,
                False, None), t1, head + tail

    def _lean_fields(self, key: tuple[Any, ...], sizes: dict[str, Any], epoch: Any,
                     micro_batches: int) -> tuple[bytes, bytes] | None:
        """The encoded batch-size fields, and the epoch and micro-batch fields, `lean_step`
        holds a step with (cached; `uncovered_s` goes between them), None where the cleaner
        would change a value (past 64 bits)."""
        rest = step_wire_attrs(None, epoch, micro_batches)
        if any(not -(1 << 63) <= value < (1 << 63) for value in (*sizes.values(), *rest.values())):
            return None
        if len(self._lean_kvs) >= _CACHE_MAX:
            self._lean_kvs.clear()
        lean = self._lean_kvs[key] = (self.encoder.attributes(sizes) if sizes else b"",
                                      self.encoder.attributes(rest) if rest else b"")
        return lean

    def lean_step_span(self, held: HeldStep) -> bytes:
        """A step `lean_step` made that nothing was added to since, from its encoded fields."""
        wire = held.wire
        step_n = wire[W_STEP]
        trace_field, step_wire, step_kv, _, root_wire = self.steps.get(step_n) or self.step(step_n)
        encoder = self.encoder
        return encoder.region(semconv.SPAN_STEP, trace_field, step_wire, root_wire, wire[W_T0], wire[W_T1],
                              held.lean + step_kv + encoder.float_attribute(semconv.TRAIN_STEP_TIME_S, held.time_s),
                              remote=root_wire is not None)

    def step_span(self, step_n: int, t0: int, t1: int, attrs: Mapping[str, Any]) -> bytes:
        """A step with no events, links or status, from its cleaned attributes."""
        trace_field, step_wire, step_kv, _, root_wire = self.steps.get(step_n) or self.step(step_n)
        encoder = self.encoder
        kv = encoder.kv
        parts = []
        for key, value in attrs.items():
            if key == semconv.TRAIN_STEP:
                parts.append(step_kv)
            elif key == semconv.TRAIN_STEP_TIME_S:
                parts.append(encoder.float_attribute(key, value))
            else:
                parts.append(kv(key, value))
        return encoder.region(semconv.SPAN_STEP, trace_field, step_wire, root_wire, t0, t1, b"".join(parts),
                              remote=root_wire is not None)


def _str_tuple(value: Any) -> bool:
    """A tuple of strings (`train.optimizer.calls`, every update): cached by value like a scalar.
    Only strings: `(1,) == (True,)`, so a cache keyed by value would mix ints and bools."""
    return type(value) is tuple and all(type(item) is str for item in value)

