"""The embedded default's trace files in the real Jaeger UI (../shared/jaeger-ui/jaeger_view.py).

jaeger_view serves Jaeger UI v1.74, uploads the files through its "JSON File" tab (as a person
would, the files' OTLP lines merged into one upload: uploading several files at once keeps only
one file's spans per trace id, see its README) and reports what the UI shows. For a 1-rank run
and a 2-rank torchrun run of examples/quickstart.py (with evaluation and checkpoint siblings):
one trace per step, each listed as "<service>: train.step" (the UI names a trace after its
root span; the step number is the root's `train.step` tag, not part of the name, see
docs/analysis.md), no error banner or console error, every parent reference resolved.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.procs import REPO, clean_env, jaeger_view_script, launch_torchrun

JAEGER_VIEW = jaeger_view_script()
pytestmark = pytest.mark.skipif(not JAEGER_VIEW.exists(), reason="needs ../shared/jaeger-ui (the real Jaeger UI)")
QUICKSTART = REPO / "examples" / "quickstart.py"
STEPS = 21  # evaluation after steps 9 and 19, a checkpoint after step 19


def _run(tmp: Path, run_id: str, ranks: int) -> list[Path]:
    if ranks == 1:
        argv = [sys.executable, str(QUICKSTART), "--steps", str(STEPS)]
    else:
        argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--rdzv-backend",
                "c10d", "--rdzv-endpoint", "localhost:0", "--rdzv-id", run_id, str(QUICKSTART), "--steps", str(STEPS)]
    proc = launch_torchrun(
        lambda: subprocess.run(argv, cwd=tmp, env=clean_env({"OTEL_TRAIN_RUN_ID": run_id, "OMP_NUM_THREADS": "1"}),
                               capture_output=True, text=True, timeout=240),
        again=lambda: shutil.rmtree(tmp / "otel-train" / run_id, ignore_errors=True))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = sorted((tmp / "otel-train" / run_id).glob("traces-rank*.jsonl"))
    assert len(files) == ranks
    return files


def _view(files: list[Path], out: Path, *extra: str) -> dict:
    proc = subprocess.run([sys.executable, str(JAEGER_VIEW), *map(str, files), "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads((out / "report.json").read_text())


def _converted(files: list[Path], out: Path) -> list[dict]:
    subprocess.run([sys.executable, str(JAEGER_VIEW), *map(str, files), "--to-jaeger-json", str(out)], check=True,
                   capture_output=True, timeout=120)
    return json.loads(out.read_text())["data"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[Path]]:
    """The 1-rank and the 2-rank run, made once for the module."""
    return {ranks: _run(tmp_path_factory.mktemp(f"ranks{ranks}"), f"jaeger-{ranks}", ranks) for ranks in (1, 2)}


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_run_in_jaeger(tmp_path: Path, ranks: int, runs: dict[int, list[Path]]) -> None:
    files = runs[ranks]
    # the eval step's trace: rank 1's eval must not become the trace's name
    shown = _view(files, tmp_path / "view", "--trace-index", "1", "--details")
    assert shown["transforms"][0]["traces"] == STEPS
    assert shown["search"]["header"] == f"{STEPS} Traces"
    titles = [item["title"] for item in shown["search"]["items"]]
    assert len(titles) == STEPS and all(t.startswith("quickstart: train.step ") for t in titles), titles
    assert shown["console"] == [] and shown["errors_search_page"] == [] and shown["errors_trace_page"] == []
    rows = shown["trace"]["rows"]
    assert rows[0]["operation"] == "train.step" and rows[0]["depth"] == 0
    assert sum(r["operation"] == "train.step" for r in rows) == ranks
    for trace in _converted(files, tmp_path / "jaeger.json"):
        ids = {s["spanID"] for s in trace["spans"]}
        refs = [r["spanID"] for s in trace["spans"] for r in s["references"] if r["refType"] == "CHILD_OF"]
        assert set(refs) <= ids, "a parent Jaeger cannot find"
        # the earliest root names the trace in Jaeger: rank 0's step, its own siblings after it
        roots = [s["operationName"] for s in sorted(trace["spans"], key=lambda s: s["startTime"])
                 if not s["references"]]
        ranks_seen = {t["value"] for p in trace["processes"].values() for t in p["tags"] if t["key"] == "ml.rank"}
        assert ranks_seen == set(range(ranks))  # ranks told apart by the process's ml.rank tag
        assert roots[0] == "train.step" and set(roots[1:]) <= {"train.eval", "train.checkpoint", "train.gc"}
        assert len([r for r in roots if r == "train.step"]) == 1
        root_ranks = {t["value"] for s in trace["spans"] if not s["references"]
                      for t in trace["processes"][s["processID"]]["tags"] if t["key"] == "ml.rank"}
        assert root_ranks == {0}  # other ranks' siblings hang under rank 0's step, like their steps


def test_the_labelled_export_names_ranks_and_steps(tmp_path: Path, runs: dict[int, list[Path]]) -> None:
    """`otel-train export --format jaeger`: Jaeger UI JSON, each rank a service, each step named."""
    from otel_train.cli import main

    run_dir = runs[2][0].parent
    assert main(["export", "--format", "jaeger", str(run_dir), "-o", str(tmp_path / "jaeger.json")]) == 0
    shown = _view([tmp_path / "jaeger.json"], tmp_path / "view", "--trace-index", "1")
    titles = sorted(item["title"].rsplit(" ", 1)[0] for item in shown["search"]["items"])
    assert titles == sorted(f"quickstart job: train.step {n}" for n in range(STEPS))
    assert shown["trace"]["overview"]["Services"] == "3"
    services = {row["service"] for row in shown["trace"]["rows"]}
    assert services == {"quickstart job", "quickstart rank 0", "quickstart rank 1"}
    assert shown["console"] == [] and shown["errors_trace_page"] == []


def _tree(trace: dict) -> tuple[list[dict], dict[str, list[dict]]]:
    kids: dict[str, list[dict]] = {}
    for s in trace["spans"]:
        for r in s["references"]:
            if r["refType"] == "CHILD_OF":
                kids.setdefault(r["spanID"], []).append(s)
    return [s for s in trace["spans"] if not s["references"]], kids


def _tags(span: dict) -> dict:
    return {t["key"]: t["value"] for t in span["tags"]}


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-rank scripted run: rank 2 straggles, step 12 is slow, eval and `train.other` siblings,
    a clock offset, and automatic mode's sub-microsecond overlap between consecutive steps."""
    from support.synth_runs import Plan, write_run

    from otel_train.cli import main
    tmp = tmp_path_factory.mktemp("synthetic")
    write_run(Plan(ranks=4, steps=20, straggler={2: 30.0}, slow_steps={12: 100.0}, jitter_ms=1.0, other_ms=2.0,
                   zero_grad_ms=1.0, siblings={9: [("train.eval", 20.0)]}, offsets_ms={1: 4.0}), tmp / "run")
    _overlap(tmp / "run" / "traces-rank1.jsonl")
    assert main(["export", "--format", "jaeger", str(tmp / "run"), "-o", str(tmp / "jaeger.json")]) == 0
    return tmp / "jaeger.json"


