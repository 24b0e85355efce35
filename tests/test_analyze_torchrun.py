"""`diagnose` / `report` / `export` on real torchrun DDP runs (4 ranks, gloo, CPU).

One run per scenario, shared by the module: a sleep planted in rank 2's data loading, and a
balanced run (every rank sleeps the same). The skew test shifts ranks' files by known offsets.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.procs import clean_env, jaeger_view_script, launch_torchrun

from otel_train.analyze.diagnose import analyse
from otel_train.analyze.perfetto import write_trace
from otel_train.cli import main

SCENARIO = Path(__file__).resolve().parent / "support" / "scenarios" / "ddp_straggler.py"
JAEGER_VIEW = jaeger_view_script()
RANKS, STEPS = 4, 12


def _torchrun(tmp: Path, run_id: str, **env: str) -> tuple[Path, float]:
    """Run the scenario under torchrun + otel_train.run in `tmp`; (its run directory, wall s)."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(RANKS), "--rdzv-backend",
            "c10d", "--rdzv-endpoint", "localhost:0", "--rdzv-id", run_id, "-m", "otel_train.run", str(SCENARIO)]
    t0 = time.time()
    proc = launch_torchrun(
        lambda: subprocess.run(argv, cwd=tmp, env=clean_env({"STEPS": str(STEPS), "OMP_NUM_THREADS": "1", **env}),
                               capture_output=True, text=True, timeout=240),
        again=lambda: shutil.rmtree(tmp / "otel-train" / run_id, ignore_errors=True))
    wall = time.time() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("SCENARIO ") == RANKS
    return tmp / "otel-train" / run_id, wall


@pytest.fixture(scope="module")
def straggler_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    return _torchrun(tmp_path_factory.mktemp("straggler"), "straggler", SLOW_RANK="2", SLOW_S="0.06")


@pytest.fixture(scope="module")
def balanced_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    return _torchrun(tmp_path_factory.mktemp("balanced"), "balanced", SLOW_RANK="all", SLOW_S="0.06")


def test_planted_sleep_names_its_rank(straggler_run: tuple[Path, float], capsys: pytest.CaptureFixture[str]) -> None:
    run, _ = straggler_run
    assert main(["diagnose", str(run)]) == 0
    out = capsys.readouterr().out
    print(out)  # the sample output quoted in docs/analysis.md
    assert "VERDICT: rank 2 straggles" in out
    d = analyse(run)
    assert d.ranks == list(range(RANKS)) and d.steps == list(range(STEPS))
    assert [s.rank for s in d.ranks_verdict.stragglers] == [2]
    late = [st for s in d.step_ranks for st in s.stragglers if st.rank == 2]
    assert len(late) >= STEPS - 2  # named in (nearly) every step
    # DDP: the gradient all-reduce completes inside backward, where the others waited (in step 1
    # DDP's forward also syncs once, broadcasting the rebuilt gradient buckets)
    assert {st.wait_phase for s in d.step_ranks if s.step >= 2 for st in s.stragglers} == {"train.backward"}
    assert {st.slow_phase for st in late} == {"train.data"}
    assert all(st.slow_phase_ns >= 60e6 > st.others_phase_ns for st in late)


def test_balanced_run_says_balanced(balanced_run: tuple[Path, float]) -> None:
    d = analyse(balanced_run[0])
    assert d.ranks_verdict.balanced, [(x.rank, x.steps, x.share) for x in d.ranks_verdict.stragglers]
    assert d.headline.startswith("ranks balanced")


def test_goodput_adds_up_to_the_wall_time(straggler_run: tuple[Path, float]) -> None:
    run, launched_s = straggler_run
    g = analyse(run).goodput
    total = sum(g.totals.values())
    assert abs(total - g.wall_ns) <= 0.01 * g.wall_ns
    assert 0 < g.wall_ns / 1e9 < launched_s  # init to last span lies within the launch
    assert g.totals["productive"] > 0 and g.totals["data"] > 0 and g.totals["startup"] > 0


