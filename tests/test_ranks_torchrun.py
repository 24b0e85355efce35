"""Ranks on a real `torchrun --nproc-per-node 4` gloo DDP job under `otel_train.run`, exporting
OTLP/gRPC to the suite's receiver: the trace shape, no collective added, rank sampling, and clock
skew planted on two ranks and recovered by `diagnose`.

Four launches, each shared by the tests that read it (module-scoped): the job alone (the
collective count without instrumentation); instrumented with every rank's phases and the
clock of ranks 1 and 3 shifted (`TESTS_CLOCK_OFFSET_NS`); `OTEL_TRAIN_RANKS=0`;
`OTEL_TRAIN_RANKS=sample:2`. Collectives are counted under the script, at `ProcessGroup`'s
methods, from interpreter start, where the clocks are shifted too (`support/count_collectives/sitecustomize.py`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from support.otlp_receiver import OTLPReceiver
from support.procs import REPO, clean_env, launch_torchrun

from otel_train import semconv
from otel_train.analyze.diagnose import analyse
from otel_train.export.step_timeline import SIBLING_TAGS
from otel_train.wire.sampling import sampled_ranks

SCENARIO = REPO / "tests" / "support" / "scenarios" / "ddp_hooked.py"
COUNTER = REPO / "tests" / "support" / "count_collectives"
RANKS, STEPS = 4, 8
PLANTED_NS = {1: 250_000_000, 3: -80_000_000}
PHASES = set(semconv.PHASE_SPANS)


class Launch:
    """One torchrun launch: its spans (from the receiver) and each rank's collective count."""

    def __init__(self, spans: list[dict[str, Any]], collectives: dict[int, dict[str, int]], dump: Path,
                 metrics: list[dict[str, Any]] | None = None) -> None:
        self.spans = spans
        self.metrics = metrics or []
        self.collectives = collectives
        self.dump = dump

    def steps(self) -> list[dict[str, Any]]:
        return [s for s in self.spans if s["name"] == semconv.SPAN_STEP]

    def histogram_counts(self, name: str, phase: str | None = None) -> dict[int, int]:
        """Each rank's count of `name` (cumulative: its last, largest point), for one phase."""
        out: dict[int, int] = {}
        for m in self.metrics:
            if m["name"] != name:
                continue
            for p in m["data_points"]:
                if phase is None or p["attributes"].get("phase") == phase:
                    rank = m["resource"]["ml.rank"]
                    out[rank] = max(out.get(rank, 0), p["count"])
        return out

    def phases_by_rank_step(self) -> dict[tuple[int, int], Counter]:
        out: dict[tuple[int, int], Counter] = defaultdict(Counter)
        for s in self.spans:
            if s["name"] in PHASES:
                out[(s["resource"]["ml.rank"], s["attributes"]["train.step"])][s["name"]] += 1
        return out


