"""Spans reduced to what the analyses read: one `RankStep` per (rank, restart, step), siblings, pipeline.

`build(spans)` consumes the span stream once and keeps, per step of each rank, its boundaries,
tags, and its phase spans as a flat array of times (a few hundred bytes a step, so a 1,024-rank,
100-step run is ~100,000 small records, not a million span objects). Times stay as written
(each rank's own clock); `skew` estimates the offsets and the analyses apply them.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from otel_train import semconv
from otel_train.analyze.reader import Process, Span, Stats, _span, _value

#: The phase spans a step is made of, in the order a step usually runs them (for legends).
PHASES: tuple[str, ...] = (semconv.SPAN_DATA, semconv.SPAN_FORWARD, semconv.SPAN_BACKWARD,
                           semconv.SPAN_OPTIMIZER, semconv.SPAN_ZERO_GRAD, semconv.SPAN_COLLECTIVE,
                           semconv.SPAN_DISPATCH_WAIT)
#: Spans kept beside the steps: checkpoint, eval, GC, and `train.other` (the script's own code
#: no phase covers: between steps, or a detected step's largest gaps), so every picture can
#: draw all the time a rank spent.
SIBLINGS: tuple[str, ...] = (*semconv.STEP_SIBLING_SPANS, semconv.SPAN_OTHER)
#: Consecutive steps of a rank that overlap by less than this are clock jitter, not overlap:
#: automatic mode's step can start 0.1-0.6 us before the previous step's optimizer ends.
JITTER_NS = 1_000
#: The pseudo-phase of a step's time that no phase span covers.
OUTSIDE = "(outside phase spans)"
_PHASE_CODE = {name: i for i, name in enumerate(PHASES)}
_SIBLING_SET = frozenset(SIBLINGS)

ProcKey = tuple[int, int]  # (rank, restart)


@dataclass(slots=True)
class RankStep:
    """One rank's one attempt at one step."""

    step: int
    rank: int
    restart: int
    start: int = sys.maxsize  # ns, the train.step span's (else its phases' extent)
    end: int = 0
    has_span: bool = False
    time_s: float | None = None
    tags: tuple[str, ...] = ()
    # Phases as parallel arrays: code into PHASES, host start/end ns; device start/end ns
    # (-1: none) only where a phase carried device.duration_s.
    codes: array = field(default_factory=lambda: array("b"))
    times: array = field(default_factory=lambda: array("q"))
    dev: array | None = None
    samples: int | None = None
    tokens: int | None = None
    epoch: int | None = None
    totals: tuple[int, ...] = ()  # host ns per phase code, set by finish()
    links: tuple[str, ...] = ()  # span ids the step span links to (producers of its samples)

    @property
    def duration(self) -> int:
        return self.end - self.start

    def phases(self) -> Iterator[tuple[str, int, int]]:
        """(phase name, host start ns, host end ns), in start order once `finish()` ran."""
        t = self.times
        for i, code in enumerate(self.codes):
            yield PHASES[code], t[2 * i], t[2 * i + 1]

    def device_phases(self) -> Iterator[tuple[str, int, int]]:
        """(phase name, device start ns, device end ns) of phases with device time."""
        if self.dev is None:
            return
        d = self.dev
        for i, code in enumerate(self.codes):
            if d[2 * i] >= 0:
                yield PHASES[code], d[2 * i], d[2 * i + 1]

    def phase_totals(self) -> dict[str, int]:
        """Host ns per phase name (micro-batches summed), phases present only."""
        return {PHASES[code]: ns for code, ns in enumerate(self.totals) if ns or code in self.codes}

    def finish(self) -> None:
        """Sort phases by start, sum them per phase; a step with no train.step span takes its
        phases' extent."""
        n = len(self.codes)
        totals = [0] * len(PHASES)
        t = self.times
        for i, code in enumerate(self.codes):
            totals[code] += t[2 * i + 1] - t[2 * i]
        self.totals = tuple(totals)
        if n > 1:
            order = sorted(range(n), key=lambda i: self.times[2 * i])
            if order != list(range(n)):
                self.codes = array("b", (self.codes[i] for i in order))
                self.times = array("q", (x for i in order for x in (self.times[2 * i], self.times[2 * i + 1])))
                if self.dev is not None:
                    self.dev = array("q", (x for i in order for x in (self.dev[2 * i], self.dev[2 * i + 1])))
        if not self.has_span and n:
            self.start = min(self.times[0::2])
            self.end = max(self.times[1::2])


def settle(per: Mapping[int, RankStep]) -> None:
    """Move a step's start to where the previous step of the process (its last span) ended, when
    they overlap by less than `JITTER_NS`: steps follow each other, and a sub-microsecond
    overlap breaks the nesting every picture draws."""
    prev_end = None
    for n in sorted(per):
        rs = per[n]
        if prev_end is not None and 0 < prev_end - rs.start < JITTER_NS:
            rs.start = min(prev_end, rs.end)
        prev_end = max([rs.end, *rs.times[1::2]])


