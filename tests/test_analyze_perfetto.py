"""`export --format perfetto`: checked against the Trace Event Format's documented fields.

The format: Google's "Trace Event Format" document (linked from catapult's
docs/trace-event-format.md), which Perfetto's JSON importer follows. What is checked here:
the JSON Object Format (`traceEvents`, `displayTimeUnit` "ms" or "ns"); every event's `name`,
`ph`, `pid`, `tid`; complete events ("X") with numeric `ts` and `dur` >= 0 in microseconds;
instant events ("i") with a scope `s` of "g", "p" or "t"; metadata events ("M") named
`process_name` / `thread_name` (args.name) or `process_sort_index` / `thread_sort_index`
(args.sort_index); counter events ("C") whose args are numbers; flow events ("s" / "f") in
pairs of one id; `args` an object. And what the viewers need beyond the fields: complete
events on one thread nest (Perfetto drops slices that overlap without nesting).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from support.synth_runs import Plan, write_pipeline, write_run

from otel_train.cli import main

METADATA = {"process_name": "name", "thread_name": "name", "process_sort_index": "sort_index",
            "thread_sort_index": "sort_index"}


def check_trace_event_format(doc: dict[str, Any]) -> None:
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list)
    assert doc.get("displayTimeUnit", "ms") in ("ms", "ns")
    named_pids, named_threads, used = set(), set(), set()
    slices: dict[tuple[int, int], list[tuple[float, float, str]]] = defaultdict(list)
    flows: dict[int, list[str]] = defaultdict(list)
    for e in doc["traceEvents"]:
        assert isinstance(e["name"], str) and e["ph"] in ("X", "i", "M", "C", "s", "f"), e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        assert isinstance(e.get("args", {}), dict) and isinstance(e.get("cat", ""), str), e
        if e["ph"] == "M":
            key = METADATA[e["name"]]
            assert isinstance(e["args"][key], str if key == "name" else int), e
            (named_pids if e["name"] == "process_name" else named_threads).add(
                e["pid"] if e["name"] == "process_name" else (e["pid"], e["tid"]))
            continue
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
        if e["ph"] == "C":  # a counter track belongs to its process
            assert e["pid"] in named_pids and all(isinstance(v, (int, float)) for v in e["args"].values()), e
            continue
        used.add((e["pid"], e["tid"]))
        if e["ph"] in ("s", "f"):
            flows[e["id"]].append(e["ph"])
            continue
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
            slices[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"], e["name"]))
        else:
            assert e["s"] in ("g", "p", "t"), e
    assert {pid for pid, _ in used} <= named_pids and used <= named_threads
    assert all(sorted(v) == ["f", "s"] for v in flows.values()), flows
    for track, items in slices.items():
        stack: list[float] = []
        for start, end, name in sorted(items, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start + 1e-3:
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-3, f"{name} at {start} overlaps without nesting on {track}"
            stack.append(end)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("perfetto")
    plan = Plan(ranks=3, steps=15, device=True, straggler={2: 20.0}, slow_steps={12: 80.0}, jitter_ms=0.5,
                siblings={4: [("train.checkpoint", 30.0)], 9: [("train.eval", 20.0)]}, gc={6: 15.0},
                offsets_ms={1: 33.0, 2: -7.0}, micro_batches=2, zero_grad_ms=1.0, other_ms=3.0)
    write_run(plan, tmp / "run")
    assert main(["export", "--format", "perfetto", str(tmp / "run"), "-o", str(tmp / "trace.json")]) == 0
    return json.loads((tmp / "trace.json").read_text())


def test_fields_follow_the_trace_event_format(exported: dict[str, Any]) -> None:
    check_trace_event_format(exported)


def test_one_process_per_rank_and_one_thread_per_lane(exported: dict[str, Any]) -> None:
    events = exported["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert sorted(procs.values()) == ["rank 0", "rank 1", "rank 2", "run"]
    threads = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "thread_name"}
    assert {name for _, name in threads} == {"host", "device", "gc"}
    by = defaultdict(list)
    for e in events:
        if e["ph"] != "M":
            by[(procs[e["pid"]], e["tid"], e["ph"], e["name"])].append(e)
    for rank in procs.values():
        if rank == "run":
            continue
        steps = by[(rank, 1, "X", "train.step")]
        assert [e["args"]["train.step"] for e in steps] == list(range(15))
        assert len(by[(rank, 1, "X", "train.forward")]) == 30  # two micro-batches a step
        # every span: the zero_grad phase and the script's own time between steps (issue 55)
        assert len(by[(rank, 1, "X", "train.zero_grad")]) == 15 and len(by[(rank, 1, "X", "train.other")]) == 15
        assert len(by[(rank, 1, "C", "step time")]) == 15
        assert len(by[(rank, 2, "X", "train.backward")]) == 30  # device lane
        assert len(by[(rank, 3, "X", "train.gc")]) == 1
        assert [e["args"]["train.step"] for e in by[(rank, 1, "i", "checkpoint")]] == [4]
        assert [e["args"]["train.step"] for e in by[(rank, 1, "i", "slow")]] == [12]
        assert steps[4]["args"]["train.step.tags"] == ["checkpoint"]
    assert len(by[("rank 2", 1, "i", "straggler")]) == 15 and not by[("rank 0", 1, "i", "straggler")]
    goodput = by[("run", 0, "C", "goodput so far")]
    assert len(goodput) == 200 and goodput[0]["args"]["%"] < goodput[-1]["args"]["%"]


def test_goodput_counter_ends_at_the_diagnose_figure(tmp_path: Path) -> None:
    """One definition: the counter's last point is the goodput `diagnose` prints."""
    from otel_train.analyze.diagnose import analyse
    write_run(Plan(ranks=2, steps=20, compile_ms=300.0, siblings={10: [("train.checkpoint", 100.0)]}), tmp_path / "r")
    assert main(["export", "--format", "perfetto", str(tmp_path / "r"), "-o", str(tmp_path / "t.json")]) == 0
    doc = json.loads((tmp_path / "t.json").read_text())
    last = [e for e in doc["traceEvents"] if e["name"] == "goodput so far"][-1]["args"]["%"]
    assert last == pytest.approx(100 * analyse(tmp_path / "r").goodput.goodput, abs=1e-3)


