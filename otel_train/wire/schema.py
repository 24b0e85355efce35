"""The record schema: what the training process hands the export side, in each of its forms.

Both sides import this module, and neither imports the other: the exporter process never
loads the training hot path (`otel_train.record`), and the hot path never loads the SDK.

A record leaves the hot path in one of three forms:

- a **hot-path tuple**, appended by a region's or step's exit (`record.recorder`, the C
  `_hotpath`). Plain values only, so the garbage collector never tracks a buffered record:

      region: `RegionRecord` (below), as a plain tuple
      step:   (KIND_STEP, seq, n, t0, t1, attrs, epoch, micro_batches, tags, events, links, exc)
      notes:  (KIND_TAG, (step_n, step_seq), tag)
              (KIND_EVENT, (step_n, step_seq), (name, t, attrs))

  and the worker's own readings in the training process (device memory counters, the device's
  name, the model's size: `sample_wire`), which go as wire tuples only.

  Times are perf-counter ns; `exc` the exception class (its name, once pickled), or
  `Truncated`; `events` a list of (name, t, attrs); `(step_n, step_seq)` is the step a region
  ran in (`NO_STEP` before the first, step_seq None between steps).
- a **slot** of the packed ring: the usual region's numbers and string indices in a fixed-size
  C struct (`wire/slots.h`), unpacked into the same region tuple.
- a **wire tuple** (`tuple_to_wire`, fields `W_*`), with wall-clock times: what the worker
  sends for a record it had to convert (device time, force-ended at shutdown), and what the span
  assembler's general path reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from otel_train import semconv

# Record kinds (the first field of every form).
KIND_SPAN = 0
KIND_STEP = 1
KIND_TAG = 2  # a tag for a step that has already ended (checkpoint after step N)
KIND_EVENT = 3  # an event for a step that has already ended
KIND_SAMPLE = 4  # a reading the worker took (values in W_ATTRS), for metrics only: no span

#: The step reference of a region recorded before the first step.
NO_STEP = (None, None)
#: Put in a step record's attributes by detection when the step turned out to hold forwards
#: alone, no update (`detect.machine.finish`): the exporter makes it no `train.step`.
NO_UPDATE = "otel_train.no_update"


class RegionRecord(NamedTuple):
    """A region's hot-path record: the one definition of its fields and their order, which
    `wire/record.h` (`REC_*`) mirrors for the C (`tests/test_wire_record.py` holds the two
    equal). Records are plain tuples in this order, never instances of this class: the packed
    ring takes only exact tuples, and a plain one pickles smallest. Python builds one with
    `region_record` and reads one by the `REC_*` indices below."""

    kind: int  # KIND_SPAN: tells a region from a step or a note
    name: str  # the span's name
    seq: int  # the region's number in this process: its span id (`wire/ids.py`)
    parent: int | None  # the enclosing region's number, or None: the step (or nothing) is the parent
    step: tuple[int | None, int | None]  # (step_n, step_seq), the step it ran in: its trace; NO_STEP before the first
    t0: int  # start, perf-counter ns
    t1: int  # end, perf-counter ns
    attrs: dict[str, Any] | None  # its attributes
    exc: Any  # the exception class it ended with (its name, once pickled), `Truncated`, or None
    events: list[tuple[str, int, Any]] | None  # its events, (name, t, attrs)


REC_KIND, REC_NAME, REC_SEQ, REC_PARENT, REC_STEP, REC_T0, REC_T1, REC_ATTRS, REC_EXC, REC_EVENTS = (
    RegionRecord._fields.index(field) for field in
    ("kind", "name", "seq", "parent", "step", "t0", "t1", "attrs", "exc", "events"))


def region_record(name: str, seq: int, parent: int | None, step: tuple[int | None, int | None], t0: int, t1: int,
                  attrs: dict[str, Any] | None, exc: Any = None, events: Any = None) -> tuple[Any, ...]:
    """A region's record (`RegionRecord`) as the plain tuple the hot path appends."""
    return (KIND_SPAN, name, seq, parent, step, t0, t1, attrs, exc, events)


class Truncated:
    """Put in a record's `exc` when shutdown force-ends it: the span gets `otel_train.truncated`.

    The class itself: a normal exit with the span still open. An instance names why the process
    is stopping (`reason`: "SIGTERM", or the uncaught exception's type): the span also gets
    status ERROR, so the backend shows where the rank stopped."""

    def __init__(self, reason: str | None = None) -> None:
        self.reason = reason


