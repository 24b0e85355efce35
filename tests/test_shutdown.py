"""A dead, black-holed or slow collector costs the loop nothing, and shutdown stays bounded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from support.otlp_receiver import BlackHoleListener, unreachable_endpoint
from support.procs import clean_env, run_python

from otel_train import semconv
from otel_train.export.otlp_json import read_spans

LOOP = """
    import json, sys, time
    import otel_train
    otel_train.init()
    from otel_train import _runtime
    # The exporter up first (a loaded machine may take longer than the bound to start it): the
    # case here is an exporter stuck on the collector, not one still starting (test_a_short_run...).
    getattr(_runtime.state().worker.sink, "ready", None) is None or _runtime.state().worker.sink.ready.wait(120)
    worker = _runtime.state().worker
    stop = worker.stop

    def stop_by(deadline):  # what shutdown gives the worker: the time left to the deadline it set
        print(json.dumps({"stop_budget_s": deadline - time.monotonic()}), flush=True)
        return stop(deadline)
    worker.stop = stop_by
    errors = 0
    for n in range(int(sys.argv[1])):
        try:
            with otel_train.step():
                for name in ("train.data", "train.forward", "train.backward", "train.optimizer"):
                    with otel_train.span(name):
                        pass
        except Exception:
            errors += 1
    print(json.dumps({"errors": errors}), flush=True)
    if sys.argv[2] == "explicit":
        otel_train.shutdown(timeout_s=float(sys.argv[3]))
"""
BOUND_S = 1.0
#: The exporter would wait this long on the collector (OTEL_EXPORTER_OTLP_TIMEOUT), and the run
#: is given `HANG_GUARD_S` to end: only the shutdown bound can end it in time. A guard against a
#: hang, sixty times the bound, not a claim about how fast a host is.
EXPORTER_WAITS_S = 600
HANG_GUARD_S = 60


def _run(endpoint: str, mode: str, how: str = "explicit", steps: int = 2000) -> tuple[dict, str]:
    """The run's report (its JSON lines, merged) and stderr; it must end within `HANG_GUARD_S`."""
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_TRAIN_EXPORT_MODE": mode,
           "OTEL_TRAIN_SHUTDOWN_TIMEOUT_S": str(BOUND_S), "OTEL_TRAIN_FLUSH_INTERVAL_MS": "50",
           "OTEL_EXPORTER_OTLP_TIMEOUT": str(EXPORTER_WAITS_S * 1000)}
    proc = run_python(LOOP, args=[str(steps), how, str(BOUND_S)], env=env, timeout=HANG_GUARD_S)
    report: dict = {}
    for line in proc.stdout.splitlines():
        report.update(json.loads(line))
    return report, proc.stderr


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_unreachable_collector_neither_raises_nor_delays_exit(mode: str) -> None:
    report, stderr = _run(unreachable_endpoint(), mode)
    assert report["errors"] == 0
    assert report["stop_budget_s"] <= BOUND_S  # the worker was given the bound, not the exporter's wait
    assert "Traceback" not in stderr
    # What could not be exported is counted and said, never silent.
    assert ("export failed or cut off at shutdown" in stderr) or ("shutdown bound" in stderr), stderr


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_black_holed_collector_is_bounded_at_exit(mode: str) -> None:
    with BlackHoleListener() as hole:
        report, stderr = _run(hole.endpoint, mode, how="atexit")
        assert hole.connection_count >= 1, stderr  # the exporter really was stuck on it
    assert report["errors"] == 0
    assert report["stop_budget_s"] <= BOUND_S  # the configured bound, at exit too
    assert "otel_train:" in stderr and ("dropped" in stderr or "shutdown bound" in stderr), stderr


NO_THREADS_AT_EXIT = """
    import atexit, sys, threading
    import otel_train
    otel_train.init()
    for n in range(8):
        with otel_train.step():
            for name in ("train.data", "train.forward", "train.backward", "train.optimizer"):
                with otel_train.span(name):
                    pass

    def no_threads_from_here():  # as Python 3.12+ at interpreter exit
        def refuse(self):
            raise RuntimeError("can't create new thread at interpreter shutdown")
        threading.Thread.start = refuse
    atexit.register(no_threads_from_here)  # runs before otel_train's exit hook (registered first)
"""


