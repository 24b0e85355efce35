"""The fault suite (issue 30): a real training subprocess, the suite's real OTLP receiver, one fault each.

Every test states the fault, what is kept, what is lost and how it is counted, and reports the
training and exit time of the faulted run beside an unfaulted one started in the same test
(`support.fault_run.report`: one row of docs/faults.md's table). Timing is reported, not
asserted, except for generous bounds that prove "bounded". The receivers here are each test's
own (a fault injected into the session's receiver would reach other tests' runs).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time

import grpc
import pytest
from support.fault_run import Result, TrainingRun, report, settle, step_spans
from support.otlp_receiver import BlackHoleListener, Fault, OTLPReceiver, unreachable_endpoint

from otel_train import semconv
from otel_train.export.otlp_json import read_spans

BOUND_S = 2.0  # OTEL_TRAIN_SHUTDOWN_TIMEOUT_S for the faulted runs: short, so the suite stays short
#: A faulted run whose exporter would wait `EXPORTER_WAITS_S` on the collector is given
#: `HANG_GUARD_S` to end: only the shutdown bound ends it in time (a hang guard, not a speed claim).
EXPORTER_WAITS_S = 600
HANG_GUARD_S = 60
SPANS_PER_STEP = 5


def _otlp(endpoint: str, **extra: str) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_TRAIN_SHUTDOWN_TIMEOUT_S": str(BOUND_S), **extra}


def _baseline(receiver: OTLPReceiver, steps: int, step_s: float = 0.01, **extra: str) -> TrainingRun:
    # Unfaulted: a bound that a loaded machine fits in (the run ends as soon as all is sent).
    return TrainingRun(_otlp(receiver.grpc_endpoint, **{"OTEL_TRAIN_SHUTDOWN_TIMEOUT_S": "20", **extra}), steps, step_s)


def _finish(run: TrainingRun, receiver: OTLPReceiver | None = None, timeout: float = 120.0) -> tuple[Result, int]:
    """The run's result and, with a receiver, the completed steps that reached it."""
    result = run.finish(timeout)
    assert result.returncode == 0, result.stderr
    if receiver is None:
        return result, 0
    return result, len(step_spans(settle(receiver, run.run_id), run.run_id))


# --- 1. no collector at all; a black-holed one ------------------------------------------------------
@pytest.mark.parametrize("kind", ["unreachable", "black hole"])
def test_no_collector_costs_training_nothing_and_every_span_is_counted(receiver: OTLPReceiver, kind: str) -> None:
    """Fault: nothing listens (connection refused), or a listener accepts and never answers.
    Kept: nothing can be. Lost and counted: every span, in the closing line, said once."""
    with BlackHoleListener() as hole:
        endpoint = unreachable_endpoint() if kind == "unreachable" else hole.endpoint
        base = _baseline(receiver, 100)
        # An exporter willing to wait far past the hang guard: the bound is what ends the run.
        faulted = TrainingRun(_otlp(endpoint, OTEL_EXPORTER_OTLP_TIMEOUT=str(EXPORTER_WAITS_S * 1000)), 100, 0.01)
        result, _ = _finish(faulted, timeout=HANG_GUARD_S)
        base_result, delivered = _finish(base, receiver)
    assert result.completed == 100 and delivered == 100
    assert "Traceback" not in result.stderr
    assert result.exported == 0 and result.dropped == 100 * SPANS_PER_STEP, result.stderr
    failures = [line for line in result.stderr.splitlines() if "exporting to" in line and "failed" in line]
    assert len(failures) <= 1, result.stderr  # said once (a black hole may not fail before the bound)
    report(f"collector {kind} for the whole run", "nothing (nowhere to send)",
           f"all {result.dropped} spans, counted in the closing line", result, base_result)