def _launch(tmp: Path, receiver: OTLPReceiver | None, run_id: str, **env: str) -> Launch:
    instrumented = receiver is not None
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(RANKS), "--standalone",
            *(["-m", "otel_train.run"] if instrumented else []), str(SCENARIO)]
    extra = {"STEPS": str(STEPS), "OMP_NUM_THREADS": "1", "COUNT_COLLECTIVES_DIR": str(tmp),
             "PYTHONPATH": f"{COUNTER}:{REPO}", "OTEL_TRAIN_RUN_ID": run_id, **env}
    if instrumented:
        extra["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.grpc_endpoint
    proc = launch_torchrun(
        lambda: subprocess.run(argv, cwd=tmp, env=clean_env(extra), capture_output=True, text=True, timeout=240),
        again=(lambda: receiver.forget_run(run_id)) if instrumented else None)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    collectives = {r: json.loads((tmp / f"collectives-rank{r}.json").read_text()) for r in range(RANKS)}
    spans = [s for s in receiver.spans() if s["resource"].get("ml.run.id") == run_id] if instrumented else []
    metrics = [m for m in receiver.metrics() if m["resource"].get("ml.run.id") == run_id] if instrumented else []
    dump = tmp / "dump.jsonl"
    if instrumented:
        receiver.dump_jsonl(str(dump), run_id=run_id)
    return Launch(spans, collectives, dump, metrics)


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Launch:
    return _launch(tmp_path_factory.mktemp("plain"), None, "plain")


@pytest.fixture(scope="module")
def every_rank(tmp_path_factory: pytest.TempPathFactory, otlp_receiver: OTLPReceiver) -> Launch:
    shifts = ",".join(f"{rank}={ns}" for rank, ns in PLANTED_NS.items())
    return _launch(tmp_path_factory.mktemp("all"), otlp_receiver, "ranks-all", OTEL_TRAIN_RANKS="all",
                   TESTS_CLOCK_OFFSET_NS=shifts)


@pytest.fixture(scope="module")
def rank0(tmp_path_factory: pytest.TempPathFactory, otlp_receiver: OTLPReceiver) -> Launch:
    return _launch(tmp_path_factory.mktemp("rank0"), otlp_receiver, "ranks-0", OTEL_TRAIN_RANKS="0")


@pytest.fixture(scope="module")
def sample2(tmp_path_factory: pytest.TempPathFactory, otlp_receiver: OTLPReceiver) -> Launch:
    return _launch(tmp_path_factory.mktemp("sample2"), otlp_receiver, "ranks-sample2", OTEL_TRAIN_RANKS="sample:2")


def test_one_trace_per_step_holds_every_rank_under_rank_0(every_rank: Launch) -> None:
    traces: dict[str, list[dict]] = defaultdict(list)
    for s in every_rank.spans:
        traces[s["trace_id"]].append(s)
    steps = every_rank.steps()
    assert sorted(s["attributes"]["train.step"] for s in steps) == sorted(list(range(STEPS)) * RANKS)
    assert len(traces) == STEPS and set(traces) == {s["trace_id"] for s in steps}  # nothing outside them
    assert {s["resource"]["ml.rank"] for s in every_rank.spans if s["name"] == semconv.SPAN_GC} == set(range(RANKS))
    for trace_id, spans in traces.items():
        assert {s["resource"]["ml.rank"] for s in spans} == set(range(RANKS))
        by_id = {s["span_id"]: s for s in spans}
        roots = [s for s in spans if s["parent_span_id"] is None]
        (root,) = [s for s in roots if s["name"] == semconv.SPAN_STEP]
        assert root["resource"]["ml.rank"] == 0
        # Beside it, only rank 0's siblings of the step (the scenario's full collection after its
        # loop is a `train.gc` in the last step's trace on every rank; docs/trace-shape.md).
        assert all(s["name"] in SIBLING_TAGS and s["resource"]["ml.rank"] == 0 for s in roots if s is not root)
        for s in spans:
            if s["parent_span_id"] is None:
                continue
            if s["name"] == semconv.SPAN_STEP or s["name"] in SIBLING_TAGS:
                assert s["parent_span_id"] == root["span_id"]  # every rank's step and siblings under rank 0's step
            else:
                assert s["parent_span_id"] in by_id  # phases under their own rank's step
                assert by_id[s["parent_span_id"]]["resource"]["ml.rank"] == s["resource"]["ml.rank"]


def test_instrumentation_issues_no_collective(plain: Launch, every_rank: Launch, rank0: Launch) -> None:
    assert plain.collectives[0] == {"allreduce": STEPS}  # one gradient bucket a step
    assert every_rank.collectives == plain.collectives == rank0.collectives
    # and each one is seen: a train.collective span per step on every rank
    collective_spans = Counter(s["resource"]["ml.rank"] for s in every_rank.spans
                               if s["name"] == semconv.SPAN_COLLECTIVE)
    assert collective_spans == {r: STEPS for r in range(RANKS)}


def test_planted_clock_offsets_are_recovered_live(every_rank: Launch, capsys: pytest.CaptureFixture[str]) -> None:
    from otel_train.cli import main

    d = analyse(every_rank.dump)
    assert d.ranks == list(range(RANKS)) and d.steps == list(range(STEPS))
    for rank in range(RANKS):
        # the ranks share one host clock: what is left besides the planted shift is alignment noise
        assert abs(d.skew.offsets_ns[rank] - PLANTED_NS.get(rank, 0)) < 10_000_000, d.skew.offsets_ns
    assert d.skew.largest[0] == 1
    assert main(["diagnose", str(every_rank.dump)]) == 0
    out = capsys.readouterr().out
    assert "clock skew: corrected by up to 2" in out and "ms (rank 1)" in out


def test_ranks_0_exports_rank_0s_phases_and_every_ranks_steps(rank0: Launch, every_rank: Launch) -> None:
    phases = rank0.phases_by_rank_step()
    assert {rank for rank, _ in phases} == {0}
    assert {n for _, n in phases} == set(range(STEPS))
    full = every_rank.phases_by_rank_step()
    assert all(phases[(0, n)] == full[(0, n)] for n in range(STEPS))  # complete
    steps = Counter((s["resource"]["ml.rank"], s["attributes"]["train.step"]) for s in rank0.steps())
    assert steps == {(r, n): 1 for r in range(RANKS) for n in range(STEPS)}
    # and every rank's metrics, its phases included: computed from all records, sampled out or not
    every = {r: STEPS for r in range(RANKS)}
    assert rank0.histogram_counts(semconv.METRIC_STEP_DURATION) == every
    assert rank0.histogram_counts(semconv.METRIC_PHASE_DURATION, semconv.SPAN_FORWARD) == every
    assert rank0.histogram_counts(semconv.METRIC_PHASE_DURATION, semconv.SPAN_COLLECTIVE) == every


def test_sample_2_exports_the_sampled_ranks_complete_and_every_ranks_steps(sample2: Launch, every_rank: Launch
                                                                          ) -> None:
    phases = sample2.phases_by_rank_step()
    full = every_rank.phases_by_rank_step()
    for n in range(STEPS):
        chosen = sampled_ranks("ranks-sample2", n, RANKS, 2)
        assert {rank for rank, step in phases if step == n} == set(chosen)
        for rank in chosen:  # every phase span of a sampled rank's step, as with every rank on
            assert phases[(rank, n)] == full[(rank, n)], (rank, n)
    assert len({tuple(sampled_ranks("ranks-sample2", n, RANKS, 2)) for n in range(STEPS)}) > 1  # it rotates
    steps = Counter((s["resource"]["ml.rank"], s["attributes"]["train.step"]) for s in sample2.steps())
    assert steps == {(r, n): 1 for r in range(RANKS) for n in range(STEPS)}
    # diagnose still sees every rank's step times
    d = analyse(sample2.dump)
    assert d.ranks == list(range(RANKS)) and d.steps == list(range(STEPS))