@pytest.mark.parametrize("mode", ["process", "thread", "process not ready"])
def test_exit_where_no_thread_can_start_still_exports_every_span(mode: str, tmp_path) -> None:
    """Python 3.12+ refuses to start a thread in an `atexit` hook; shutdown at exit closes on the
    exiting thread instead (it said "shutdown failed" and lost what was buffered). With the
    exporter process still starting, the training process exports in its place, its metrics
    reader without the ticker thread it cannot start."""
    from support.procs import slow_exporter_start

    env = {"OTEL_TRAIN_EXPORT_MODE": mode.split()[0], "OTEL_TRAIN_OUTPUT_DIR": str(tmp_path),
           "OTEL_TRAIN_RUN_ID": "exit"}
    if mode == "process not ready":
        env.update({**slow_exporter_start(60), "OTEL_TRAIN_SHUTDOWN_TIMEOUT_S": "5"})
    proc = run_python(NO_THREADS_AT_EXIT, env=env, timeout=120)
    assert "shutdown failed" not in proc.stderr and "40 spans exported" in proc.stderr, proc.stderr
    assert "none dropped" in proc.stderr
    spans = list(read_spans(tmp_path / "exit" / "traces-rank0.jsonl"))
    assert len(spans) == 40 and sum(s["name"] == semconv.SPAN_STEP for s in spans) == 8
    metrics = (tmp_path / "exit" / "metrics-rank0.jsonl").read_text()
    assert semconv.METRIC_STEP_DURATION in metrics