# --- 2. down for the first half; an 8 s restart mid-run -----------------------------------------------
def test_a_collector_restart_and_a_late_collector_lose_nothing(receiver: OTLPReceiver) -> None:
    """Fault: the collector is down for the first half of the run (it starts late), or restarts
    mid-run and is away 8 s. Kept: every span made meanwhile (well under the buffer), delivered
    once it is back. Lost: nothing."""
    late = OTLPReceiver().start()
    late.close()  # its ports are known and nothing listens on them yet
    base = _baseline(receiver, 400, 0.02)
    restarted = OTLPReceiver().start()
    restart = TrainingRun(_otlp(restarted.grpc_endpoint, OTEL_TRAIN_SHUTDOWN_TIMEOUT_S="10"), 400, 0.02)
    waits = TrainingRun(_otlp(late.grpc_endpoint, OTEL_TRAIN_SHUTDOWN_TIMEOUT_S="10"), 400, 0.02)
    try:
        restart.wait_for("STEP 60")
        restarted.close()
        time.sleep(8.0)  # the outage itself: what the fault is, not a timing assertion
        restarted.start()
        waits.wait_for("STEP 200")
        late.start()
        restart_result, restart_delivered = _finish(restart, restarted)
        late_result, late_delivered = _finish(waits, late)
        base_result, _ = _finish(base, receiver)
    finally:
        restarted.close()
        late.close()
    assert (restart_delivered, late_delivered) == (400, 400)
    assert "none dropped" in restart_result.stderr and "none dropped" in late_result.stderr
    assert restart_result.stderr.count("failed (UNAVAILABLE") == 1, restart_result.stderr
    report("collector restart, 8 s away mid-run", "every span made meanwhile, sent when it is back",
           "nothing", restart_result, base_result)
    report("collector down for the first half of the run", "every span, sent when it comes up", "nothing",
           late_result, base_result)


def test_an_outage_longer_than_the_buffer_loses_exactly_what_it_counts() -> None:
    """Fault: the collector is away while more spans are made than the buffer holds (64 here).
    Kept: the newest 64 spans. Lost: the oldest, and the closing line counts exactly them."""
    rec = OTLPReceiver().start()
    port = rec.grpc_port
    rec.close()
    run = TrainingRun(_otlp(f"http://127.0.0.1:{port}", OTEL_TRAIN_BUFFER_SIZE="64",
                            OTEL_TRAIN_SHUTDOWN_TIMEOUT_S="10"), 150, 0.005)
    try:
        run.wait_for("STEP 150")
        rec.start()
        result, _ = _finish(run)
        received = settle(rec, run.run_id)
    finally:
        rec.close()
    built = 150 * SPANS_PER_STEP
    assert result.dropped and result.dropped > 0
    assert len(received) == result.exported == built - result.dropped, result.stderr
    report("collector away past the buffer (OTEL_TRAIN_BUFFER_SIZE=64)", f"the newest {len(received)} spans",
           f"the oldest {result.dropped}, counted exactly", result, None)


# --- 3. a slow collector --------------------------------------------------------------------------------
def test_a_slow_collector_does_not_slow_the_loop(receiver: OTLPReceiver) -> None:
    """Fault: every export answered after 1.5 s, and none at all until the loop has made every
    step (what proves the loop never waits on one: it could not finish otherwise). Kept:
    everything (slowly). Lost: nothing. The loop's time is reported beside the unfaulted run's
    (the overhead benchmark is the measure)."""
    slow = OTLPReceiver().start()
    gate = threading.Event()  # no export answered until every step is made: the loop never waits on one
    slow.inject([Fault(delay_s=1.5, count=None, gate=gate)])
    try:
        base = _baseline(receiver, 300)
        faulted = TrainingRun(_otlp(slow.grpc_endpoint, OTEL_TRAIN_SHUTDOWN_TIMEOUT_S="10",
                                    OTEL_BSP_SCHEDULE_DELAY="500", OTEL_EXPORTER_OTLP_TIMEOUT="60000"), 300, 0.01)
        faulted.wait_for("STEP 300")
        gate.set()
        result, delivered = _finish(faulted, slow)
        base_result, _ = _finish(base, receiver)
    finally:
        slow.close()
    assert delivered == 300 and "none dropped" in result.stderr
    report("slow collector (each export answered after 1.5 s)", "everything", "nothing", result, base_result)