# The wire tuple's fields: kind, name, seq, parent_seq, step_n, step_seq, t0_wall_ns, t1_wall_ns,
# attrs, events [(name, wall_ns, attrs)], links [carrier], error (type name), truncated, dev.
W_KIND, W_NAME, W_SEQ, W_PARENT, W_STEP, W_STEP_SEQ, W_T0, W_T1, W_ATTRS, W_EVENTS, W_LINKS, \
    W_ERROR, W_TRUNC, W_DEV = range(14)


def wall_events(events: list[tuple[str, int, Any]] | None, offset: int) -> list[tuple[str, int, Any]] | None:
    """A record's events with their times moved to the wall clock (`offset`: wall - perf ns)."""
    if not events:
        return None
    return [(name, t + offset, attrs) for name, t, attrs in events]


def error_of(exc: Any) -> tuple[str | None, bool]:
    """(exception type name or None, truncated?) from a record's `exc`."""
    if exc is None:
        return None, False
    if exc is Truncated:
        return None, True
    if isinstance(exc, Truncated):
        return exc.reason, True
    if isinstance(exc, str):  # the exception class's name, as the exporter process receives it
        return exc, False
    return exc.__name__, False


def step_wire_attrs(attrs: Any, epoch: Any, micro_batches: int, tags: Any = None) -> dict[str, Any]:
    """A step's wire attributes: its user attributes, then epoch, micro-batch count and tags."""
    out = dict(attrs) if attrs else {}
    if epoch is not None:
        out[semconv.TRAIN_EPOCH] = epoch
    if micro_batches:
        out[semconv.TRAIN_MICRO_BATCHES] = micro_batches
    if tags:
        out[semconv.TRAIN_STEP_TAGS] = [*tags]
    return out


def step_wire(seq: int, n: int, t0: int, t1: int, attrs: Any, epoch: Any, micro_batches: int, tags: Any,
              events: Any, links: Any, exc: Any, dev: Any, offset: int) -> tuple[Any, ...]:
    """A step's wire tuple from its fields (a hot-path step tuple's, and `dev`)."""
    out = step_wire_attrs(attrs, epoch, micro_batches, tags)
    error, truncated = error_of(exc)
    return (KIND_STEP, semconv.SPAN_STEP, seq, None, n, seq, t0 + offset, t1 + offset, out,
            wall_events(events, offset),
            [dict(c) if isinstance(c, Mapping) else c for c in links] if links else None, error, truncated, dev)


def sample_wire(values: Mapping[str, Any], wall_ns: int) -> tuple[Any, ...]:
    """A reading the worker took at `wall_ns` (`export.samples`): `values` by name, plain numbers
    and strings. The exporter keeps them for its metrics (`export.metrics.TrainMetrics.sample`)."""
    return (KIND_SAMPLE, "sample", 0, None, None, None, wall_ns, wall_ns, dict(values), None, None, None, False,
            None)


def tuple_to_wire(record: tuple[Any, ...], offset: int) -> tuple[Any, ...]:
    """One hot-path tuple as a wire tuple; `offset` maps perf ns to wall ns."""
    kind = record[0]  # every form's first field
    if kind == KIND_SPAN:
        exc = record[REC_EXC]
        error, truncated = error_of(exc) if exc is not None else (None, False)
        step_n, step_seq = record[REC_STEP]
        return (KIND_SPAN, record[REC_NAME], record[REC_SEQ], record[REC_PARENT], step_n, step_seq,
                record[REC_T0] + offset, record[REC_T1] + offset, record[REC_ATTRS] or None,
                wall_events(record[REC_EVENTS], offset), None, error, truncated, None)
    if kind == KIND_STEP:
        return step_wire(*record[1:], None, offset)
    _, (step_n, step_seq), payload = record
    if kind == KIND_TAG:
        return (KIND_TAG, payload, 0, None, step_n, step_seq, 0, 0, None, None, None, None, False, None)
    name, t, attrs = payload
    return (KIND_EVENT, name, 0, None, step_n, step_seq, t + offset, t + offset, attrs, None, None, None, False,
            None)
