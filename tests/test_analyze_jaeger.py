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
    assert titles == sorted(f"quickstart rank 0: train.step {n}" for n in range(STEPS))
    assert shown["trace"]["overview"]["Services"] == "2"
    services = {row["service"] for row in shown["trace"]["rows"]}
    assert services == {"quickstart rank 0", "quickstart rank 1"}
    assert shown["console"] == [] and shown["errors_trace_page"] == []