# --- 4. the status matrix, end to end (the full matrix per code: tests/test_transport.py) ---------------
@pytest.mark.parametrize(("protocol", "fault", "retried"), [
    ("grpc", Fault(grpc_code=grpc.StatusCode.UNAVAILABLE, count=2), True),
    ("grpc", Fault(grpc_code=grpc.StatusCode.RESOURCE_EXHAUSTED, retry_after_s=0.2), True),
    ("grpc", Fault(grpc_code=grpc.StatusCode.RESOURCE_EXHAUSTED), False),
    ("grpc", Fault(grpc_code=grpc.StatusCode.UNAUTHENTICATED), False),
    ("http/protobuf", Fault(http_status=503, retry_after_s=1, count=2), True),
    ("http/protobuf", Fault(http_status=401), False),
])
def test_retry_exactly_what_the_specification_allows(receiver: OTLPReceiver, protocol: str, fault: Fault,
                                                     retried: bool) -> None:
    """Fault: the first export(s) refused with a status. Retryable: kept, delivered on a later
    attempt (after the server's delay where it gave one). Not: that request's spans dropped,
    counted, and one message naming what to check."""
    faulty = OTLPReceiver().start()
    faulty.inject([dataclasses.replace(fault)])  # the receiver counts its copy down
    endpoint = faulty.grpc_endpoint if protocol == "grpc" else faulty.http_endpoint
    try:
        run = TrainingRun(_otlp(endpoint, OTEL_EXPORTER_OTLP_PROTOCOL=protocol, OTEL_TRAIN_SHUTDOWN_TIMEOUT_S="10",
                                OTEL_BSP_SCHEDULE_DELAY="200"), 40, 0.01)
        result, delivered = _finish(run, faulty)
    finally:
        faulty.close()
    refusals = [r for r in faulty.refused if r[1] == "traces"]
    code = fault.grpc_code.name if fault.grpc_code is not None else f"HTTP {fault.http_status}"
    if retried:
        assert delivered == 40 and "none dropped" in result.stderr, result.stderr
        assert len(refusals) == (fault.count or 1)
    else:
        assert len(refusals) == 1  # never tried again
        assert result.dropped and result.exported is not None
        assert result.exported + result.dropped == 40 * SPANS_PER_STEP, result.stderr
        (message,) = [line for line in result.stderr.splitlines() if "did not take an export" in line]
        assert code in message
        if "UNAUTHENTICATED" in code or "401" in code:
            assert "OTEL_EXPORTER_OTLP_HEADERS" in message


def test_one_export_never_waits_past_the_otlp_timeout(receiver: OTLPReceiver) -> None:
    """Fault: the first export is answered only after 4 s, the timeout is 1 s. That attempt is
    given up at the timeout (DEADLINE_EXCEEDED, retryable) and the request sent again: delivered."""
    slow = OTLPReceiver().start()
    slow.inject([Fault(delay_s=4.0, grpc_code=grpc.StatusCode.UNAVAILABLE)])
    try:
        run = TrainingRun(_otlp(slow.grpc_endpoint, OTEL_EXPORTER_OTLP_TIMEOUT="1000", OTEL_TRAIN_SHUTDOWN_TIMEOUT_S="10",
                                OTEL_BSP_SCHEDULE_DELAY="100"), 20, 0.01)
        result, delivered = _finish(run, slow)
    finally:
        slow.close()
    assert delivered == 20 and "none dropped" in result.stderr
    assert "DEADLINE_EXCEEDED" in result.stderr  # the client gave up first, at its timeout