def test_actors_have_lanes_and_links_are_arrows(tmp_path: Path) -> None:
    linked = write_pipeline("balanced", tmp_path / "dump.jsonl", steps=12, links=True)
    assert main(["export", "--format", "perfetto", str(tmp_path / "dump.jsonl"), "-o", str(tmp_path / "t.json")]) == 0
    doc = json.loads((tmp_path / "t.json").read_text())
    check_trace_event_format(doc)
    events = doc["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert sorted(procs.values()) == ["inference 0", "inference 1", "inference 2", "rank 0", "run"]
    calls = [e for e in events if e["ph"] == "X" and e["name"] == "infer.generate"]
    assert calls and all(procs[e["pid"]].startswith("inference") for e in calls)
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert len(starts) == len(ends) == len(linked) > 0
    for k, f in ends.items():  # each arrow: from an actor's call to a trainer step
        assert procs[starts[k]["pid"]].startswith("inference") and procs[f["pid"]] == "rank 0"


def test_times_are_skew_corrected(exported: dict[str, Any]) -> None:
    """The k-th all-reduce ends at the same microsecond on every rank once corrected."""
    ends = defaultdict(list)
    for e in exported["traceEvents"]:
        if e.get("name") == "train.collective" and e["ph"] == "X":
            ends[e["args"]["train.step"]].append(e["ts"] + e["dur"])
    assert len(ends) == 15
    for step_ends in ends.values():
        assert len(step_ends) == 3 and max(step_ends) - min(step_ends) < 0.002
    assert exported["otherData"]["skew_offsets_ms"] == {"0": 0.0, "1": 33.0, "2": -7.0}


def test_the_checker_catches_bad_events() -> None:
    good = {"traceEvents": [{"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "rank 0"}},
                            {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "host"}},
                            {"name": "a", "ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
                            {"name": "b", "ph": "X", "pid": 1, "tid": 1, "ts": 2, "dur": 3}]}
    check_trace_event_format(good)
    overlap = json.loads(json.dumps(good))
    overlap["traceEvents"][3].update(ts=8, dur=5)
    unnamed = json.loads(json.dumps(good))
    unnamed["traceEvents"][3]["tid"] = 2
    instant = json.loads(json.dumps(good))
    instant["traceEvents"].append({"name": "t", "ph": "i", "pid": 1, "tid": 1, "ts": 1, "s": "x"})
    for bad in (overlap, unnamed, instant):
        with pytest.raises(AssertionError):
            check_trace_event_format(bad)


def test_export_writes_trace_json_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_run(Plan(ranks=1, steps=3), tmp_path / "run")
    monkeypatch.chdir(tmp_path)
    assert main(["export", "--format", "perfetto", "run"]) == 0
    check_trace_event_format(json.loads((tmp_path / "trace.json").read_text()))


def test_an_automatic_run_keeps_every_span(tmp_path: Path) -> None:
    """Issue 55: automatic mode's `train.other` (the script's own code) and `train.zero_grad`
    were dropped from the export. A real run of examples/auto_plain.py: every span it wrote is
    an event, and the slices still nest."""
    from collections import Counter

    from support.procs import REPO, run_python
    run_python(script=REPO / "examples" / "auto_plain.py", args=["--epochs", "1", "--out", str(tmp_path)],
               cwd=tmp_path, env={"OTEL_TRAIN_RUN_ID": "auto"}, timeout=180)
    run = tmp_path / "otel-train" / "auto"
    written = Counter(s["name"] for line in (run / "traces-rank0.jsonl").read_text().splitlines()
                      for rs in json.loads(line)["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"])
    assert written["train.other"] and written["train.zero_grad"]
    assert main(["export", "--format", "perfetto", str(run), "-o", str(tmp_path / "t.json")]) == 0
    doc = json.loads((tmp_path / "t.json").read_text())
    check_trace_event_format(doc)
    exported = Counter(e["name"] for e in doc["traceEvents"] if e["ph"] == "X")
    assert exported == written