def test_sigterm_flushes_truncates_and_reraises(tmp_path) -> None:
    code = textwrap.dedent("""
        import sys, time
        import otel_train
        otel_train.init(run_id="term")
        for n in range(5):
            with otel_train.step():
                with otel_train.span("train.forward"):
                    time.sleep(0.01)
        with otel_train.step():  # step 5 is open, with its forward, when SIGTERM arrives
            with otel_train.span("train.forward"):
                print("ready", flush=True)
                time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, env=clean_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM, stderr
    assert "spans exported to" in stderr
    spans = list(read_spans(tmp_path / "otel-train" / "term" / "traces-rank0.jsonl"))
    steps = {s["attributes"][semconv.TRAIN_STEP]: s for s in spans if s["name"] == "train.step"}
    assert sorted(steps) == [0, 1, 2, 3, 4, 5]
    truncated = sorted((s["name"], s["attributes"][semconv.TRAIN_STEP]) for s in spans
                       if s["attributes"].get(semconv.TRUNCATED))
    assert truncated == [("train.forward", 5), ("train.step", 5)]


def test_exporter_process_death_falls_back_without_losing_the_loop(tmp_path) -> None:
    code = """
        import os, signal, otel_train
        from otel_train import _runtime
        otel_train.init(run_id="fallback")
        for n in range(3):
            with otel_train.step():
                pass
        assert _runtime.state().worker.flush(60.0)  # the process is ready and has exported them
        os.kill(_runtime.state().worker.sink.proc.pid, signal.SIGKILL)
        _runtime.state().worker.sink.proc.wait()
        for n in range(3):
            with otel_train.step():
                pass
        print("ok")
    """
    proc = run_python(code, cwd=tmp_path, timeout=60)
    assert "exporting from a thread" in proc.stderr
    steps = [s for s in read_spans(tmp_path / "otel-train" / "fallback" / "traces-rank0.jsonl")
             if s["name"] == "train.step"]
    # Steps sent after the death are exported by the fallback; nothing after it is lost.
    assert {3, 4, 5} <= {s["attributes"][semconv.TRAIN_STEP] for s in steps}


@pytest.mark.parametrize(("priority", "policy", "nice"), [("low", "SCHED_OTHER", 10), ("idle", "SCHED_IDLE", 10),
                                                          ("normal", "SCHED_OTHER", 0)])
def test_exporter_process_runs_at_the_configured_priority(tmp_path, priority: str, policy: str, nice: int) -> None:
    if not hasattr(os, "sched_getscheduler") or not hasattr(os, policy):
        pytest.skip("Linux scheduling policies only")
    code = f"""
        import os, otel_train
        from otel_train import _runtime
        otel_train.init(run_id="prio", exporter_priority="{priority}")
        with otel_train.step():
            pass
        _runtime.state().worker.flush(30.0)  # set up and exporting: its priority is in place
        pid = _runtime.state().worker.sink.proc.pid
        print(os.sched_getscheduler(pid), os.getpriority(os.PRIO_PROCESS, pid) - os.getpriority(os.PRIO_PROCESS, 0))
    """
    proc = run_python(code, cwd=tmp_path, timeout=60)
    got_policy, got_nice = proc.stdout.split()[-2:]
    assert int(got_policy) == getattr(os, policy) and int(got_nice) == nice


def test_a_full_buffer_is_said_once_while_it_happens(tmp_path) -> None:
    code = """
        import otel_train
        from otel_train import _runtime
        otel_train.init(run_id="full", buffer_size=64, flush_interval_ms=10**7)
        # Ready first: until then records also wait in the sink, bounded by the same size.
        _runtime.state().worker.sink.ready.wait(60)
        for n in range(100):
            with otel_train.span("s"):
                pass
        _runtime.state().worker.drain()
        for n in range(100):
            with otel_train.span("s"):
                pass
        _runtime.state().worker.drain()
    """
    proc = run_python(code, cwd=tmp_path, timeout=60)
    assert proc.stderr.count("the buffer of 64 records overflowed") == 1, proc.stderr
    assert "dropped: 72 (buffer full)" in proc.stderr


@pytest.mark.parametrize("buffer", [65536, 64])
def test_a_short_run_on_a_busy_node_delivers_what_it_recorded(fresh_receiver, buffer: int) -> None:
    """Regression (0 of 23 spans from a short Lightning run at load average > 10): the exporter
    process starts at low CPU priority, a loaded node starved it, it was not ready when the run
    ended, and shutdown killed it at the bound with every record it had been sent. Here its
    start is made to take ten minutes (`procs.slow_exporter_start`): the records wait in the
    training process, which exports them itself at shutdown, within the bound: the run ends
    long before the exporter could have started (the harness's deadline, a tenth of that
    delay, fails a shutdown that waited for it). With a buffer smaller than the run, the oldest
    that waited are dropped and counted exactly."""
    from support.fault_run import TrainingRun, settle, step_spans
    from support.procs import slow_exporter_start

    run = TrainingRun({"OTEL_EXPORTER_OTLP_ENDPOINT": fresh_receiver.grpc_endpoint, **slow_exporter_start(600),
                       "OTEL_TRAIN_SHUTDOWN_TIMEOUT_S": "5", "OTEL_TRAIN_BUFFER_SIZE": str(buffer)}, 30, 0.01)
    result = run.finish(timeout=60)
    assert result.returncode == 0, result.stderr
    received = settle(fresh_receiver, run.run_id)
    assert len(received) == result.exported and result.exported + result.dropped == 30 * 5, result.stderr
    if buffer == 65536:
        assert len(step_spans(received, run.run_id)) == 30 and "none dropped" in result.stderr
    else:  # the oldest waited past the buffer: dropped and counted; the newest delivered
        assert result.dropped > 0 and result.exported >= 40
        assert 29 in {s["attributes"][semconv.TRAIN_STEP] for s in step_spans(received, run.run_id)}


def test_each_closing_line_reaches_stderr_in_one_write() -> None:
    """Under torchrun every rank shares one stderr pipe; a line written as text, then newline,
    came out as `...none droppedotel_train: rank 0: ...` (two ranks on one line). A pipe keeps one
    write whole, so each line of ours must be one write with its newline."""
    proc = run_python("""
        import json, sys
        writes = []
        class Counting:
            def write(self, text):
                writes.append(text)
                return len(text)
            def flush(self):
                pass
        import otel_train
        otel_train.init()
        with otel_train.step():
            with otel_train.span("train.forward"):
                pass
        real, sys.stderr = sys.stderr, Counting()
        otel_train.shutdown()
        sys.stderr = real
        print(json.dumps(writes))
    """, env={"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"})
    writes = json.loads(proc.stdout.strip().splitlines()[-1])
    closing = [text for text in writes if "spans emitted" in text]
    assert closing and all(text.startswith("otel_train:") and text.endswith("\n") for text in closing), writes
    assert "\n" not in writes, writes  # no newline written on its own
