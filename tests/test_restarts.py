"""Elastic restarts (`export/restarts.py`): the run id kept, `ml.restart` on the resource, the steps
an earlier attempt reached tagged `redone`, distinct span ids, and `diagnose` counting the loss."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.harness import Harness, by_name
from support.procs import clean_env

from otel_train import semconv
from otel_train._distributed import RunInfo
from otel_train.analyze.diagnose import analyse
from otel_train.export.otlp_json import read_spans
from otel_train.export.restarts import RestartProgress, earlier_high, may_restart, progress_dir

SCENARIO = Path(__file__).resolve().parent / "support" / "scenarios" / "elastic_restart.py"


def test_markers_are_per_attempt_and_only_earlier_attempts_count(tmp_path: Path) -> None:
    first = RestartProgress(RunInfo("r", rank=1, restart=0), tmp_path)
    assert first.redone_upto is None
    first.flush()
    assert not list(tmp_path.iterdir())  # nothing seen, nothing written
    for step in (0, 1, 2, 7, 5):
        first.note(step)
    first.flush()
    assert (tmp_path / "progress-r0-rank1").read_text() == "7"
    RestartProgress(RunInfo("r", rank=0, restart=0), tmp_path).note(3)  # never flushed: no file
    third = RestartProgress(RunInfo("r", rank=0, restart=2), tmp_path)
    third.note(12)
    third.flush()
    second = RestartProgress(RunInfo("r", rank=3, restart=1), tmp_path)
    # attempt 1 reads attempt 0's markers (any rank's: step numbers are global), never attempt 2's
    assert second.redone_upto == 7 and earlier_high(tmp_path, 3) == 12
    assert [second.redone(n) for n in (6, 7, 8)] == [True, True, False]


def test_markers_only_where_the_run_may_restart(tmp_path: Path) -> None:
    assert not may_restart(RunInfo("r"), {})
    assert may_restart(RunInfo("r"), {"TORCHELASTIC_MAX_RESTARTS": "3"})
    assert may_restart(RunInfo("r", restart=1), {})
    assert progress_dir("a/b c", str(tmp_path)).parent.parent == tmp_path
    assert progress_dir("a/b c", str(tmp_path)).name == "a_b_c"


def test_a_restarted_process_tags_the_steps_an_earlier_attempt_reached(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    import otel_train

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    marker = progress_dir("run-r") / "progress-r0-rank0"
    marker.parent.mkdir(parents=True)
    marker.write_text("5")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    harness = Harness(run_id="run-r")
    for n in range(3, 8):  # resumed from a checkpoint taken before step 3
        with otel_train.step(n):
            harness.clock.advance(1_000_000)
    spans = harness.finish()
    tags = {s.attributes[semconv.TRAIN_STEP]: s.attributes.get(semconv.TRAIN_STEP_TAGS)
            for s in by_name(spans, semconv.SPAN_STEP)}
    assert tags == {3: ("redone",), 4: ("redone",), 5: ("redone",), 6: None, 7: None}
    assert spans[0].resource.attributes[semconv.ML_RESTART] == 1
    assert (marker.parent / "progress-r1-rank0").read_text() == "7"


@pytest.fixture(scope="module")
def restarted_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """2 ranks, torchrun --max-restarts 1: rank 1 fails in step 6 of attempt 0, the job resumes
    from its step-4 checkpoint. The run id is torchrun's (`--rdzv-id`, `TORCHELASTIC_RUN_ID`)."""
    tmp = tmp_path_factory.mktemp("restart")
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--rdzv-id", "elastic", str(SCENARIO)]
    proc = subprocess.run(argv, cwd=tmp, capture_output=True, text=True, timeout=240,
                          env=clean_env({"CKPT": str(tmp / "ckpt"), "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1"}))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ran = {(attempt, rank): json.loads((tmp / f"ckpt.ran-a{attempt}-r{rank}.json").read_text())
           for attempt in (0, 1) for rank in (0, 1)}
    return tmp / "otel-train" / "elastic", ran


def test_redone_steps_are_tagged_and_never_collide(restarted_run: tuple[Path, dict]) -> None:
    run, ran = restarted_run
    assert ran[(0, 0)] == ran[(0, 1)] == list(range(7))  # rank 1 failed in step 6
    assert ran[(1, 0)] == ran[(1, 1)] == list(range(4, 10))  # the second attempt resumed at 4
    steps = [s for f in sorted(run.glob("traces-rank*.jsonl")) for s in read_spans(f) if s["name"] == "train.step"]
    assert {s["resource"]["ml.run.id"] for s in steps} == {"elastic"}  # one run across attempts
    assert [p.name for p in run.parent.iterdir()] == ["elastic"]  # and one run directory
    by_attempt: dict[tuple[int, int, int], dict] = {}
    for s in steps:
        key = (s["resource"]["ml.restart"], s["resource"]["ml.rank"], s["attributes"]["train.step"])
        assert key not in by_attempt
        by_attempt[key] = s
    assert sorted(n for (a, r, n) in by_attempt if a == 0 and r == 0) == list(range(7))
    for rank in (0, 1):
        for n in range(4, 10):
            redone = by_attempt[(1, rank, n)]
            tags = redone["attributes"].get("train.step.tags") or []
            assert ("redone" in tags) == (n <= 6), (rank, n, tags)  # attempt 0 reached step 6
            if n <= 6:  # the same step's trace, another span: both attempts side by side
                first = by_attempt[(0, rank, n)]
                assert first["trace_id"] == redone["trace_id"] and first["span_id"] != redone["span_id"]
        assert not any("redone" in (s["attributes"].get("train.step.tags") or []) for (a, _, _), s in
                       by_attempt.items() if a == 0)
    # each attempt's rank 1 hangs under its own attempt's rank 0 step
    assert by_attempt[(1, 1, 5)]["parent_span_id"] == by_attempt[(1, 0, 5)]["span_id"]


def test_diagnose_counts_the_time_lost_to_the_restart(restarted_run: tuple[Path, dict]) -> None:
    d = analyse(restarted_run[0])
    assert d.restarts == 1 and d.steps == list(range(10))
    assert d.goodput.redone_steps == 6  # steps 4-6 of attempt 0, on both ranks
    assert d.goodput.totals["restart"] > 0
    assert d.goodput.totals["restart"] > d.goodput.totals["productive"]  # a restart costs seconds here