def _overlap(path: Path) -> None:
    """Start each step of the file 400 ns before the previous step's last span ended (issue 55)."""
    docs = [json.loads(line) for line in path.read_text().splitlines()]
    spans = [s for d in docs for rs in d["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    ends: dict[int, int] = {}
    for s in spans:
        step = next((int(a["value"]["intValue"]) for a in s["attributes"] if a["key"] == "train.step"), None)
        if step is not None and s["name"] != "train.other":
            ends[step] = max(ends.get(step, 0), int(s["endTimeUnixNano"]))
    for s in spans:
        step = next((int(a["value"]["intValue"]) for a in s["attributes"] if a["key"] == "train.step"), None)
        if s["name"] == "train.step" and step and step - 1 in ends:
            s["startTimeUnixNano"] = str(ends[step - 1] - 400)  # the step right after, 0.4 us early
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))


def test_one_root_per_step_with_ranks_in_order_and_findings_as_tags(synthetic: Path) -> None:
    traces = json.loads(synthetic.read_text())["data"]
    assert len(traces) == 20
    for trace in traces:
        roots, kids = _tree(trace)
        (root,) = roots  # one root, whatever the siblings
        n = _tags(root)["train.step"]
        assert root["operationName"] == f"train.step {n}"
        lanes = kids[root["spanID"]]
        assert [s["operationName"] for s in lanes] == [f"rank {r}" for r in range(4)]
        assert len({s["startTime"] for s in lanes}) == 1  # equal starts: Jaeger keeps this order
        for lane in lanes:
            for child in kids[lane["spanID"]]:  # inside the lane, a child never outlives its parent
                assert lane["startTime"] <= child["startTime"]
                assert child["startTime"] + child["duration"] <= lane["startTime"] + lane["duration"]
        names = sorted(s["operationName"] for lane in lanes for s in kids[lane["spanID"]])
        assert names.count(f"train.step {n}") == 4 and names.count("train.other") == 4
        steps = {trace["processes"][s["processID"]]["serviceName"]: _tags(s) for s in trace["spans"]
                 if s["operationName"] == f"train.step {n}" and s is not root}
        assert steps["otel-train rank 2"]["diagnose.straggler"] is True and steps["otel-train rank 2"]["diagnose.late_ms"] > 25
        assert "diagnose.straggler" not in steps["otel-train rank 0"]
        assert ("diagnose.slow" in _tags(root)) == (n == 12)
        if n == 12:
            assert all(t["diagnose.slow"] is True and t["diagnose.slow.severity"] > 1.5 for t in steps.values())