# --- 5. signals and an uncaught exception ---------------------------------------------------------------
@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "exception"])
def test_a_rank_that_dies_delivers_every_completed_step_and_shows_where(receiver: OTLPReceiver, how: str) -> None:
    """Fault: SIGTERM or SIGINT while a step is open, or an exception out of the loop. Kept:
    every completed step; the open step and span end with status ERROR and an `exception`
    event. The process exits as it would have without us (the signal, or the exception's 1)."""
    base = _baseline(receiver, 20)
    # A bound a loaded machine's exporter starts in (it ends as soon as all is sent): with 2 s,
    # an exporter not ready 1.2 s after the signal left the trainer too little to take over.
    run = TrainingRun(_otlp(receiver.grpc_endpoint, OTEL_TRAIN_SHUTDOWN_TIMEOUT_S="10"), 20, 0.01,
                      mode="raise" if how == "exception" else "hold")
    if how != "exception":
        run.wait_for("HOLDING")
        sent = time.monotonic()
        run.proc.send_signal(getattr(signal, how))
    result = run.finish()
    exit_s = time.monotonic() - sent if how != "exception" else result.exit_s
    base_result, _ = _finish(base, receiver)
    # SIGINT: Python ends a KeyboardInterrupt by killing itself with SIGINT, as it would without us.
    expected = {"SIGTERM": -signal.SIGTERM, "SIGINT": -signal.SIGINT, "exception": 1}[how]
    assert result.returncode == expected, result.stderr
    if how == "exception":
        assert "RuntimeError: the loss went NaN" in result.stderr  # the user's traceback, unchanged
    spans = settle(receiver, run.run_id)
    completed = 20 if how != "exception" else 19
    assert len([s for s in step_spans(spans, run.run_id) if s["status_code"] != 2]) == completed
    errors = [s for s in spans if s["status_code"] == 2]
    assert {s["name"] for s in errors} >= {"train.step", "train.forward"}, [s["name"] for s in errors]
    for span in errors:
        (event,) = [e for e in span["events"] if e["name"] == semconv.EVENT_EXCEPTION]
        assert event["attributes"][semconv.EXCEPTION_TYPE] == span["attributes"][semconv.ERROR_TYPE]
        assert event["time_ns"] == span["end_ns"]
    result.exit_s = exit_s
    report(f"{how} mid-step" if how != "exception" else "uncaught exception in the loop",
           "every completed step; the open ones end ERROR with an exception event", "nothing", result,
           base_result)


def test_kill_9_loses_at_most_the_last_flush_interval(receiver: OTLPReceiver) -> None:
    """Fault: SIGKILL to the trainer alone. Kept: everything its worker had drained (every
    100 ms here, OTEL_TRAIN_FLUSH_INTERVAL_MS): the exporter process sees its input end and
    exports it. Lost: what was recorded since the last drain, and the open step. (Before the
    exporter process is up, what was recorded waits in the trainer and dies with it: the run
    waits for it here, as any run longer than its start-up does.)"""
    run = TrainingRun(_otlp(receiver.grpc_endpoint, FAULT_RUN_WAIT_READY="1"), 20, 0.05, mode="hold")
    run.wait_for("HOLDING")
    time.sleep(0.5)  # five flush intervals: every completed step has been drained
    run.proc.kill()
    result = run.finish()
    assert result.returncode == -signal.SIGKILL
    assert len(step_spans(settle(receiver, run.run_id), run.run_id)) == 20


# --- 6. DataLoader workers and os.fork() ------------------------------------------------------------------
WORKERS = """
import json, os, sys
import torch
from torch.utils.data import DataLoader, Dataset
import otel_train

class Numbers(Dataset):
    def __len__(self):
        return 16
    def __getitem__(self, i):
        with otel_train.span("load.item", i=i):   # explicit spans in a worker: never recorded
            return torch.tensor([float(i)])

if __name__ == "__main__":
    otel_train.init()
    steps = 0
    for kind in ("fork", "forkserver", "spawn", "persistent"):
        ctx = "fork" if kind == "persistent" else kind
        loader = DataLoader(Numbers(), batch_size=4, num_workers=2, multiprocessing_context=ctx,
                            persistent_workers=kind == "persistent")
        for epoch in range(2 if kind == "persistent" else 1):
            for batch in loader:
                with otel_train.step():
                    with otel_train.span("train.forward"):
                        batch.sum()
                steps += 1
    pid = os.fork()   # user code forking mid-run: the child records nothing and exits cleanly
    if pid == 0:
        with otel_train.step():
            pass
        os._exit(0)
    os.waitpid(pid, 0)
    print("SCENARIO " + json.dumps({"steps": steps}), flush=True)
"""


