"""`export --format jaeger`: one Jaeger UI JSON file of a run, labelled for reading in Jaeger.

The embedded default's OTLP files load in Jaeger UI as they are (merge the ranks' files into one
upload first: given several files at once, the UI keeps one file's spans per trace). But Jaeger
labels each span row "<service.name> <operation>" and names a trace "<service>: <root
operation>", and both are the same on every rank and every step: a step's Gantt cannot tell
rank 2 from rank 3 without opening each span, and the trace list cannot tell step 12 from 13.
The wire format keeps them that way on purpose (one `service.name` per job, as OpenTelemetry
requires of replicas; low-cardinality span names, as docs/trace-shape.md and Jaeger's maintainers
ask), so this export relabels *for viewing only*:

- each process becomes the service "<service.name> rank <R>" (" restart <k>" after a restart;
  inference actors "<service.name> actor <instance>"), so rows name and colour their rank;
- step spans become "train.step <N>", so the trace list names the step;
- times are skew-corrected like `diagnose`'s, so ranks line up.

Ids, parents, links, span attributes and events are carried over as jaeger-query's OTLP
translation would; the process tags are the run's `ml.*`, service and host attributes. The file is Jaeger UI's own JSON
(`{"data": [trace, ...]}`), which its "JSON File" upload reads without a backend.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from otel_train import semconv
from otel_train.analyze import reader
from otel_train.analyze.diagnose import Diagnosis

_KIND = {1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


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


def _service(p: reader.Process) -> str:
    base = p.service or "otel-train"
    if p.role == semconv.ROLE_INFERENCE:
        return f"{base} actor {p.instance or p.rank}"
    return f"{base} rank {p.rank}" + (f" restart {p.restart}" if p.restart else "")


def write_jaeger(d: Diagnosis, sources: reader.Sources, path: str | Path, run_id: str | None = None) -> int:
    """Write the run as Jaeger UI JSON to `path`; return the number of traces."""
    traces: dict[str, dict[str, Any]] = {}
    procs: dict[str, str] = {}  # service -> pid, per trace
    for span in _spans(sources, run_id):
        p = span.proc
        off = d.skew.of(p.rank) if p.role != semconv.ROLE_INFERENCE else 0
        trace = traces.setdefault(span.trace_id, {"traceID": span.trace_id, "spans": [], "processes": {},
                                                  "warnings": None})
        service = _service(p)
        key = f"{span.trace_id}/{service}"
        pid = procs.get(key)
        if pid is None:
            pid = procs[key] = f"p{len(trace['processes']) + 1}"
            trace["processes"][pid] = {"serviceName": service, "tags": [_tag(k, v) for k, v in _resource(p).items()]}
        name = span.name
        if name == semconv.SPAN_STEP and span.step is not None:
            name = f"{name} {span.step}"
        refs = [{"refType": "CHILD_OF", "traceID": span.trace_id, "spanID": span.parent_id}] if span.parent_id else []
        refs += [{"refType": "FOLLOWS_FROM", "traceID": t, "spanID": s} for t, s in span.links]
        trace["spans"].append({
            "traceID": span.trace_id, "spanID": span.span_id, "flags": 1, "operationName": name,
            "references": refs, "startTime": (span.start - off) // 1000,
            "duration": max(0, (span.end - span.start) // 1000),
            "tags": [_tag(k, v) for k, v in span.attrs.items()] + [_tag("span.kind", "internal")],
            "logs": [{"timestamp": (t - off) // 1000, "fields": [_tag("event", n)] + [_tag(k, v) for k, v in a.items()]}
                     for n, t, a in span.events],
            "processID": pid, "warnings": None})
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"data": list(traces.values())}, f, separators=(",", ":"))
    return len(traces)


def _spans(sources: reader.Sources, run_id: str | None):  # type: ignore[no-untyped-def]
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
