"""Streaming reader of what otel_train wrote: spans and metric points, one line at a time.

Accepted inputs (`find_sources`):

- the embedded default's run directory, `./otel-train/<run id>/`: every `traces-*.jsonl`
  (`traces-rank<R>.jsonl` in rank order, then any other, e.g. an inference actor's) and
  `metrics-*.jsonl` in it;
- the output directory above it (`./otel-train/`): its most recently written run, named on
  stderr by the caller;
- one file: a rank's `traces-rank<R>.jsonl` (its `metrics-rank<R>.jsonl` beside it is read
  too), or a dump taken from a receiver.

The dump format is OTLP JSON lines, the OpenTelemetry Collector file exporter's format and the
one the embedded default writes: one `ExportTraceServiceRequest` or
`ExportMetricsServiceRequest` per line (`{"resourceSpans": [...]}` / `{"resourceMetrics":
[...]}`), trace and span ids in hex, 64-bit integers as strings or numbers. Both signals may
share one file, any number of processes (ranks, restarts, inference actors) may share a line
or a file: each span's process is read from its resource (`ml.rank`, `ml.restart`, `ml.role`).
A file holding one pretty-printed OTLP JSON document is read whole (not streamed).

Nothing is held beyond the line being read: `iter_spans` yields `Span`s one by one and the
caller keeps what it needs. A line that is not JSON (a process killed mid-write leaves a
truncated last line) is skipped and counted in `Stats.bad_lines`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:  # about 5x faster on these lines; optional
    import orjson as _orjson

    _loads: Any = _orjson.loads
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads

# A run directory's files: traces-rank<R>.jsonl, and any other traces-<name>.jsonl (an
# inference actor's, say); the same for metrics.
_TRACES_RE = re.compile(r"^traces-(.+)\.jsonl$")
_METRICS_RE = re.compile(r"^metrics-(.+)\.jsonl$")


class InputError(ValueError):
    """The path given cannot be read as trace data; the message says why and what is accepted."""


ACCEPTED = ("the embedded default's run directory (./otel-train/<run id>/ with traces-rank*.jsonl), "
            "its parent (./otel-train/), one traces-rank<R>.jsonl, or an OTLP JSON lines dump "
            "(one ExportTraceServiceRequest per line)")


@dataclass
class Sources:
    """The files to read and how they were found."""

    traces: list[Path]
    metrics: list[Path]
    label: str  # what was read, for messages: a run directory or a file
    note: str = ""  # said on stderr by the CLI (e.g. which of several runs was picked)


@dataclass
class Stats:
    """What reading found besides spans: counts the CLI reports."""

    lines: int = 0
    bad_lines: int = 0
    spans: int = 0


@dataclass(slots=True)
class Process:
    """A span's or a metric point's process, from its resource attributes."""

    rank: int
    restart: int
    role: str
    world_size: int
    service: str
    instance: str
    host: str
    run_id: str


@dataclass(slots=True)
class Span:
    """One span, flattened; times are Unix ns as written (no skew correction)."""

    name: str
    proc: Process
    step: int | None
    start: int
    end: int
    span_id: str
    parent_id: str | None
    trace_id: str
    attrs: dict[str, Any]
    events: list[tuple[str, int, dict[str, Any]]] = field(default_factory=list)
    links: list[tuple[str, str]] = field(default_factory=list)


@dataclass(slots=True)
class MetricPoint:
    """One metric data point: `value` is a gauge/sum's value or a histogram's sum (`count` beside)."""

    name: str
    proc: Process
    start: int
    time: int
    value: float
    count: int | None
    attrs: dict[str, Any]


def find_sources(path: str | Path) -> Sources:
    """The trace and metric files `path` names, or an `InputError` saying what is accepted."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{path}: no such file or directory; expected {ACCEPTED}")
    if p.is_file():
        metrics: list[Path] = []
        m = _TRACES_RE.match(p.name)
        if m:
            beside = p.with_name(f"metrics-{m.group(1)}.jsonl")
            metrics = [beside] if beside.is_file() else []
        return Sources([p], metrics, str(p))
    traces, metrics = _run_files(p)
    if traces:
        return Sources(traces, metrics, str(p))
    runs = sorted((d for d in p.iterdir() if d.is_dir() and _run_files(d)[0]),
                  key=lambda d: max(f.stat().st_mtime for f in _run_files(d)[0]))
    if not runs:
        raise InputError(f"{path}: no trace files in this directory; expected {ACCEPTED}")
    traces, metrics = _run_files(runs[-1])
    note = f"{len(runs)} runs under {path}; reading the latest, {runs[-1]}" if len(runs) > 1 else ""
    return Sources(traces, metrics, str(runs[-1]), note)


def _order(name: str) -> tuple[int, int, str]:
    """rank0, rank1, ..., rank10 in number order, then other names."""
    if name.startswith("rank") and name[4:].isdigit():
        return (0, int(name[4:]), "")
    return (1, 0, name)


def _run_files(d: Path) -> tuple[list[Path], list[Path]]:
    def ranked(pattern: re.Pattern[str]) -> list[Path]:
        found = [(_order(m.group(1)), f) for f in d.iterdir() if (m := pattern.match(f.name)) and f.is_file()]
        return [f for _, f in sorted(found)]
    return ranked(_TRACES_RE), ranked(_METRICS_RE)


# --- OTLP JSON values ----------------------------------------------------------------------
def _value(v: dict[str, Any]) -> Any:
    for key, conv in _CONVERTERS:
        if key in v:
            return conv(v[key])
    return None


def _array(a: dict[str, Any]) -> list[Any]:
    return [_value(x) for x in a.get("values", ())]


