"""`export --format jaeger`: one Jaeger UI JSON file of a run, labelled for reading in Jaeger.

The embedded default's OTLP files load in Jaeger UI as they are (merge the ranks' files into one
upload first: given several files at once, the UI keeps one file's spans per trace). But Jaeger
labels each span row "<service.name> <operation>" and names a trace "<service>: <root
operation>", and both are the same on every rank and every step: a step's Gantt cannot tell
rank 2 from rank 3 without opening each span, and the trace list cannot tell step 12 from 13.
The wire format keeps them that way on purpose (one `service.name` per job, as OpenTelemetry
requires of replicas; low-cardinality span names, as docs/trace-shape.md and Jaeger's maintainers
ask), so this export reshapes *for viewing only*:

- each process becomes the service "<service.name> rank <R>" (" restart <k>" after a restart);
  inference actors "<service.name> <role> <index>" (`model.actor_names`: in order of their first
  call, not their instance UUID), so rows name and colour their process;
- **one root per step trace, ranks in order**: a `train.step <N>` span of the service
  "<service.name> job" spans every rank's work of the step; under it one `rank <R>` lane per
  rank, all starting at the root's start (Jaeger orders siblings by start time, and keeps the
  given order among equal ones, so the lanes read rank 0, 1, 2, ...), each lane holding its
  rank's step span and the rank's siblings (checkpoint, eval, GC, `train.other`), which the
  wire makes roots on rank 0 and children of rank 0's step elsewhere;
- **diagnose's findings are tags**, searchable in Jaeger's Tags box: `diagnose.slow=true` and
  `diagnose.slow.severity` (x median) on every span of a slow step's root and rank steps,
  `diagnose.straggler=true` and `diagnose.late_ms` on the late rank's step span (the root
  carries `diagnose.straggler.rank`), `diagnose.warmup=true` on warm-up steps;
- times are skew-corrected like `diagnose`'s, so ranks line up, in whole microseconds with a
  span's end rounded like its start (consecutive steps never overlap, a child never outlives its
  parent); a step that started less than 1 us before the previous one ended starts at its end
  (`model.settle`).

Ids, parents, links, span attributes and events are carried over as jaeger-query's OTLP
translation would; the process tags are the run's `ml.*`, service and host attributes. The file is
Jaeger UI's own JSON (`{"data": [trace, ...]}`), which its "JSON File" upload reads without a
backend.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from otel_train import semconv
from otel_train.analyze import reader
from otel_train.analyze.diagnose import Diagnosis
from otel_train.analyze.model import actor_names


def _tag(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "type": "bool", "value": value}
    if isinstance(value, int):
        return {"key": key, "type": "int64", "value": value}
    if isinstance(value, float):
        return {"key": key, "type": "float64", "value": value}
    if isinstance(value, list):
        return {"key": key, "type": "string", "value": json.dumps(value)}
    return {"key": key, "type": "string", "value": str(value)}


def _service(p: reader.Process, actors: dict[tuple[str, int], str]) -> str:
    base = p.service or "otel-train"
    if p.role == semconv.ROLE_INFERENCE:
        return f"{base} {actors.get((p.instance, p.rank)) or p.role + ' ' + str(p.rank)}"
    return f"{base} rank {p.rank}" + (f" restart {p.restart}" if p.restart else "")


def _id(*parts: object) -> str:
    return hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).hexdigest()


class _Trace:
    def __init__(self, trace_id: str) -> None:
        self.doc: dict[str, Any] = {"traceID": trace_id, "spans": [], "processes": {}, "warnings": None}
        self.pids: dict[str, str] = {}  # service -> process id

    def pid(self, service: str, tags: dict[str, Any]) -> str:
        pid = self.pids.get(service)
        if pid is None:
            pid = self.pids[service] = f"p{len(self.pids) + 1}"
            self.doc["processes"][pid] = {"serviceName": service, "tags": [_tag(k, v) for k, v in tags.items()]}
        return pid


#: Above this many steps a file is slow to upload (measured: 2,000 steps x 4 ranks, 33 MB, ~90 s and
#: 0.3 GB in headless Chromium; 20,000 x 2 ranks, 176 MB, not shown after 10 min and 12 GB).
BIG_FILE_STEPS = 2_000


def parse_steps(text: str) -> tuple[int, int]:
    """`--steps FIRST-LAST` (inclusive, FIRST <= LAST, both >= 0), else an `InputError` saying so."""
    first, sep, last = text.partition("-")
    if sep and first.strip().isdigit() and last.strip().isdigit() and int(first) <= int(last):
        return int(first), int(last)
    raise reader.InputError(f"--steps {text!r}: expected FIRST-LAST, two step numbers with FIRST <= LAST, "
                            f"e.g. --steps 0-1999")


def write_jaeger(d: Diagnosis, sources: reader.Sources, path: str | Path, run_id: str | None = None,
                 steps: tuple[int, int] | None = None) -> int:
    """Write the run as Jaeger UI JSON to `path` (with `steps`, only the traces of steps FIRST to
    LAST, inclusive); return the number of traces written."""
    actors = actor_names(d.data.pipeline)
    slow, late = d.severity, {(st.rank, s.step): st for s in d.step_ranks for st in s.stragglers}
    worst = {s.step: s.stragglers[0].rank for s in d.step_ranks if s.stragglers}
    by_trace: dict[str, list[reader.Span]] = {}
    for span in _spans(sources, run_id):
        if steps is not None and span.step is not None and not steps[0] <= span.step <= steps[1]:
            continue  # a step outside the range: not held (a slice of a long run stays small)
        by_trace.setdefault(span.trace_id, []).append(span)
    if steps is not None:
        by_trace = {t: spans for t, spans in by_trace.items()
                    if any(s.step is not None and steps[0] <= s.step <= steps[1] for s in spans
                           if s.name == semconv.SPAN_STEP)}
    with open(path, "w", encoding="utf-8") as f:
        f.write('{"data":[')
        for i, (trace_id, spans) in enumerate(by_trace.items()):
            if i:
                f.write(",")
            json.dump(_trace(d, trace_id, spans, actors, slow, late, worst), f, separators=(",", ":"))
        f.write("]}")
    return len(by_trace)


def _trace(d: Diagnosis, trace_id: str, spans: list[reader.Span], actors: dict[tuple[str, int], str],
           slow: dict[int, float], late: dict[tuple[int, int], Any], worst: dict[int, int]) -> dict[str, Any]:
    trace = _Trace(trace_id)
    steps = [s for s in spans if s.name == semconv.SPAN_STEP and s.step is not None
             and s.proc.role != semconv.ROLE_INFERENCE]
    step_n = steps[0].step if steps else None
    times = {id(s): _times(d, s) for s in spans}
    findings: dict[str, Any] = {}
    if step_n is not None:
        if step_n in slow:
            findings = {"diagnose.slow": True, "diagnose.slow.severity": round(slow[step_n], 3)}
        if step_n in d.warmup:
            findings["diagnose.warmup"] = True
    lanes: dict[tuple[int, int], str] = {}
    if steps:
        # One root for the step: every rank's work under it, one lane per rank in rank order.
        t0 = min(times[id(s)][0] for s in spans)
        t1 = max(times[id(s)][1] for s in spans)
        service = (steps[0].proc.service or "otel-train") + " job"
        root_id = _id(trace_id, "root")
        tags = {"train.step": step_n, **findings}
        if step_n in worst:
            tags["diagnose.straggler.rank"] = worst[step_n]
        pid = trace.pid(service, {"service.name": steps[0].proc.service, "ml.run.id": steps[0].proc.run_id})
        trace.doc["spans"].append(_jspan(trace_id, root_id, f"train.step {step_n}", [], t0, t1, tags, [], pid))
        keys = sorted({(s.proc.rank, s.proc.restart) for s in spans if s.proc.role != semconv.ROLE_INFERENCE},
                      key=lambda k: (k[0], k[1]))
        for key in keys:
            end = max(times[id(s)][1] for s in spans if (s.proc.rank, s.proc.restart) == key)
            proc = next(s.proc for s in spans if (s.proc.rank, s.proc.restart) == key)
            lanes[key] = _id(trace_id, "lane", *key)
            label = f"rank {key[0]}" + (f" restart {key[1]}" if key[1] else "")
            trace.doc["spans"].append(_jspan(
                trace_id, lanes[key], label, [_ref(trace_id, root_id)], t0, end,
                {"otel_train.lane": "a row per rank, added by otel-train export (not a span of the run)"}, [],
                trace.pid(_service(proc, actors), _resource(proc))))
    owner = {s.span_id: (s.proc.rank, s.proc.restart, s.name) for s in spans}
    for s in spans:
        p = s.proc
        key = (p.rank, p.restart)
        name, tags = s.name, dict(s.attrs)
        parent = s.parent_id
        if key in lanes and p.role != semconv.ROLE_INFERENCE:
            up = owner.get(parent) if parent else None
            if s.name == semconv.SPAN_STEP or parent is None or up is None or \
                    (up[2] == semconv.SPAN_STEP and up[:2] != key):
                parent = lanes[key]  # a step, a rank's sibling, or a span whose parent is not here
        if name == semconv.SPAN_STEP and s.step is not None:
            name = f"{name} {s.step}"
            tags.update(findings)
            st = late.get((p.rank, s.step))
            if st is not None:
                tags.update({"diagnose.straggler": True, "diagnose.late_ms": round(st.late_ns / 1e6, 3),
                             "diagnose.others_waited_in": st.wait_phase})
        refs = [_ref(trace_id, parent)] if parent else []
        refs += [{"refType": "FOLLOWS_FROM", "traceID": t, "spanID": sid} for t, sid in s.links]
        a, b = times[id(s)]
        off = _offset(d, s)
        logs = [{"timestamp": (t - off) // 1000, "fields": [_tag("event", n)] + [_tag(k, v) for k, v in at.items()]}
                for n, t, at in s.events]
        trace.doc["spans"].append(_jspan(trace_id, s.span_id, name, refs, a, b, tags, logs,
                                         trace.pid(_service(p, actors), _resource(p))))
    return trace.doc


def _offset(d: Diagnosis, s: reader.Span) -> int:
    return d.skew.of(s.proc.rank) if s.proc.role != semconv.ROLE_INFERENCE else 0


def _times(d: Diagnosis, s: reader.Span) -> tuple[int, int]:
    """Skew-corrected (start, end) ns; a step's start as `model.settle` left it."""
    start = s.start
    if s.name == semconv.SPAN_STEP and s.step is not None and s.proc.role != semconv.ROLE_INFERENCE:
        rs = d.data.steps.get((s.proc.rank, s.proc.restart), {}).get(s.step)
        if rs is not None and rs.has_span and s.start <= rs.start < s.end:
            start = rs.start
    off = _offset(d, s)
    return start - off, s.end - off