def test_dataloader_workers_and_fork_neither_hang_nor_corrupt(receiver: OTLPReceiver, tmp_path) -> None:
    """Fault: DataLoader workers (fork, forkserver, spawn, persistent) making explicit spans, and
    `os.fork()` in user code. What a child records is never created (documented), with one
    message; the trainer's spans are all there, once each, with no child's among them."""
    pytest.importorskip("torch")
    from support.procs import run_python

    run_id = "workers-" + os.urandom(3).hex()
    script = tmp_path / "workers.py"
    script.write_text(WORKERS)
    proc = run_python(script=script, env=_otlp(receiver.grpc_endpoint, OTEL_TRAIN_RUN_ID=run_id), timeout=240)
    spans = settle(receiver, run_id)
    steps = [s for s in spans if s["name"] == "train.step"]
    assert len(steps) == 3 * 4 + 2 * 4 == len(step_spans(spans, run_id))  # 16 items in batches of 4
    assert not [s for s in receiver.spans() if s["name"] == "load.item"]  # no worker's, under any run id
    assert len({s["span_id"] for s in spans}) == len(spans)  # no duplicates
    assert {s["resource"]["process.pid"] for s in spans} == {spans[0]["resource"]["process.pid"]}
    assert proc.stderr.count("spans exported") == 1, proc.stderr  # the trainer's closing line only
    # Said by worker 0 of each worker pool that started the runtime (forked workers inherit a
    # stopped one and say nothing).
    assert 1 <= proc.stderr.count("DataLoader worker processes are not recorded") <= 3, proc.stderr


# --- 7. bad input -------------------------------------------------------------------------------------
BAD_INPUT = """
import json, sys
import numpy as np
import otel_train
steps = 0
otel_train.tag("too-early")  # before any step: nowhere to go, said once each
otel_train.event("orphan")
otel_train.event("orphan")
for n in ("5", -1, 1.5, 2 ** 70, np.int64(9), True):
    with otel_train.step(n):
        steps += 1
otel_train.tag("early")      # between steps: tags the step just ended
with otel_train.step():
    with otel_train.span("train.forward", text="x" * 100_000, tensor=np.zeros((3, 3)), none=None,
                         raw=b"\\x00\\x01", nested={"a": {"b": 1}}, huge=list(range(1 << 20)),
                         mixed=[1, "a"], obj=object(), ok=3):
        pass
    steps += 1
print("SCENARIO " + json.dumps({"steps": steps}), flush=True)
"""


def test_bad_input_is_said_once_each_and_loses_nothing(tmp_path) -> None:
    """Fault: every setting invalid at once (the endpoint included), and attribute values and
    step numbers no backend accepts. Each gets one message naming it and what is allowed; the
    run goes on; every span is kept (to the local files, since the endpoint is invalid)."""
    from support.procs import run_python

    env = {"OTEL_TRAIN_RUN_ID": "../../escape", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://[::1",
           "OTEL_EXPORTER_OTLP_HEADERS": "Authorization: Bearer hunter2", "OTEL_TRAIN_BUFFER_SIZE": "99999999999",
           "OTEL_TRAIN_FLUSH_INTERVAL_MS": "soon", "OTEL_BSP_SCHEDULE_DELAY": "-1", "OTEL_TRAIN_STEP_SAMPLE": "0",
           "OTEL_EXPORTER_OTLP_PROTOCOL": "pigeon", "OTEL_TRAIN_EXPORT_MODE": "fiber", "OTEL_SDK_DISABLED": "maybe",
           "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "64", "OTEL_EXPORTER_OTLP_COMPRESSION": "zstd",
           "OTEL_EXPORTER_OTLP_TIMEOUT": "never", "OTEL_TRAIN_SHUTDOWN_TIMEOUT_S": "-3"}
    proc = run_python(BAD_INPUT, env=env, cwd=tmp_path, timeout=120)
    err = proc.stderr
    assert "Traceback" not in err and "hunter2" not in err
    for var in env:
        if var not in ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_EXPORTER_OTLP_HEADERS"):
            assert err.count(var) == 1, (var, err)
    assert "item 1 of 1" in err
    for text in ("step('5')", "step(-1)", "step(1.5)", "step(1180591620717411303424)", "step(True)",
                 "'tensor': type ndarray", "'none': None", "'raw': type bytes", "'nested': type dict",
                 "'huge': list of 1048576 items cut to 64", "'mixed': a list attribute", "'obj': type object",
                 "'text': value of 100000 characters cut to 64", "tag() outside any step",
                 "event() outside any step"):
        assert err.count(text) == 1, (text, err)
    assert not (tmp_path.parent / "escape").exists()  # the run id stayed one directory inside
    files = list((tmp_path / "otel-train").glob("*/traces-rank0.jsonl"))
    assert len(files) == 1 and files[0].parent.name == "_._.._escape"
    spans = list(read_spans(files[0]))
    steps = sorted(s["attributes"][semconv.TRAIN_STEP] for s in spans if s["name"] == "train.step")
    # "5" is 5; -1, 1.5, 2**70 and True each the next number; numpy's 9 is 9.
    assert steps == [5, 6, 7, 8, 9, 10, 11], steps
    (fwd,) = [s for s in spans if s["name"] == "train.forward"]
    assert len(fwd["attributes"]["huge"]) == 64 and len(fwd["attributes"]["text"]) == 64
    assert "none" not in fwd["attributes"] and fwd["attributes"]["ok"] == 3
    assert "none dropped" in err


