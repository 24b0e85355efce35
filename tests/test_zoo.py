"""The zoo: real public training scripts, unmodified, run under `otel-train run` (the DDP one
under `torchrun -m otel_train.run`), exporting to the suite's OTLP receiver (issue 26).

Each test states what a user of the script should get, whatever the instrumentation does
today (tests/zoo/FINDINGS.md says which fail and by how much). The scripts, their sources and
their shrinking flags are in tests/zoo/catalog.py; the harness in tests/zoo/harness.py; the
independent step counter in tests/zoo/counter/sitecustomize.py.

All runs start together when the first test asks for them (2-3 at a time); each test waits
for the runs it reads.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("lightning")
pytest.importorskip("gymnasium")
pytest.importorskip("matplotlib")
pytest.importorskip("tensorboard")

ZOO_DIR = Path(__file__).resolve().parent / "zoo"
if str(ZOO_DIR) not in sys.path:
    sys.path.insert(0, str(ZOO_DIR))

import analysis  # noqa: E402
import catalog  # noqa: E402
import harness  # noqa: E402
from analysis import BACKWARD, CHECKPOINT, EVAL, FORWARD, OPTIMIZER  # noqa: E402
from harness import Run  # noqa: E402
from support.otlp_receiver import OTLPReceiver  # noqa: E402

ENTRIES = catalog.ENTRIES
SINGLE = [n for n, e in ENTRIES.items() if e.ranks == 1]  # run plain and instrumented
WITH_OPTIMIZER = [n for n, e in ENTRIES.items() if not e.manual_update]
PROBED = [n for n, e in ENTRIES.items() if e.probe_step]
SAVING = [n for n, e in ENTRIES.items() if e.checkpoints]
TRACEBACK_ARGS = ("--data", "no-such-corpus")  # word_language_model: data.Corpus asserts the path exists


@pytest.fixture(scope="module")
def zoo(otlp_receiver: OTLPReceiver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Run]]:
    problems = [p for e in ENTRIES.values() for p in catalog.missing(e)]
    altered = [p for p in problems if ": absent (" not in p]
    if altered:
        pytest.fail("zoo scripts altered (tests/zoo/README.md says how to put them in place):\n"
                    + "\n".join(altered))
    if problems:  # the public files are not committed: a fresh clone has none of them
        pytest.skip(f"zoo scripts not in {catalog.SCRIPTS} ({len(problems)} file(s) absent; "
                    "tests/zoo/populate.py puts them there, tests/zoo/README.md says how)")
    root = tmp_path_factory.mktemp("zoo")
    endpoint = otlp_receiver.grpc_endpoint
    runs: dict[str, Run] = {}
    # The slowest first: torchrun, Lightning.
    for name in sorted(ENTRIES, key=lambda n: (ENTRIES[n].ranks == 1, n != "lightning_bug_report")):
        runs[f"{name}/otel"] = Run(ENTRIES[name], "otel", root / f"{name}-otel", endpoint)
        if ENTRIES[name].ranks == 1:
            runs[f"{name}/plain"] = Run(ENTRIES[name], "plain", root / f"{name}-plain")
    wlm = ENTRIES["word_language_model"]
    runs["traceback/otel"] = Run(wlm, "otel", root / "traceback-otel", endpoint, args=TRACEBACK_ARGS)
    runs["traceback/plain"] = Run(wlm, "plain", root / "traceback-plain", args=TRACEBACK_ARGS)
    threads = harness.launch(list(runs.values()), max_running=3)
    yield runs
    for run in runs.values():
        if run.proc is not None and run.proc.poll() is None:
            run.proc.kill()
    for thread in threads:
        thread.join(timeout=60)


def _spans(receiver: OTLPReceiver, run: Run) -> list[dict]:
    run.wait()
    return harness.spans_of(receiver, run.run_id)


def _views(receiver: OTLPReceiver, run: Run) -> dict[int, analysis.RankView]:
    views = analysis.by_rank(_spans(receiver, run))
    assert views, f"no spans from {run.name}\n{run.describe()}"
    return views


#: Issue 26 #7's closing lines and #8 (torchrun's stop) are branch `export`'s work.


# --- the runs themselves ------------------------------------------------------------------------
@pytest.mark.parametrize("name", SINGLE)
def test_script_exits_as_it_does_without_instrumentation(zoo: dict[str, Run], name: str) -> None:
    plain, otel = zoo[f"{name}/plain"].wait(), zoo[f"{name}/otel"].wait()
    assert plain.returncode == 0, plain.describe()
    assert otel.returncode == plain.returncode, otel.describe()


def test_ddp_script_exits_cleanly_under_torchrun(zoo: dict[str, Run]) -> None:
    run = zoo["ppo_ddp/otel"].wait()
    assert run.returncode == 0, run.describe()


# --- (a) steps ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(ENTRIES))
def test_step_count_matches_the_independent_count(otlp_receiver: OTLPReceiver, zoo: dict[str, Run],
                                                  name: str) -> None:
    run = zoo[f"{name}/otel"]
    views = _views(otlp_receiver, run)
    entry = ENTRIES[name]
    if entry.manual_update:  # no optimizer to hook: the script's own loop arithmetic
        expected = {0: catalog.word_lm_steps()}
    else:
        expected = {rank: c["steps"] for rank, c in run.counts().items()}
    assert len(expected) == entry.ranks, f"counter saw ranks {sorted(expected)}\n{run.describe()}"
    assert {rank: len(v.steps) for rank, v in views.items()} == expected
    for view in views.values():
        assert list(view.steps) == list(range(len(view.steps))), f"steps not 0..n-1: {list(view.steps)}"


# --- (b) phases per step ------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(ENTRIES))
def test_one_optimizer_span_per_step(otlp_receiver: OTLPReceiver, zoo: dict[str, Run], name: str) -> None:
    """clip_grad_norm_, step and zero_grad of one update are one optimizer phase (issue 26 #2);
    a script that updates by hand has none or one (its clipping)."""
    for rank, view in _views(otlp_receiver, zoo[f"{name}/otel"]).items():
        per_step = [len(t.named(OPTIMIZER)) for t in view.steps.values()]
        allowed = {0, 1} if ENTRIES[name].manual_update else {1}
        assert set(per_step) <= allowed, f"rank {rank}: train.optimizer spans per step {per_step}"


@pytest.mark.parametrize("name", [n for n, e in ENTRIES.items() if e.micro_batches is not None])
def test_forward_and_backward_once_per_micro_batch(otlp_receiver: OTLPReceiver, zoo: dict[str, Run],
                                                   name: str) -> None:
    k = ENTRIES[name].micro_batches
    for rank, view in _views(otlp_receiver, zoo[f"{name}/otel"]).items():
        for tree in view.steps.values():
            for phase in (FORWARD, BACKWARD):
                micro = [s["attributes"].get(analysis.A_MICRO_BATCH) for s in tree.named(phase)]
                assert micro == list(range(k)), f"rank {rank} step {tree.n}: {phase} micro-batches {micro}"
            assert tree.span["attributes"].get(analysis.A_MICRO_BATCHES) == k, (rank, tree.n)


def test_lbfgs_closure_calls_are_inside_the_optimizer_span(otlp_receiver: OTLPReceiver,
                                                           zoo: dict[str, Run]) -> None:
    """LBFGS evaluates the closure (forward + backward) inside optimizer.step(closure): the
    picture must show them inside the one optimizer phase, as many as LBFGS made (issue 26 #5)."""
    run = zoo["time_sequence_prediction/otel"]
    view = _views(otlp_receiver, run)[0]
    closure_calls = run.counts()[0]["func_evals"]
    assert len(view.steps) == len(closure_calls)
    for tree, calls in zip(view.steps.values(), closure_calls):
        assert len(tree.named(BACKWARD)) == len(tree.named(FORWARD)) == calls, (tree.n, dict(tree.counts()))
        (opt,) = tree.named(OPTIMIZER)
        for span in tree.named(FORWARD) + tree.named(BACKWARD):
            assert opt["start_ns"] <= span["start_ns"] and span["end_ns"] <= opt["end_ns"], \
                f"step {tree.n}: {span['name']} outside the optimizer span"


@pytest.mark.parametrize("name", list(ENTRIES))
def test_eval_and_checkpoint_are_siblings_of_steps(otlp_receiver: OTLPReceiver, zoo: dict[str, Run],
                                                   name: str) -> None:
    """Never below a step, never overlapping one, each joined to a step's trace; one span per
    evaluation pass and per checkpoint save or load the script makes (CONVENTIONS §2-3)."""
    entry = ENTRIES[name]
    for rank, view in _views(otlp_receiver, zoo[f"{name}/otel"]).items():
        for tree in view.steps.values():
            hidden = [s["name"] for s in tree.below if s["name"] in (EVAL, CHECKPOINT)]
            assert not hidden, f"rank {rank} step {tree.n} has {hidden} inside it"
        step_traces = {t.span["trace_id"] for t in view.steps.values()}
        for span in view.outside_named(EVAL) + view.outside_named(CHECKPOINT):
            n = analysis.inside_any_step(span, view)
            assert n is None, f"rank {rank}: {span['name']} overlaps step {n}"
            assert span["trace_id"] in step_traces, f"rank {rank}: {span['name']} in a trace of its own"
        if rank == 0 and entry.evals is not None:
            assert len(view.outside_named(EVAL)) == entry.evals
        if rank == 0 and entry.saves_and_loads is not None:
            assert len(view.outside_named(CHECKPOINT)) == entry.saves_and_loads


# --- (c) the user's objects -------------------------------------------------------------------------
@pytest.mark.parametrize("name", [n for n, e in ENTRIES.items() if e.byte_identical])
def test_saved_files_are_byte_for_byte_the_plain_ones(zoo: dict[str, Run], name: str) -> None:
    plain, otel = zoo[f"{name}/plain"].wait(), zoo[f"{name}/otel"].wait()
    for rel in ENTRIES[name].byte_identical:
        a, b = plain.workdir / rel, otel.workdir / rel
        assert a.is_file(), f"the plain run saved no {rel}\n{plain.describe()}"
        assert b.is_file(), f"the instrumented run saved no {rel}\n{otel.describe()}"
        assert b.read_bytes() == a.read_bytes(), f"{rel} differs from the plain run's " \
            f"(mentions otel_train: {b'otel_train' in b.read_bytes()})"


@pytest.mark.parametrize("name", PROBED)
def test_pickled_and_deepcopied_model_is_the_plain_one(zoo: dict[str, Run], name: str) -> None:
    """The model pickled and deep-copied mid-training (counter/sitecustomize.py's probe) is what
    it is without instrumentation: the same pickle, tensors compared by value where the script
    seeds its weights, by dtype and shape where it does not."""
    plain, otel = zoo[f"{name}/plain"].wait().probes(), zoo[f"{name}/otel"].wait().probes()
    assert plain and plain[0].get("pickle_digest"), plain
    digest = "digest" if ENTRIES[name].seeded else "structure_digest"
    for kind in ("pickle", "deepcopy"):
        assert not otel[0].get(f"{kind}_mentions_otel_train"), f"{kind}: otel_train inside the user's model"
        assert otel[0].get(f"{kind}_{digest}") == plain[0][f"{kind}_{digest}"], \
            f"{kind} differs from the plain run's: {otel[0].get(f'{kind}_error', '')}"


@pytest.mark.parametrize("name", sorted(set(SAVING) | set(PROBED)))
def test_saved_files_load_without_otel_train_like_the_plain_ones(zoo: dict[str, Run], name: str) -> None:
    """In a process that cannot import otel_train: a full load succeeds, and a weights_only=True
    load refuses exactly the globals it refuses in the plain run's file."""
    plain, otel = zoo[f"{name}/plain"].wait(), zoo[f"{name}/otel"].wait()

    def files(run: Run) -> list[Path]:
        found = [run.workdir / rel for rel in ENTRIES[name].checkpoints]
        found += sorted(run.counts_dir.glob("probe-*.bin"), key=lambda p: p.name.rsplit("-", 1)[1])
        return [f for f in found if f.is_file()]

    plain_files, otel_files = files(plain), files(otel)
    assert [f.name.rsplit("-", 1)[-1] for f in otel_files] == [f.name.rsplit("-", 1)[-1] for f in plain_files]
    plain_result = harness.load_in_clean_process(plain.workdir, plain_files)
    otel_result = harness.load_in_clean_process(otel.workdir, otel_files)
    for p, o in zip(plain_files, otel_files):
        expected, got = plain_result[str(p)], otel_result[str(o)]
        assert expected["load"] == "ok", f"plain {p.name}: {expected}"
        assert got == expected, f"{o.relative_to(otel.workdir)}: {got} != plain {expected}"


# --- (d) coverage --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(ENTRIES))
def test_loop_wall_time_is_attributed(otlp_receiver: OTLPReceiver, zoo: dict[str, Run], name: str) -> None:
    """>= 99 % of the loop's wall time (first step's start to last step's end) lies in some span
    below a step or in a sibling between steps (issue 26 #4)."""
    for rank, view in _views(otlp_receiver, zoo[f"{name}/otel"]).items():
        share = view.loop_attributed()
        assert share >= 0.99, f"rank {rank}: {share:.2%} of the loop attributed"


@pytest.mark.parametrize("name", list(ENTRIES))
def test_every_step_reports_its_uncovered_time(otlp_receiver: OTLPReceiver, zoo: dict[str, Run],
                                               name: str) -> None:
    """Each train.step says how much of it no phase covers (`train.step.uncovered_s` or a
    similarly named `*uncovered_s` attribute), and says it right: the step's duration minus
    the union of the spans below it."""
    for rank, view in _views(otlp_receiver, zoo[f"{name}/otel"]).items():
        for tree in view.steps.values():
            reported = analysis.uncovered_attribute(tree.span)
            assert reported is not None, f"rank {rank} step {tree.n}: no *uncovered_s attribute " \
                f"(computed from its spans: {tree.uncovered_s() * 1e3:.2f} ms of {tree.duration_ns / 1e6:.2f} ms)"
            assert reported == pytest.approx(tree.uncovered_s(), abs=1e-4), (rank, tree.n)


# --- (e) what a user sees ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(ENTRIES))
def test_events_lie_inside_their_span(otlp_receiver: OTLPReceiver, zoo: dict[str, Run], name: str) -> None:
    outside = analysis.events_outside(_spans(otlp_receiver, zoo[f"{name}/otel"]))
    assert outside == [], f"(span, event, ms outside): {outside[:10]}"


def test_traceback_shows_the_scripts_frames_only(zoo: dict[str, Run]) -> None:
    plain, otel = zoo["traceback/plain"].wait(), zoo["traceback/otel"].wait()
    expected = harness.frames(plain.stderr)
    assert plain.returncode == otel.returncode == 1 and expected, plain.describe()
    assert harness.frames(otel.stderr) == expected


def test_torchrun_ranks_closing_lines_are_told_apart(zoo: dict[str, Run]) -> None:
    """Under torchrun, one closing line for the job, or one per rank that names its rank."""
    run = zoo["ppo_ddp/otel"].wait()
    closing = [line for line in run.stderr.splitlines() if re.match(r"otel_train: (rank \d+: )?\d+ spans", line)]
    assert closing, run.describe()
    if len(closing) > 1:
        assert len(set(closing)) == len(closing), f"identical lines: {closing}"
        assert all(re.search(r"\brank[ =:]*\d", line) for line in closing), closing


# --- torchrun stopping the job (issue 26 #8) ----------------------------------------------------------
@pytest.fixture(scope="module")
def stopped(otlp_receiver: OTLPReceiver, zoo: dict[str, Run],
            tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, dict[int, int], dict[int, int]]:
    """The DDP script, made long by its own flag, SIGTERMed as a process group under torchrun
    after each rank made 12 optimizer steps. Returns (run, completed steps by rank, train.step
    spans received by rank)."""
    entry = ENTRIES["ppo_ddp"]
    args = list(entry.args)
    args[args.index("--total-timesteps") + 1] = "1000000"
    run = Run(entry, "otel", tmp_path_factory.mktemp("zoo-sigterm") / "ppo", otlp_receiver.grpc_endpoint,
              args=tuple(args))
    harness.terminate_group_mid_run(run, min_steps=12)
    completed = {rank: c["steps"] for rank, c in run.counts().items()}
    # Up to torchrun's grace (30 s) for stragglers to arrive.
    spans = harness.spans_of(otlp_receiver, run.run_id, settle_s=2.0, timeout=35.0)
    received = {rank: len([t for t in v.steps.values() if not t.span["attributes"].get("otel_train.truncated")])
                for rank, v in analysis.by_rank(spans).items()}
    return run, completed, received


def test_torchrun_group_sigterm_delivers_every_completed_step(stopped: tuple[Run, dict[int, int],
                                                                             dict[int, int]]) -> None:
    run, completed, received = stopped
    assert len(completed) == 2 and min(completed.values()) >= 12, completed
    assert {r: received.get(r, 0) for r in completed} == completed, \
        f"completed {completed}, train.step spans received {received}\n{run.stderr[-2000:]}"


def test_torchrun_group_sigterm_counts_what_it_lost(stopped: tuple[Run, dict[int, int], dict[int, int]]) -> None:
    run, completed, received = stopped
    lost = sum(completed.values()) - sum(received.get(r, 0) for r in completed)
    closing = [line for line in run.stderr.splitlines() if line.startswith("otel_train:")]
    if lost > 0:
        assert not any("none dropped" in line for line in closing), \
            f"{lost} completed steps never arrived, yet: {closing}"
    assert closing, run.stderr[-2000:]