_CONVERTERS: tuple[tuple[str, Any], ...] = (
    ("stringValue", str), ("intValue", int), ("doubleValue", float), ("boolValue", bool),
    ("arrayValue", _array), ("bytesValue", str))


def _attrs(items: list[dict[str, Any]] | None) -> dict[str, Any]:
    out = {}
    for item in items or ():
        v = item.get("value")
        if v:
            # The common cases inline: this runs for every attribute of every span.
            if "intValue" in v:
                out[item["key"]] = int(v["intValue"])
            elif "stringValue" in v:
                out[item["key"]] = v["stringValue"]
            else:
                out[item["key"]] = _value(v)
    return out


def _process(resource: dict[str, Any]) -> Process:
    a = _attrs(resource.get("attributes"))

    def num(key: str, default: int) -> int:
        v = a.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) else default

    return Process(rank=num("ml.rank", 0), restart=num("ml.restart", 0), role=str(a.get("ml.role", "trainer")),
                   world_size=num("ml.world_size", 1), service=str(a.get("service.name", "")),
                   instance=str(a.get("service.instance.id", "")), host=str(a.get("host.name", "")),
                   run_id=str(a.get("ml.run.id", "")))


# --- documents -----------------------------------------------------------------------------
def _documents(path: Path, stats: Stats) -> Iterator[dict[str, Any]]:
    with open(path, "rb") as f:
        first = True
        for line in f:
            if not line.strip():
                continue
            stats.lines += 1
            try:
                doc = _loads(line)
            except ValueError:
                if first and line.lstrip().startswith(b"{"):
                    # Not JSON lines: maybe one pretty-printed document (read whole, not streamed).
                    f.seek(0)
                    try:
                        whole = _loads(f.read())
                    except ValueError:
                        stats.bad_lines += 1
                        return
                    if isinstance(whole, dict):
                        yield whole
                    return
                stats.bad_lines += 1
                continue
            first = False
            if isinstance(doc, dict):
                yield doc
            else:
                stats.bad_lines += 1


def iter_blocks(sources: Sources, stats: Stats | None = None, run_id: str | None = None
                ) -> Iterator[tuple[Process, list[dict[str, Any]]]]:
    """(process, its raw OTLP JSON span dicts) per resource block, in file order: the fast path
    for readers that look at a few fields of every span (`model.build`). With `run_id`, only
    that run's processes."""
    stats = stats if stats is not None else Stats()
    for path in sources.traces:
        for doc in _documents(path, stats):
            for rs in doc.get("resourceSpans", ()):
                proc = _process(rs.get("resource", {}))
                if run_id is not None and proc.run_id != run_id:
                    continue
                for ss in rs.get("scopeSpans", ()):
                    spans = ss.get("spans")
                    if spans:
                        yield proc, spans


def iter_spans(sources: Sources, stats: Stats | None = None) -> Iterator[Span]:
    """Every span in `sources`, in file order, one at a time, every attribute decoded."""
    stats = stats if stats is not None else Stats()
    for proc, spans in iter_blocks(sources, stats):
        for s in spans:
            span = _span(s, proc)
            if span is not None:
                stats.spans += 1
                yield span


def _span(s: dict[str, Any], proc: Process) -> Span | None:
    try:
        attrs = _attrs(s.get("attributes"))
        step = attrs.get("train.step")
        span = Span(s["name"], proc, step if isinstance(step, int) else None, int(s["startTimeUnixNano"]),
                    int(s["endTimeUnixNano"]), s.get("spanId", ""), s.get("parentSpanId") or None,
                    s.get("traceId", ""), attrs)
    except (KeyError, TypeError, ValueError):
        return None
    if "events" in s:
        span.events = [(e.get("name", ""), int(e.get("timeUnixNano", 0)), _attrs(e.get("attributes")))
                       for e in s["events"]]
    if "links" in s:
        span.links = [(link.get("traceId", ""), link.get("spanId", "")) for link in s["links"]]
    return span


def iter_metric_points(sources: Sources, stats: Stats | None = None, run_id: str | None = None
                       ) -> Iterator[MetricPoint]:
    """Every metric data point in `sources` (metric files, and metric lines in a dump); with
    `run_id`, only that run's."""
    stats = stats if stats is not None else Stats()
    dumps = [p for p in sources.traces if not _TRACES_RE.match(p.name)]  # metrics share their lines
    for path in list(sources.metrics) + dumps:
        # A dump's lines were counted when its spans were read.
        for doc in _documents(path, stats if path not in dumps else Stats()):
            for rm in doc.get("resourceMetrics", ()):
                proc = _process(rm.get("resource", {}))
                if run_id is not None and proc.run_id != run_id:
                    continue
                for sm in rm.get("scopeMetrics", ()):
                    for metric in sm.get("metrics", ()):
                        yield from _points(metric, proc)


def _points(metric: dict[str, Any], proc: Process) -> Iterator[MetricPoint]:
    name = metric.get("name", "")
    for kind in ("gauge", "sum", "histogram"):
        data = metric.get(kind)
        if not data:
            continue
        for p in data.get("dataPoints", ()):
            try:
                start, time = int(p.get("startTimeUnixNano", 0)), int(p.get("timeUnixNano", 0))
                if kind == "histogram":
                    value, count = float(p.get("sum", 0.0)), int(p.get("count", 0))
                else:
                    raw = p.get("asDouble", p.get("asInt", 0))
                    value, count = float(raw), None
            except (TypeError, ValueError):
                continue
            yield MetricPoint(name, proc, start, time, value, count, _attrs(p.get("attributes")))
