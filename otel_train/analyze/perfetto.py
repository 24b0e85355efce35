"""`export --format perfetto`: the run as Chrome Trace Event JSON (Perfetto, chrome://tracing).

The format is the Trace Event Format (Google's "Trace Event Format" document, linked from
catapult's docs/trace-event-format.md; Perfetto imports it as "JSON traces"): a JSON object
whose `traceEvents` list holds, here,

- metadata events (`ph: "M"`): `process_name` / `process_sort_index` per rank (one process per
  rank, and per restart attempt), per inference actor ("inference 0", ...: its own lane) and
  one for the run; `thread_name` / `thread_sort_index` per lane;
- complete events (`ph: "X"`, `ts` and `dur` in microseconds): steps and every phase span
  (`train.zero_grad` too) on the rank's `host` thread, with checkpoint / eval and the script's
  own time (`train.other`) on it too, so no time a rank spent is missing; device work (from
  `device.duration_s` / `device.lag_s`) on the `device` thread; GC pauses on a `gc` thread (a
  pause can straddle two phases, and slices on one thread must nest); actors' `infer.generate`
  calls on their process's `calls` thread;
- counter events (`ph: "C"`): each rank's step time (ms) at each step, and the run's goodput so
  far (%, the figure `diagnose` gives, at 200 points: `accounting.account`'s series);
- flow events (`ph: "s"` / `"f"`): an arrow from each producer span (an actor's call) to the step
  that linked it (the step's `otel_train.link`), so a sample's path is one click;
- instant events (`ph: "i"`, `s: "t"`): the step's tags (`checkpoint`, `eval`, `gc`, user
  tags) and `diagnose`'s findings, `slow` (with its severity) and `straggler`, at the step's end.

Step attributes and findings go in `args`. Times are skew-corrected (`skew`) and relative to the
job's start; `displayTimeUnit` is ms. Events are written one by one, nothing is built whole.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from otel_train.analyze.accounting import account
from otel_train.analyze.diagnose import Diagnosis
from otel_train.analyze.model import RankStep, actor_names

HOST, DEVICE, GC, CALLS = 1, 2, 3, 1
_LANES = ((HOST, "host"), (DEVICE, "device"), (GC, "gc"))
GOODPUT_POINTS = 200


def _us(ns: int) -> float:
    return round(ns / 1000.0, 3)


def _meta(pid: int, name: str, sort: int, lanes: tuple[tuple[int, str], ...]) -> Iterator[dict[str, Any]]:
    yield {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}}
    yield {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": sort}}
    for tid, lane in lanes:
        yield {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": lane}}
        yield {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}}


def events(d: Diagnosis) -> Iterator[dict[str, Any]]:
    """Every trace event of the run, process by process."""
    data, skew = d.data, d.skew
    origin = d.goodput.start_ns
    late = {(st.rank, s.step): st for s in d.step_ranks for st in s.stragglers}
    keys = sorted(set(data.steps) | {(s.rank, s.restart) for s in data.siblings}, key=lambda k: (k[1], k[0]))
    siblings: dict[tuple[int, int], list[Any]] = {}
    for s in data.siblings:
        siblings.setdefault((s.rank, s.restart), []).append(s)
    # Actors first in the index (the flows start there), drawn after the ranks.
    names = actor_names(data.pipeline)
    actor_pid = {key: len(keys) + 2 + i for i, key in enumerate(names)}
    producers: dict[str, tuple[int, float]] = {}
    for s in data.pipeline:
        pid = actor_pid.get((s.instance, s.rank))
        if pid is not None and s.span_id:
            producers[s.span_id] = (pid, _us(s.start - origin))
    flow = 0
    for pid, key in enumerate(keys, start=1):
        rank, restart = key
        off = skew.of(rank) + origin
        yield from _meta(pid, f"rank {rank}" + (f" (restart {restart})" if restart else ""), pid, _LANES)
        device_end = None
        for n, rs in sorted(data.steps.get(key, {}).items()):
            yield from _step(rs, pid, off, d.severity.get(n), late.get((rank, n)))
            yield {"name": "step time", "ph": "C", "pid": pid, "tid": HOST, "ts": _us(rs.start - off),
                   "args": {"ms": round(rs.duration / 1e6, 4)}}
            for link in rs.links:
                source = producers.get(link)
                if source is None:
                    continue
                flow += 1
                yield {"name": "sample", "cat": "link", "ph": "s", "id": flow, "pid": source[0], "tid": CALLS,
                       "ts": source[1]}
                yield {"name": "sample", "cat": "link", "ph": "f", "bp": "e", "id": flow, "pid": pid, "tid": HOST,
                       "ts": _us(rs.start - off)}
            for name, a, b in rs.device_phases():
                a = a if device_end is None else max(a, device_end)  # one device queue: no overlap
                if b > a:
                    device_end = b
                    yield {"name": name, "cat": "device", "ph": "X", "pid": pid, "tid": DEVICE,
                           "ts": _us(a - off), "dur": _us(b - a), "args": {"train.step": n}}
        for s in siblings.get(key, ()):
            yield {"name": s.name, "cat": "sibling", "ph": "X", "pid": pid,
                   "tid": GC if s.name == "train.gc" else HOST, "ts": _us(s.start - off),
                   "dur": _us(s.end - s.start), "args": {"train.step": s.step}}
    for (instance, rank), name in names.items():
        pid = actor_pid[(instance, rank)]
        yield from _meta(pid, name, pid, ((CALLS, "calls"),))
    for s in data.pipeline:
        pid = actor_pid.get((s.instance, s.rank))
        if pid is not None:
            yield {"name": s.name, "cat": "actor", "ph": "X", "pid": pid, "tid": CALLS, "ts": _us(s.start - origin),
                   "dur": _us(s.end - s.start), "args": {k: v for k, v in (s.attrs or {}).items()
                                                         if isinstance(v, (int, float, str, bool))}}
    run_pid = len(keys) + 1
    yield from _meta(run_pid, "run", 0, ())
    series = account(data, skew, list(d.job_step_ns.values()), marks=GOODPUT_POINTS).series
    for t, value in series:
        yield {"name": "goodput so far", "ph": "C", "pid": run_pid, "tid": 0, "ts": _us(t - origin),
               "args": {"%": round(100 * value, 3)}}


def _step(rs: RankStep, pid: int, off: int, severity: float | None, straggler: Any) -> Iterator[dict[str, Any]]:
    args: dict[str, Any] = {"train.step": rs.step, "rank": rs.rank, "duration_ms": rs.duration / 1e6}
    for name, value in (("train.step.time_s", rs.time_s), ("train.epoch", rs.epoch),
                        ("train.samples", rs.samples), ("train.tokens", rs.tokens)):
        if value is not None:
            args[name] = value
    if rs.tags:
        args["train.step.tags"] = list(rs.tags)
    if rs.restart:
        args["ml.restart"] = rs.restart
    if severity is not None:
        args["slow"] = True
        args["slow_severity"] = round(severity, 3)
    if straggler is not None:
        args["straggler_late_ms"] = straggler.late_ns / 1e6
        args["others_waited_in"] = straggler.wait_phase
    yield {"name": "train.step", "cat": "step", "ph": "X", "pid": pid, "tid": HOST, "ts": _us(rs.start - off),
           "dur": _us(rs.duration), "args": args}
    for name, a, b in rs.phases():
        a, b = max(a, rs.start), min(b, rs.end)  # slices on a thread must nest inside the step's
        if b >= a:
            yield {"name": name, "cat": "phase", "ph": "X", "pid": pid, "tid": HOST, "ts": _us(a - off),
                   "dur": _us(b - a), "args": {"train.step": rs.step}}
    marks = [t for t in rs.tags if t != "slow"] + (["slow"] if severity is not None else []) + \
        (["straggler"] if straggler is not None else [])
    for tag in marks:
        yield {"name": tag, "cat": "tag", "ph": "i", "s": "t", "pid": pid, "tid": HOST, "ts": _us(rs.end - off),
               "args": {"train.step": rs.step}}


def write_trace(d: Diagnosis, path: str | Path) -> int:
    """Write the trace JSON to `path`; return the number of events."""
    with open(path, "w", encoding="utf-8") as f:
        return _write(d, f)


def _write(d: Diagnosis, f: TextIO) -> int:
    f.write('{"displayTimeUnit": "ms", "otherData": ')
    f.write(json.dumps({"run_id": d.run_id, "source": "otel-train export --format perfetto",
                        "clock": "skew-corrected, microseconds from the job's start",
                        "skew_offsets_ms": {str(r): v / 1e6 for r, v in d.skew.offsets_ns.items()}}))
    f.write(', "traceEvents": [\n')
    count = 0
    for event in events(d):
        if count:
            f.write(",\n")
        f.write(json.dumps(event, separators=(",", ":")))
        count += 1
    f.write("\n]}\n")
    return count