def traced(per: Mapping[int, RankStep]) -> dict[int, RankStep]:
    """The ranks of one step whose phase spans are there: all of them, unless the run sampled
    ranks (`OTEL_TRAIN_RANKS`), which keeps every rank's step span but some ranks' phases."""
    return {r: rs for r, rs in per.items() if rs.codes}


@dataclass(slots=True)
class Interval:
    """A sibling span (checkpoint, eval, gc) or a pipeline span, with its process."""

    name: str
    rank: int
    restart: int
    step: int | None
    start: int
    end: int
    role: str = semconv.ROLE_TRAINER
    instance: str = ""
    attrs: dict[str, Any] | None = None
    links: list[tuple[str, str]] | None = None
    span_id: str = ""


@dataclass
class RunData:
    """Everything the analyses read, per process and per step."""

    steps: dict[ProcKey, dict[int, RankStep]] = field(default_factory=dict)
    siblings: list[Interval] = field(default_factory=list)
    pipeline: list[Interval] = field(default_factory=list)  # infer.generate (any role)
    processes: dict[ProcKey, Process] = field(default_factory=dict)
    first_ns: dict[ProcKey, int] = field(default_factory=dict)  # earliest span start per process
    last_ns: dict[ProcKey, int] = field(default_factory=dict)   # latest span end per process
    init_ns: dict[ProcKey, int] = field(default_factory=dict)   # otel_train.init, from metrics
    other_spans: dict[str, int] = field(default_factory=dict)   # names not analysed, counted
    run_ids: set[str] = field(default_factory=set)  # every trainer process's ml.run.id
    spans: int = 0

    @property
    def ranks(self) -> list[int]:
        return sorted({rank for rank, _ in self.steps})

    @property
    def world_size(self) -> int:
        sizes = [p.world_size for p in self.processes.values() if p.role == semconv.ROLE_TRAINER]
        return max(sizes + [len(self.ranks)]) if sizes or self.ranks else 0

    @property
    def run_id(self) -> str:
        return next((p.run_id for p in self.processes.values() if p.run_id), "")

    def step_numbers(self) -> list[int]:
        return sorted({n for per in self.steps.values() for n in per})

    def by_step(self) -> dict[int, dict[int, RankStep]]:
        """step -> rank -> the last attempt's RankStep (redone steps: the attempt that counted)."""
        out: dict[int, dict[int, RankStep]] = {}
        for (rank, restart), per in sorted(self.steps.items(), key=lambda kv: kv[0][1]):
            for n, rs in per.items():
                out.setdefault(n, {})[rank] = rs
        return dict(sorted(out.items()))


def actor_names(pipeline: Iterable[Interval]) -> dict[tuple[str, int], str]:
    """(instance, rank) of each inference process -> "<role> <index>", indexes in order of the
    process's first span (a service instance id is a UUID nobody can read)."""
    first: dict[tuple[str, int], tuple[int, str]] = {}
    for s in pipeline:
        key = (s.instance, s.rank)
        if key not in first or s.start < first[key][0]:
            first[key] = (s.start, s.role)
    ordered = sorted(first, key=lambda k: (first[k][0], k))
    return {key: f"{first[key][1]} {i}" for i, key in enumerate(ordered)}