def test_consecutive_steps_never_overlap(synthetic: Path) -> None:
    by_rank: dict[str, list[tuple[int, int]]] = {}
    for trace in json.loads(synthetic.read_text())["data"]:
        for s in trace["spans"]:
            service = trace["processes"][s["processID"]]["serviceName"]
            if s["operationName"].startswith("train.step ") and "rank" in service:
                by_rank.setdefault(service, []).append((s["startTime"], s["startTime"] + s["duration"]))
    for spans in by_rank.values():
        spans.sort()
        assert all(b[0] >= a[1] for a, b in zip(spans, spans[1:]))


def test_actors_are_named_by_role_and_index(tmp_path: Path) -> None:
    from support.synth_runs import write_pipeline

    from otel_train.cli import main
    write_pipeline("balanced", tmp_path / "dump.jsonl", steps=6, links=True)
    assert main(["export", "--format", "jaeger", str(tmp_path / "dump.jsonl"), "-o", str(tmp_path / "j.json")]) == 0
    services = {p["serviceName"] for t in json.loads((tmp_path / "j.json").read_text())["data"]
                for p in t["processes"].values()}
    assert {"actor inference 0", "actor inference 1", "actor inference 2"} <= services
    assert not any("actor-" in s for s in services)  # not the instance id


def test_the_export_in_the_real_jaeger_ui(synthetic: Path, tmp_path: Path) -> None:
    """The slow step's trace in Jaeger UI: one root, then rank 0, 1, 2, 3 in order; searchable tag."""
    shown = _view([synthetic], tmp_path / "view", "--trace-index", "0")
    assert shown["search"]["header"] == "20 Traces"
    assert shown["console"] == [] and shown["errors_search_page"] == [] and shown["errors_trace_page"] == []
    rows = shown["trace"]["rows"]
    assert rows[0]["depth"] == 0 and rows[0]["service"] == "otel-train job"
    lanes = [r["operation"] for r in rows if r["depth"] == 1]
    assert lanes == ["rank 0", "rank 1", "rank 2", "rank 3"]


def test_a_step_range_is_exported_and_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from support.synth_runs import Plan, write_run

    from otel_train.cli import main
    write_run(Plan(ranks=2, steps=30), tmp_path / "run")
    assert main(["export", "--format", "jaeger", str(tmp_path / "run"), "--steps", "10-14",
                 "-o", str(tmp_path / "j.json")]) == 0
    assert "(5 traces, steps 10-14 of 30)" in capsys.readouterr().out
    roots = [s["operationName"] for t in json.loads((tmp_path / "j.json").read_text())["data"]
             for s in t["spans"] if not s["references"]]
    assert sorted(roots) == sorted(f"train.step {n}" for n in range(10, 15))
    assert main(["export", "--format", "jaeger", str(tmp_path / "run"), "--steps", "14-10"]) != 0
    assert "--steps '14-10': expected FIRST-LAST" in capsys.readouterr().err