def _shift(src: Path, dst: Path, offsets_ns: dict[int, int]) -> None:
    """Copy a run directory, moving every timestamp of the given ranks by their offset."""
    dst.mkdir()
    for f in src.iterdir():
        rank = int(f.stem.split("rank")[1])
        off = offsets_ns.get(rank, 0)
        lines = []
        for line in f.read_text().splitlines():
            lines.append(json.dumps(_move(json.loads(line), off)))
        (dst / f.name).write_text("\n".join(lines) + "\n")


def _move(node: object, off: int) -> object:
    if isinstance(node, list):
        return [_move(x, off) for x in node]
    if isinstance(node, dict):
        return {k: (str(int(v) + off) if k.endswith("UnixNano") else _move(v, off)) for k, v in node.items()}
    return node


def test_planted_clock_offsets_are_recovered(straggler_run: tuple[Path, float], tmp_path: Path) -> None:
    run, _ = straggler_run
    before = analyse(run).skew
    # the ranks share one host clock: what is estimated is alignment noise, not skew
    assert before.source == "train.backward" and max(abs(v) for v in before.offsets_ns.values()) < 10e6
    planted = {1: 250_000_000, 3: -80_000_000}
    _shift(run, tmp_path / "shifted", planted)
    after = analyse(tmp_path / "shifted")
    for rank in range(RANKS):
        assert after.skew.offsets_ns[rank] - before.offsets_ns[rank] == planted.get(rank, 0)
    # corrected, the analysis is the same as before: rank 2 straggles, not the shifted ranks
    assert [s.rank for s in after.ranks_verdict.stragglers] == [2]
    assert after.skew.largest == (1, after.skew.offsets_ns[1])


def test_report_and_perfetto_of_the_real_run(straggler_run: tuple[Path, float], tmp_path: Path) -> None:
    run, _ = straggler_run
    d = analyse(run)
    assert main(["report", str(run), "-o", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text()
    assert "rank 2 straggles" in page and "<script src" not in page and "http://" not in page.replace(
        "http://www.w3.org/2000/svg", "")
    n = write_trace(d, tmp_path / "t.json")
    doc = json.loads((tmp_path / "t.json").read_text())
    assert len(doc["traceEvents"]) == n
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert names == {f"rank {r}" for r in range(RANKS)} | {"run"}  # the run: its goodput counter


@pytest.mark.skipif(not JAEGER_VIEW.exists(), reason="needs ../shared/jaeger-ui (the real Jaeger UI)")
def test_ddp_files_make_one_rooted_trace_per_step_in_jaeger(straggler_run: tuple[Path, float], tmp_path: Path) -> None:
    """Jaeger's own conversion (jaeger_view --to-jaeger-json, as jaeger-query's /api/transform)."""
    run, _ = straggler_run
    out = tmp_path / "jaeger.json"
    files = sorted(str(f) for f in run.glob("traces-rank*.jsonl"))
    subprocess.run([sys.executable, str(JAEGER_VIEW), *files, "--to-jaeger-json", str(out)], check=True,
                   capture_output=True, timeout=120)
    traces = json.loads(out.read_text())["data"]
    assert len(traces) == STEPS
    for trace in traces:
        ids = {s["spanID"] for s in trace["spans"]}
        parents = [r["spanID"] for s in trace["spans"] for r in s["references"] if r["refType"] == "CHILD_OF"]
        assert set(parents) <= ids  # no invalid parent
        # One step root (rank 0's); rank 0's own checkpoint/eval/GC spans are siblings of that
        # root, so roots too, but never earlier: Jaeger titles the trace after its earliest root.
        roots = sorted((s for s in trace["spans"] if not s["references"]), key=lambda s: s["startTime"])
        assert roots[0]["operationName"] == "train.step"
        assert all(s["operationName"] in ("train.checkpoint", "train.eval", "train.gc") for s in roots[1:])
        ranks = {next(t["value"] for t in trace["processes"][s["processID"]]["tags"] if t["key"] == "ml.rank")
                 for s in trace["spans"]}
        assert ranks == set(range(RANKS))  # every rank's spans in the step's trace
