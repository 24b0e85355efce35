"""`diagnose` on scripted runs whose truth is known (tests/support/synth_runs.py), and its inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.otlp_receiver import OTLPReceiver
from support.synth_runs import PIPELINES, Plan, write_pipeline, write_run

from otel_train.analyze import reader
from otel_train.analyze.diagnose import analyse, to_json
from otel_train.analyze.text import render
from otel_train.cli import main


def _close(got: dict[str, float], want: dict[str, float], wall: float, tol: float = 0.01) -> None:
    for k, v in want.items():
        assert abs(got[k] - v) <= tol * wall, (k, got[k], v)


def test_straggler_named_with_evidence_and_skew_recovered(tmp_path: Path) -> None:
    plan = Plan(ranks=6, steps=30, straggler={4: 25.0}, offsets_ms={1: 3.7, 4: -12.5, 5: 40.0}, jitter_ms=1.0)
    truth = write_run(plan, tmp_path)
    d = analyse(tmp_path)
    assert not d.ranks_verdict.balanced
    assert [s.rank for s in d.ranks_verdict.stragglers] == [4]
    worst = max((st for s in d.step_ranks for st in s.stragglers), key=lambda st: st.late_ns)
    assert worst.rank == 4 and worst.wait_phase == "train.collective" and worst.slow_phase == "train.data"
    assert worst.slow_phase_ns > 20e6 > worst.others_phase_ns
    # each rank's offset against rank 0, to the nanosecond: collective ends are exact here
    assert d.skew.offsets_ns == {r: truth.offsets_ns[r] - truth.offsets_ns[0] for r in range(6)}
    assert d.skew.source == "train.collective"
    assert "rank 4 straggles" in d.headline
    text = render(d)
    assert "straggler: rank 4" in text and "clock skew: corrected by up to 40 ms (rank 5)" in text


def test_balanced_run_names_nobody(tmp_path: Path) -> None:
    write_run(Plan(ranks=8, steps=40, jitter_ms=2.0, offsets_ms={3: 5.0}), tmp_path)
    d = analyse(tmp_path)
    assert d.ranks_verdict.balanced and not d.ranks_verdict.stragglers
    assert d.headline.startswith("ranks balanced")
    assert "balanced: no rank made the others wait" in render(d)


def test_a_sampled_run_names_its_straggler_and_recovers_skew(tmp_path: Path) -> None:
    """OTEL_TRAIN_RANKS=sample:4 on 32 ranks: every rank's step spans, the phases of rank 0 and 4
    others a step. The straggler is named from the steps it was sampled in; offsets recovered."""
    plan = Plan(ranks=32, steps=40, straggler={21: 25.0}, offsets_ms={5: 9.0, 21: -6.0}, jitter_ms=1.0, sample=4)
    truth = write_run(plan, tmp_path)
    d = analyse(tmp_path)
    assert d.ranks == list(range(32))
    assert [s.rank for s in d.ranks_verdict.stragglers] == [21]
    s = d.ranks_verdict.stragglers[0]
    assert s.seen_steps is not None and 2 <= s.steps <= s.seen_steps < 40
    assert "rank 21 straggles" in d.headline and "steps it was sampled in" in d.headline
    for rank in (5, 21):  # exact: collective ends agree to the nanosecond here
        assert d.skew.offsets_ns[rank] == truth.offsets_ns[rank] - truth.offsets_ns[0]
    # the spread covers every rank's step spans, sampled out or not
    assert {x.ranks for x in d.step_ranks} == {32}


def test_a_sampled_balanced_run_names_nobody(tmp_path: Path) -> None:
    write_run(Plan(ranks=32, steps=40, jitter_ms=2.0, sample=4), tmp_path)
    d = analyse(tmp_path)
    assert d.ranks_verdict.balanced and d.headline.startswith("ranks balanced")


def test_ddp_shape_waits_in_backward(tmp_path: Path) -> None:
    """No collective spans: the all-reduce completes inside backward, whose ends align."""
    plan = Plan(ranks=4, steps=20, ddp=True, straggler={2: 30.0}, offsets_ms={2: 7.0}, micro_batches=2)
    truth = write_run(plan, tmp_path)
    d = analyse(tmp_path)
    assert d.skew.source == "train.backward"
    assert d.skew.offsets_ns[2] == truth.offsets_ns[2]
    assert [s.rank for s in d.ranks_verdict.stragglers] == [2]
    assert {st.wait_phase for s in d.step_ranks for st in s.stragglers} == {"train.backward"}


def test_occasional_straggler_is_listed_not_blamed(tmp_path: Path) -> None:
    write_run(Plan(ranks=4, steps=100, straggler={1: 30.0}, straggle_steps={50}), tmp_path)
    d = analyse(tmp_path)
    assert d.ranks_verdict.balanced
    assert [(x.rank, x.steps) for x in d.ranks_verdict.occasional] == [(1, 1)]


def test_goodput_categories_match_the_script_and_add_up(tmp_path: Path) -> None:
    plan = Plan(ranks=3, steps=60, startup_ms=2500.0, compile_ms=900.0, data_ms=12.0, jitter_ms=1.0,
                siblings={19: [("train.checkpoint", 400.0)], 39: [("train.eval", 250.0), ("train.checkpoint", 380.0)]},
                gc={7: 40.0, 33: 25.0}, tail_ms=150.0, offsets_ms={1: 20.0, 2: -9.0})
    truth = write_run(plan, tmp_path)
    g = analyse(tmp_path).goodput
    wall = sum(g.totals.values()) / 1e9
    assert wall == pytest.approx(truth.wall_ns / 1e9, rel=1e-6)  # the categories cover the wall time exactly
    assert g.wall_ns == truth.wall_ns
    got = {k: v / 1e9 for k, v in g.totals.items()}
    _close(got, truth.seconds, wall)
    assert got["compile"] == pytest.approx(0.9, abs=0.05)  # first step's excess over the ideal step time
    assert got["checkpoint"] == pytest.approx(0.78, abs=1e-6) and got["eval"] == pytest.approx(0.25, abs=1e-6)


def test_restart_time_is_lost_work_downtime_and_restart(tmp_path: Path) -> None:
    """Crash after step 29, resume at 20 from a checkpoint: steps 20-29 ran twice."""
    plan = Plan(ranks=2, steps=50, restart=(29, 20, 3000.0), startup_ms=1000.0)
    truth = write_run(plan, tmp_path)
    d = analyse(tmp_path)
    g = d.goodput
    assert g.restarts == 1 and g.redone_steps == 2 * 10
    got = {k: v / 1e9 for k, v in g.totals.items()}
    _close(got, truth.seconds, truth.wall_ns / 1e9)
    assert got["restart"] == pytest.approx(truth.seconds["restart"], rel=1e-6)
    assert d.steps == list(range(50))  # each step once, the attempt that counted
    assert {rs.restart for per in d.data.by_step().values() for rs in per.values() if rs.step >= 20} == {1}


def test_slow_steps_flagged_by_the_rule(tmp_path: Path) -> None:
    write_run(Plan(ranks=2, steps=60, jitter_ms=1.0, slow_steps={25: 60.0, 47: 45.0}, compile_ms=500.0), tmp_path)
    d = analyse(tmp_path)
    assert d.slow_steps == [25, 47]
    assert d.warmup == frozenset({0})  # the compile step: counted as compile, not judged


@pytest.mark.parametrize("kind", sorted(PIPELINES))
def test_pipeline_verdicts(tmp_path: Path, kind: str) -> None:
    write_pipeline(kind, tmp_path / "dump.jsonl")
    d = analyse(tmp_path / "dump.jsonl")
    assert d.pipeline is not None and d.pipeline.verdict == kind
    assert d.pipeline.actors == 3 and d.pipeline.capacities["infer.capacity"] > 0
    if kind != "balanced":
        assert d.headline.startswith(f"pipeline {kind}")


def test_json_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_run(Plan(ranks=2, steps=12, straggler={1: 30.0}), tmp_path)
    assert main(["diagnose", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stragglers"][0]["rank"] == 1 and out["balanced"] is False
    assert len(out["per_step"]) == 12 and out["per_step"][3]["stragglers"][0]["late_s"] > 0.02
    assert abs(sum(out["goodput"]["seconds"].values()) - out["goodput"]["wall_s"]) < 0.01 * out["goodput"]["wall_s"]


# --- inputs --------------------------------------------------------------------------------
def test_inputs_dir_parent_file_and_dump(tmp_path: Path) -> None:
    run = tmp_path / "otel-train" / "run-a"
    write_run(Plan(ranks=3, steps=10, run_id="run-a", straggler={2: 20.0}), run)
    assert analyse(run).ranks == [0, 1, 2]
    parent = analyse(tmp_path / "otel-train")
    assert parent.run_id == "run-a" and parent.note == ""
    single = analyse(run / "traces-rank1.jsonl")
    assert single.ranks == [1] and single.goodput.startup_from == "init"  # metrics-rank1.jsonl beside it
    dump = tmp_path / "dump.jsonl"  # several ranks and both signals in one file, lines shuffled
    lines = [ln for f in sorted(run.iterdir()) for ln in f.read_text().splitlines()]
    dump.write_text("\n".join(reversed(lines)) + "\n")
    d = analyse(dump)
    assert d.ranks == [0, 1, 2] and [s.rank for s in d.ranks_verdict.stragglers] == [2]
    # a truncated last line (a killed process) is skipped and counted
    with open(dump, "a") as f:
        f.write('{"resourceSpans": [{"resou')
    assert analyse(dump).bad_lines == 1


def test_pretty_printed_document_is_read_whole(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_run(Plan(ranks=1, steps=5), run)
    doc = json.loads((run / "traces-rank0.jsonl").read_text().splitlines()[0])
    (tmp_path / "one.json").write_text(json.dumps(doc, indent=2))
    assert analyse(tmp_path / "one.json").steps == list(range(5))


def test_several_runs_reads_the_latest_and_says_so(tmp_path: Path) -> None:
    write_run(Plan(ranks=1, steps=3, run_id="old"), tmp_path / "old")
    write_run(Plan(ranks=1, steps=4, run_id="new"), tmp_path / "new")
    import os
    os.utime(tmp_path / "old" / "traces-rank0.jsonl", (1, 1))
    d = analyse(tmp_path)
    assert d.run_id == "new" and "2 runs" in d.note and str(tmp_path / "new") in d.note


@pytest.mark.parametrize(("argv", "message"), [
    (["diagnose", "{tmp}/missing"], "no such file or directory"),
    (["diagnose", "{tmp}/empty"], "no trace files in this directory"),
    (["report", "{tmp}/nospans.jsonl"], "no train.step spans"),
    (["export", "--format", "chrome", "{tmp}/empty"], "--format 'chrome' is not a known format; use one of: perfetto"),
])
def test_bad_input_gets_one_clear_message(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                                          message: str) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "nospans.jsonl").write_text('{"resourceMetrics": []}\nnot json\n')
    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and err[0].startswith(f"otel-train {argv[0]}: ")


def test_accepted_formats_are_named_in_errors() -> None:
    assert "OTLP JSON lines" in reader.ACCEPTED and "traces-rank" in reader.ACCEPTED


def test_to_json_is_plain(tmp_path: Path) -> None:
    write_run(Plan(ranks=2, steps=5), tmp_path)
    json.dumps(to_json(analyse(tmp_path)))


def test_a_receivers_dump_is_read(fresh_receiver: OTLPReceiver, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Two real runs exported over OTLP to the suite's receiver, dumped as OTLP JSON lines."""
    from support.procs import REPO, run_python

    for run_id, steps in (("dump-a", "12"), ("dump-b", "3")):
        run_python(script=REPO / "examples" / "quickstart.py", args=["--steps", steps], cwd=tmp_path,
                   env={"OTEL_EXPORTER_OTLP_ENDPOINT": fresh_receiver.grpc_endpoint, "OTEL_TRAIN_RUN_ID": run_id})
    assert not (tmp_path / "otel-train").exists()  # everything went to the receiver
    assert fresh_receiver.dump_jsonl(str(tmp_path / "all.jsonl")) >= 4
    assert main(["diagnose", str(tmp_path / "all.jsonl")]) == 2
    assert "holds 2 runs (dump-a, dump-b); name one with --run" in capsys.readouterr().err
    d = analyse(tmp_path / "all.jsonl", run_id="dump-a")
    assert d.run_id == "dump-a" and d.steps == list(range(12))
    assert {rs.step for per in d.data.by_step().values() for rs in per.values() if "eval" in rs.tags} == {9}
    assert d.goodput.startup_from == "init" and d.goodput.totals["eval"] > 0
    fresh_receiver.dump_jsonl(str(tmp_path / "b.jsonl"), run_id="dump-b")
    assert analyse(tmp_path / "b.jsonl").steps == [0, 1, 2]


def test_other_trace_files_of_a_run_directory_are_read(tmp_path: Path) -> None:
    """An inference actor's file beside the ranks' (whatever it is named) joins the run."""
    write_pipeline("inference-bound", tmp_path / "dump.jsonl")
    lines = (tmp_path / "dump.jsonl").read_text().splitlines()
    run = tmp_path / "run"
    run.mkdir()
    (run / "traces-rank0.jsonl").write_text(lines[0] + "\n")
    (run / "traces-inference-actors.jsonl").write_text("\n".join(lines[1:]) + "\n")
    d = analyse(run)
    assert d.pipeline is not None and d.pipeline.verdict == "inference-bound" and d.pipeline.actors == 3