def _ref(trace_id: str, span_id: str) -> dict[str, Any]:
    return {"refType": "CHILD_OF", "traceID": trace_id, "spanID": span_id}


def _jspan(trace_id: str, span_id: str, name: str, refs: list[dict[str, Any]], start: int, end: int,
           tags: dict[str, Any], logs: list[dict[str, Any]], pid: str) -> dict[str, Any]:
    a, b = start // 1000, end // 1000  # both rounded down: order and nesting survive the rounding
    return {"traceID": trace_id, "spanID": span_id, "flags": 1, "operationName": name, "references": refs,
            "startTime": a, "duration": max(0, b - a),
            "tags": [_tag(k, v) for k, v in tags.items()] + [_tag("span.kind", "internal")],
            "logs": logs, "processID": pid, "warnings": None}


def _spans(sources: reader.Sources, run_id: str | None) -> Iterator[reader.Span]:
    for span in reader.iter_spans(sources):
        if run_id is None or span.proc.run_id == run_id:
            yield span


def _resource(p: reader.Process) -> dict[str, Any]:
    out: dict[str, Any] = {"service.name": p.service, "ml.run.id": p.run_id, "ml.rank": p.rank,
                           "ml.restart": p.restart, "ml.role": p.role, "ml.world_size": p.world_size}
    if p.instance:
        out["service.instance.id"] = p.instance
    if p.host:
        out["host.name"] = p.host
    return out