# --- 8. the embedded default: two runs, an unwritable directory, a full disk ------------------------------
def test_two_runs_in_one_directory_never_clobber_each_other(tmp_path) -> None:
    runs = [TrainingRun({}, 10, 0.0, cwd=tmp_path, run_id=rid) for rid in ("same", "same", "other")]
    results = [run.finish() for run in runs]
    assert all(r.returncode == 0 for r in results)
    same = list(read_spans(tmp_path / "otel-train" / "same" / "traces-rank0.jsonl"))
    other = list(read_spans(tmp_path / "otel-train" / "other" / "traces-rank0.jsonl"))
    assert len([s for s in same if s["name"] == "train.step"]) == 20 and len(other) == 50
    launches = {s["resource"][semconv.ML_RUN_LAUNCH] for s in same}
    assert len(launches) == 2  # two launches under one run id: told apart,
    assert len({s["span_id"] for s in same}) == len(same)  # and no span id repeats across them


@pytest.mark.parametrize("fault", ["unwritable directory", "full disk"])
def test_an_unwritable_or_full_disk_is_said_once_and_counted(tmp_path, fault: str) -> None:
    """Fault: the output directory cannot be created (a file is in the way), or the disk fills up
    mid-run (RLIMIT_FSIZE: what a full disk does to the file). Kept: every line written before,
    whole. Lost: the rest, counted exactly; one message; training finishes."""
    (tmp_path / "base").mkdir()
    base = TrainingRun({}, 300, 0.0, cwd=tmp_path / "base")
    # Requests of at most 20 spans (~5 kB a line): however late a loaded machine's first drain
    # comes, lines fit under the 30 kB limit before it is reached.
    env = {"OTEL_BSP_SCHEDULE_DELAY": "50", "OTEL_TRAIN_FLUSH_INTERVAL_MS": "20", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "20"}
    if fault == "unwritable directory":
        (tmp_path / "blocked").write_text("a file where the directory should be")
        env["OTEL_TRAIN_OUTPUT_DIR"] = str(tmp_path / "blocked" / "out")
    else:
        env["FAULT_RUN_FSIZE"] = "30000"
    run = TrainingRun(env, 300, 0.002, cwd=tmp_path, run_id="disk")
    result, _ = _finish(run)
    base_result, _ = _finish(base)
    assert result.completed == 300
    built = 300 * SPANS_PER_STEP
    written = tmp_path / "otel-train" / "disk" / "traces-rank0.jsonl"
    kept = len(list(read_spans(written))) if written.exists() else 0
    assert result.exported == kept and result.dropped == built - kept, result.stderr
    assert 0 < result.dropped
    if fault == "full disk":
        assert 0 < kept and all(line.endswith("}") for line in written.read_text().splitlines())
    assert result.stderr.count("did not take an export") == 1, result.stderr
    report(f"embedded default: {fault}", f"{kept} spans, every line whole", f"{result.dropped} spans, counted",
           result, base_result)