def build(blocks: Iterable[tuple[Process, list[dict[str, Any]]]], stats: Stats | None = None) -> RunData:
    """Reduce raw span blocks (`reader.iter_blocks`) to `RunData`, in one pass; spans may come in
    any order. The loop reads only the fields the analyses use: it runs for every span."""
    data = RunData()
    steps, first, last = data.steps, data.first_ns, data.last_ns
    phase_code, sibling_set, step_name = _PHASE_CODE, _SIBLING_SET, semconv.SPAN_STEP
    count = 0
    for proc, raw in blocks:
        if proc.role == semconv.ROLE_INFERENCE:
            for s in raw:
                span = _span(s, proc)
                if span is not None:
                    count += 1
                    data.pipeline.append(_interval(span))
            continue
        key = (proc.rank, proc.restart)
        data.processes.setdefault(key, proc)
        data.run_ids.add(proc.run_id)
        per = steps.get(key)
        if per is None:
            per = steps[key] = {}
        lo, hi = first.get(key, sys.maxsize), last.get(key, 0)
        for s in raw:
            try:
                name, t0, t1 = s["name"], int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"])
            except (KeyError, TypeError, ValueError):
                continue
            count += 1
            if t0 < lo:
                lo = t0
            if t1 > hi:
                hi = t1
            code = phase_code.get(name)
            if code is None and name != step_name:
                span = _span(s, proc)
                if span is None:
                    continue
                if name in sibling_set:
                    data.siblings.append(Interval(name, proc.rank, proc.restart, span.step, t0, t1))
                elif name == semconv.SPAN_INFER_GENERATE:
                    data.pipeline.append(_interval(span))
                else:
                    data.other_spans[name] = data.other_spans.get(name, 0) + 1
                continue
            n = dev_d = dev_lag = host_off = host_d = None
            attrs = s.get("attributes") or ()
            if code is None:
                n = _step_attr(attrs)
            else:
                for item in attrs:
                    k = item.get("key")
                    if k == "train.step":
                        n = _int(item.get("value"))
                    elif k == "device.duration_s":
                        dev_d = _num(item.get("value"))
                    elif k == "device.lag_s":
                        dev_lag = _num(item.get("value"))
                    elif k == semconv.HOST_OFFSET_S:
                        host_off = _num(item.get("value"))
                    elif k == semconv.HOST_DURATION_S:
                        host_d = _num(item.get("value"))
                if host_off is not None and host_d is not None:  # drawn on the device's timeline:
                    t0 += int(host_off * 1e9)  # the host lane keeps the host's interval
                    t1 = t0 + int(host_d * 1e9)
            if n is None:
                data.other_spans[name] = data.other_spans.get(name, 0) + 1
                continue
            rs = per.get(n)
            if rs is None:
                rs = per[n] = RankStep(n, proc.rank, proc.restart)
            if code is None:
                _take_step_span(rs, t0, t1, _decode(attrs))
                if s.get("links"):
                    rs.links = tuple(str(x.get("spanId", "")) for x in s["links"] if isinstance(x, dict))
            else:
                rs.codes.append(code)
                rs.times.append(t0)
                rs.times.append(t1)
                if dev_d is not None or rs.dev is not None:
                    _take_device(rs, t0, dev_d, dev_lag)
        first[key], last[key] = lo, hi
    for per in steps.values():
        for rs in per.values():
            rs.finish()
        settle(per)
    data.spans = count
    if stats is not None:
        stats.spans += count
    return data


def _int(v: dict[str, Any] | None) -> int | None:
    if v and "intValue" in v:
        try:
            return int(v["intValue"])
        except (TypeError, ValueError):
            return None
    return None


def _num(v: dict[str, Any] | None) -> float | None:
    if not v:
        return None
    raw = v.get("doubleValue", v.get("intValue"))
    try:
        return float(raw) if raw is not None else None
    except (TypeError, ValueError):
        return None


def _step_attr(attrs: Iterable[dict[str, Any]]) -> int | None:
    for item in attrs:
        if item.get("key") == "train.step":
            return _int(item.get("value"))
    return None


def _decode(attrs: Iterable[dict[str, Any]]) -> dict[str, Any]:
    return {item.get("key"): _value(item.get("value") or {}) for item in attrs}


def _interval(span: Span) -> Interval:
    p = span.proc
    return Interval(span.name, p.rank, p.restart, span.step, span.start, span.end, p.role, p.instance, span.attrs,
                    span.links, span.span_id)


def _take_step_span(rs: RankStep, t0: int, t1: int, a: dict[str, Any]) -> None:
    off, dur = a.get(semconv.HOST_OFFSET_S), a.get(semconv.HOST_DURATION_S)
    if isinstance(off, (int, float)) and isinstance(dur, (int, float)):  # a step drawn between its
        t0 += int(off * 1e9)  # device boundaries: its host interval, as for a CPU run
        t1 = t0 + int(dur * 1e9)
    rs.has_span = True
    rs.start, rs.end = t0, t1
    t = a.get(semconv.TRAIN_STEP_TIME_S)
    rs.time_s = float(t) if isinstance(t, (int, float)) else None
    tags = a.get(semconv.TRAIN_STEP_TAGS)
    if isinstance(tags, list):
        rs.tags = tuple(str(x) for x in tags)
    elif isinstance(tags, str):
        rs.tags = (tags,)
    for name in (semconv.TRAIN_SAMPLES, semconv.TRAIN_TOKENS, semconv.TRAIN_EPOCH):
        v = a.get(name)
        setattr(rs, name.split(".")[1], v if isinstance(v, int) and not isinstance(v, bool) else None)


def _take_device(rs: RankStep, t0: int, dur: float | None, lag: float | None) -> None:
    if rs.dev is None:
        rs.dev = array("q", [-1] * (2 * len(rs.codes) - 2))
    if dur is None:
        rs.dev.append(-1)
        rs.dev.append(-1)
        return
    d0 = t0 + int((lag or 0.0) * 1e9)
    rs.dev.append(d0)
    rs.dev.append(d0 + int(dur * 1e9))
