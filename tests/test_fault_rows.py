"""The fault matrix, round two (issue 53): inputs, settings and collectors that hung, killed or
silently emptied a run. Each test runs a real subprocess against a real (faulted) OTLP receiver
and compares the closing line's counts with what the receiver itself got.
"""

from __future__ import annotations

import base64
import os
import re
import time
from pathlib import Path

import signal

import grpc
import pytest
from support.fault_run import Result, TrainingRun, report, run_script, settle, step_spans
from support.otlp_receiver import BlackHoleListener, Fault, OTLPReceiver
from support.tls import TlsMaterial, make_tls

from otel_train.export.otlp_json import read_spans


def _env(receiver: OTLPReceiver, run_id: str, **extra: str) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.grpc_endpoint, "OTEL_TRAIN_RUN_ID": run_id,
            "OTEL_TRAIN_SHUTDOWN_TIMEOUT_S": "20", **extra}


# --- row 1: a misused span never hangs the process ----------------------------------------------
MISUSE = """
    import otel_train
    otel_train.init()
    sp = otel_train.span("reentered")
    with sp:
        with sp:          # the same object inside itself
            with sp:
                pass
    a, b = otel_train.span("a"), otel_train.span("b")
    a.__enter__(); b.__enter__()
    a.__exit__(None, None, None)           # out of order
    a.__enter__(); a.__exit__(None, None, None)
    b.__exit__(None, None, None)
    b.__exit__(None, None, None)           # twice
    for n in range(50):
        with otel_train.step():
            with otel_train.span("train.forward"):
                pass
    print("LOOP DONE", flush=True)
"""


def test_a_reentered_or_misordered_span_never_hangs_and_loses_nothing_else(receiver: OTLPReceiver) -> None:
    """Row 1. Before: `with sp: with sp:` made the span its own parent; the next span walked that
    cycle in C forever, holding the GIL (deaf to SIGTERM). Now: the inner entry is ignored,
    said once, and every other span arrives."""
    result = run_script(MISUSE, _env(receiver, "misuse"), timeout=60)
    assert result.returncode == 0 and "LOOP DONE" in result.stdout, (result.returncode, result.stderr)
    assert result.stderr.count("entered again while still open") == 1, result.stderr
    assert result.stderr.count("exited after it had ended") == 1, result.stderr
    assert "Traceback" not in result.stderr
    spans = settle(receiver, "misuse")
    names = [s["name"] for s in spans]
    # one "reentered" (the inner entries ignored), "a" twice, "b" once, 50 steps and forwards
    assert names.count("reentered") == 1 and names.count("a") == 2 and names.count("b") == 1, names
    assert names.count("train.step") == 50 and names.count("train.forward") == 50
    assert result.exported == len(spans) and result.dropped == 0, result.stderr


# --- row 2: no TLS setting can abort the process ------------------------------------------------
STEPS = 30
SPANS_PER_STEP = 5


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsMaterial:
    folder = tmp_path_factory.mktemp("tls")
    material = make_tls(folder)
    (folder / "not-pem.pem").write_text("this is not PEM\n")
    return material


def test_no_tls_setting_aborts_the_process_each_is_named_once_and_counted(tls: TlsMaterial) -> None:
    """Row 2. Before: a client key without its certificate (or the reverse) over gRPC made gRPC's
    C core abort the trainer at exit (SIGABRT, no closing line); a CA file that is not PEM made
    HTTP print tracebacks and the closing line say "none dropped" of 150 lost spans. Now each is
    named once (the settings, never a file's content), the run goes on without what was wrong,
    and the closing line counts exactly what the receiver got."""
    not_pem = str(Path(tls.ca_file).with_name("not-pem.pem"))
    ca = {"OTEL_EXPORTER_OTLP_CERTIFICATE": tls.ca_file}
    cases = {  # name: (protocol, settings, the message, delivered)
        "key only": ("grpc", {**ca, "OTEL_EXPORTER_OTLP_CLIENT_KEY": tls.key_file},
                     "mutual TLS needs both", True),
        "certificate only": ("grpc", {**ca, "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": tls.cert_file},
                             "mutual TLS needs both", True),
        "pair that does not match": ("grpc", {**ca, "OTEL_EXPORTER_OTLP_CLIENT_KEY": tls.key_file,
                                              "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": tls.other_ca_file},
                                     "not a PEM certificate chain", True),
        "key that is not PEM": ("http/protobuf", {**ca, "OTEL_EXPORTER_OTLP_CLIENT_KEY": not_pem,
                                                  "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": tls.cert_file},
                                "not a PEM certificate chain", True),
        "CA not PEM, HTTP": ("http/protobuf", {"OTEL_EXPORTER_OTLP_CERTIFICATE": not_pem},
                             "not a PEM file of CA certificates", False),
        "CA not PEM, gRPC": ("grpc", {"OTEL_EXPORTER_OTLP_CERTIFICATE": not_pem},
                             "not a PEM file of CA certificates", False),
    }
    with OTLPReceiver(tls=tls) as receiver:
        runs = {}
        for name, (protocol, settings, _, delivered) in cases.items():
            endpoint = receiver.grpc_endpoint if protocol == "grpc" else receiver.http_endpoint
            runs[name] = TrainingRun({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
                                      "OTEL_TRAIN_SHUTDOWN_TIMEOUT_S": "20" if delivered else "3", **settings}, STEPS)
        results = {name: run.finish() for name, run in runs.items()}
        got = {name: settle(receiver, run.run_id) for name, run in runs.items()}
    for name, (_, _, message, delivered) in cases.items():
        result, spans = results[name], got[name]
        assert result.returncode == 0 and result.completed == STEPS, (name, result.returncode, result.stderr)
        assert "Traceback" not in result.stderr and "Check failed" not in result.stderr, (name, result.stderr)
        assert not re.search(r"^[EWIF]\d{4} ", result.stderr, re.M), (name, result.stderr)  # gRPC's own log lines
        said = [line for line in result.stderr.splitlines() if message in line]
        assert len(said) == 1 and "OTEL_EXPORTER_OTLP_" in said[0], (name, result.stderr)
        assert result.exported == len(spans), (name, result.stderr, len(spans))
        if delivered:
            assert len(step_spans(spans, runs[name].run_id)) == STEPS and result.dropped == 0, (name, result.stderr)
        else:
            assert spans == [] and result.dropped == STEPS * SPANS_PER_STEP, (name, result.stderr)


# --- rows 6 and 7: no secret printed; a bad number or endpoint named, never fatal --------------------
@pytest.mark.parametrize("value", ["1e10", "1e300", "inf", "nan", "-1", "0"])
def test_a_shutdown_bound_out_of_range_is_named_and_the_default_used(receiver: OTLPReceiver, value: str) -> None:
    """Row 7. Before: 1e10 was accepted and raised OverflowError at exit (no closing line, spans
    lost uncounted); 1e300 printed a 15-line traceback. Now: one message naming the setting and
    the range, the default bound, every span delivered and counted."""
    run = TrainingRun({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.grpc_endpoint,
                       "OTEL_TRAIN_SHUTDOWN_TIMEOUT_S": value}, 10)
    result = run.finish()
    spans = settle(receiver, run.run_id)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    said = [line for line in result.stderr.splitlines() if "OTEL_TRAIN_SHUTDOWN_TIMEOUT_S" in line]
    assert len(said) == 1 and "<= 86400" in said[0], result.stderr
    assert result.exported == len(spans) == 10 * SPANS_PER_STEP and result.dropped == 0, result.stderr


def test_no_secret_from_a_header_or_an_endpoint_is_printed_and_userinfo_is_sent_as_basic_auth(
        receiver: OTLPReceiver) -> None:
    """Row 6. Before: a header value holding `%0A` made OTLP/HTTP print the bearer token three
    times (in http.client's error); an endpoint `http://alice:PASSWORD@host` printed the password
    in the failure and closing lines and never sent the credentials. Now the malformed item is
    named by its setting and key, never its value, and not sent; the endpoint is shown as
    `***@host`, its credentials sent as HTTP Basic authentication."""
    token, password = "tok-3f9a0c", "pw-b71e22"
    port = receiver.http_endpoint.rsplit(":", 1)[1]
    bad_header = TrainingRun({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint,
                              "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_TRAIN_SHUTDOWN_TIMEOUT_S": "20",
                              "OTEL_EXPORTER_OTLP_HEADERS": f"authorization=Bearer%20{token}%0A,x-team=ml"}, 10)
    userinfo = TrainingRun({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://alice:{password}@127.0.0.1:{port}",
                            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_TRAIN_SHUTDOWN_TIMEOUT_S": "20"}, 10)
    bad_port = TrainingRun({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://alice:{password}@127.0.0.1:99999",
                            "OTEL_TRAIN_SHUTDOWN_TIMEOUT_S": "5"}, 10)
    results = [bad_header.finish(), userinfo.finish(), bad_port.finish()]
    for result in results:
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
        assert token not in result.stderr and password not in result.stderr, result.stderr
        assert token not in "\n".join(result.lines) and password not in "\n".join(result.lines)
    said = [line for line in results[0].stderr.splitlines() if "OTEL_EXPORTER_OTLP_HEADERS" in line]
    assert len(said) == 1 and "'authorization'" in said[0] and "not sent" in said[0], results[0].stderr
    assert "***@127.0.0.1" in results[1].stderr and "***@127.0.0.1:99999" in results[2].stderr
    requests = {r.headers.get("x-team"): r for r in receiver.requests if r.signal == "traces"}
    assert "ml" in requests  # the good item still went
    basic = [r.headers.get("authorization") for r in receiver.requests if r.signal == "traces"
             and r.headers.get("authorization", "").startswith("Basic ")]
    assert basic and {base64.b64decode(b.split()[1]).decode() for b in basic} == {f"alice:{password}"}
    for result, run in zip(results[:2], (bad_header, userinfo)):
        spans = settle(receiver, run.run_id)
        assert result.exported == len(spans) == 10 * SPANS_PER_STEP, result.stderr


def test_an_endpoint_with_a_space_is_named_and_goes_to_local_files(tmp_path: Path) -> None:
    """Row 7. Before: `http://bad host:4317` was accepted and its failure named no setting. Now
    it is refused at start with one message naming OTEL_EXPORTER_OTLP_ENDPOINT, and the spans go
    to the local files (never another endpoint), all of them."""
    run = TrainingRun({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://bad host:4317"}, 10, cwd=tmp_path)
    result = run.finish()
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    said = [line for line in result.stderr.splitlines() if "OTEL_EXPORTER_OTLP_ENDPOINT" in line]
    assert len(said) == 1 and "without spaces" in said[0], result.stderr
    files = list((tmp_path / "otel-train").rglob("traces-rank0.jsonl"))
    assert len(files) == 1 and result.exported == len(list(read_spans(files[0]))) == 10 * SPANS_PER_STEP, result.stderr


# --- row 3: the exporter process never dies of its input --------------------------------------------
@pytest.mark.parametrize("size", ["64", "100", "128", "256"])
def test_a_small_buffer_never_kills_the_exporter(receiver: OTLPReceiver, size: str) -> None:
    """Row 3. Before: with OTEL_TRAIN_BUFFER_SIZE=64 (the documented minimum) to 256 the records
    that waited for a starting exporter overflowed, the strings they carried went in a
    `("strings", ...)` message the exporter process ignored, the next slots named strings it did
    not have (`packed_regions: a slot this recorder cannot have packed`) and the process died:
    0 of 300 exported. Now every span is exported or counted as the buffer's overflow."""
    run = TrainingRun({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.grpc_endpoint, "OTEL_TRAIN_BUFFER_SIZE": size,
                       "OTEL_TRAIN_SHUTDOWN_TIMEOUT_S": "20"}, 60)
    result = run.finish()
    spans = settle(receiver, run.run_id)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "failed" not in result.stderr.replace("0 (export failed", ""), result.stderr
    assert result.exported == len(spans) > 0, result.stderr
    assert result.exported + result.dropped == 60 * SPANS_PER_STEP, result.stderr
    report(f"OTEL_TRAIN_BUFFER_SIZE={size}, exporter still starting", f"{result.exported} of 300 spans",
           f"{result.dropped} (buffer full), counted", result, None)


HOSTILE = """
    import otel_train

    class Loud:
        def __str__(self):
            raise RuntimeError("str of a user's object")
        __repr__ = __str__

    class BadList(list):
        def __iter__(self):
            raise RuntimeError("iter")

    class BadMap(dict):
        def get(self, *a):
            raise RuntimeError("get")

    class Num(int):
        def __int__(self):
            raise RuntimeError("int")

    otel_train.init()
    carrier = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
    for n in range(40):
        with otel_train.step():
            otel_train.link(123)
            otel_train.link([carrier, 5, "00-bad"])
            otel_train.link(BadMap(traceparent="x"))
            with otel_train.span("train.forward", loud=Loud(), nested=BadList([1, 2]), num=Num(3), **{"": 1}):
                pass
            otel_train.event("hostile", value=Loud())
    print("LOOP DONE", flush=True)
"""


def test_hostile_links_and_attributes_are_said_once_and_every_span_is_kept(receiver: OTLPReceiver) -> None:
    """Row 3. Before: `otel_train.link(123)` or `link([...])` killed the exporter process with no
    message (0 of 400 kept); an attribute whose `__str__` raises did too (0 of 40 kept, and the
    closing line said "none dropped"). Now a carrier that is not a trace context is said once
    and ignored (the good one in a list is kept), a value that cannot be read is described by
    its type, and every span arrives."""
    result = run_script(HOSTILE, _env(receiver, "hostile"), timeout=90)
    assert result.returncode == 0 and "LOOP DONE" in result.stdout, result.stderr
    assert "Traceback" not in result.stderr and "Logging error" not in result.stderr, result.stderr
    assert result.stderr.count("is not a trace context") == 1, result.stderr
    spans = settle(receiver, "hostile")
    steps = [s for s in spans if s["name"] == "train.step"]
    forwards = [s for s in spans if s["name"] == "train.forward"]
    assert len(steps) == 40 and len(forwards) == 40, result.stderr
    assert all(len(s["links"]) == 1 for s in steps)
    assert forwards[0]["attributes"]["loud"] == "<Loud: str() failed>"
    assert result.exported == len(spans) and result.dropped == 0, result.stderr


# --- rows 4 and 5: delivery until the bound; counts that are what the receiver got --------------------
def test_a_collector_back_inside_the_shutdown_bound_gets_everything(receiver: OTLPReceiver) -> None:
    """Row 4. Before: a collector down for the whole run and back 3 s after the loop ended
    (bound 5 s) got 0 of 1,000 spans: the run's backoff (up to 5 s) put the retry past the
    bound. Now retries at shutdown come every 0.2 s and gRPC reconnects within 0.5 s."""
    endpoint = receiver.grpc_endpoint
    receiver.close()  # down, on the port the run is given
    run = TrainingRun({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_TRAIN_SHUTDOWN_TIMEOUT_S": "5"}, 200)
    run.wait_for("DONE")
    time.sleep(3.0)
    receiver.start()
    result = run.finish()
    spans = settle(receiver, run.run_id)
    assert result.returncode == 0, result.stderr
    assert len(step_spans(spans, run.run_id)) == 200, result.stderr
    assert result.exported == len(spans) == 200 * SPANS_PER_STEP and result.dropped == 0, result.stderr
    report("collector down all run, back 3 s into a 5 s bound", f"{len(spans)} of 1000 spans", "nothing",
           result, None)


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_collector_refusing_its_first_calls_then_taking_them_gets_everything(
        receiver: OTLPReceiver, protocol: str) -> None:
    """Row 4. Before: UNAVAILABLE (HTTP 503) for the first 4 calls, then OK: 0 of 1,500 spans
    delivered (a rerun 708, while the closing line said 563): the backoff of 0.5+1+2+4 s left
    no time for a last try in the 5 s bound. Now every span arrives and is counted."""
    receiver.inject([Fault(grpc_code=grpc.StatusCode.UNAVAILABLE, http_status=503, count=4)])
    endpoint = receiver.grpc_endpoint if protocol == "grpc" else receiver.http_endpoint
    run = TrainingRun({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
                       "OTEL_TRAIN_SHUTDOWN_TIMEOUT_S": "5"}, 300)
    result = run.finish()
    spans = settle(receiver, run.run_id)
    assert result.returncode == 0, result.stderr
    assert len(receiver.refused) == 4
    assert result.exported == len(spans) == 300 * SPANS_PER_STEP and result.dropped == 0, result.stderr
    report(f"{protocol}: UNAVAILABLE / 503 for 4 calls, then OK", f"{len(spans)} of 1500 spans", "nothing",
           result, None)


def test_a_collector_slower_than_the_timeout_is_counted_as_it_is(receiver: OTLPReceiver) -> None:
    """Row 5. Before: OTEL_EXPORTER_OTLP_TIMEOUT=1000 against a collector answering in 1.5 s: it
    received every span three times while the closing line said 0 exported. Now an unanswered
    request is retried with twice the timeout; the closing line counts each span once as
    exported and says how many may have arrived twice, which is what the receiver holds."""
    receiver.inject([Fault(delay_s=1.5, count=None)])
    run = TrainingRun({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.grpc_endpoint, "OTEL_EXPORTER_OTLP_TIMEOUT": "1000",
                       "OTEL_TRAIN_SHUTDOWN_TIMEOUT_S": "15"}, 100)
    result = run.finish()
    spans = settle(receiver, run.run_id, quiet_s=2.0)
    assert result.returncode == 0, result.stderr
    distinct = {s["span_id"] for s in spans}
    twice = re.search(r"(\d+) of the exported may have arrived twice", result.stderr)
    assert twice is not None, result.stderr
    assert result.exported == len(distinct) == 100 * SPANS_PER_STEP, result.stderr
    assert len(spans) == result.exported + int(twice.group(1)), (len(spans), result.stderr)
    report("collector answers in 1.5 s, OTEL_EXPORTER_OTLP_TIMEOUT=1000",
           f"{len(distinct)} of 500 spans; the receiver holds {len(spans)} (said: {twice.group(1)} may be twice)",
           "nothing", result, None)


# --- row 7: signals during the flush; a stopped exporter; the output folder; DataLoader workers ---------
@pytest.mark.parametrize("first, second", [("SIGTERM", "SIGTERM"), ("SIGINT", "SIGINT"), ("SIGTERM", "SIGINT")])
def test_a_second_signal_during_the_flush_keeps_the_closing_line(first: str, second: str) -> None:
    """Row 7. Before: a second Ctrl-C or SIGTERM while the final flush waited on a collector
    lost the closing line (and printed "Exception ignored in atexit callback"). Now it is said
    once and held until the flush ends within its bound; the process then ends by the signal."""
    with BlackHoleListener() as hole:
        run = TrainingRun({"OTEL_EXPORTER_OTLP_ENDPOINT": hole.endpoint, "OTEL_TRAIN_SHUTDOWN_TIMEOUT_S": "3"}, 20,
                          mode="hold")
        run.wait_for("HOLDING")
        run.proc.send_signal(getattr(signal, first))
        time.sleep(1.0)  # the flush waits on the black hole for the whole bound
        run.proc.send_signal(getattr(signal, second))
        result = run.finish()
    assert result.returncode == -getattr(signal, first), result.stderr
    assert "Exception ignored" not in result.stderr and "Traceback" not in result.stderr.replace(
        "Traceback (most recent call last):\n  File \"<string>\"", ""), result.stderr
    assert f"{second} during the final flush" in result.stderr, result.stderr
    assert len(result.closing()) == 1 and result.exported == 0, result.stderr
    assert result.dropped == 20 * SPANS_PER_STEP + 2, result.stderr  # and the open step and span, truncated


def test_a_stopped_exporter_is_explained_in_the_closing_line(receiver: OTLPReceiver) -> None:
    """Row 7. Before: an exporter process SIGSTOPped at exit took the bound and the closing line
    said 0 of 6,000 with no reason. Now it says the exporter had not finished and was killed,
    and its counts are still what the receiver got (nothing)."""
    run = TrainingRun({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.grpc_endpoint, "OTEL_TRAIN_SHUTDOWN_TIMEOUT_S": "3",
                       "FAULT_RUN_WAIT_READY": "1", "OTEL_TRAIN_FLUSH_INTERVAL_MS": "60000"}, 200, mode="hold")
    run.wait_for("HOLDING")
    children = [int(pid) for pid in Path(f"/proc/{run.proc.pid}/task/{run.proc.pid}/children").read_text().split()]
    assert children
    for pid in children:
        os.kill(pid, signal.SIGSTOP)
    run.proc.send_signal(signal.SIGTERM)
    result = run.finish()
    spans = settle(receiver, run.run_id)
    assert result.returncode == -signal.SIGTERM, result.stderr
    assert "had not finished at the bound" in result.stderr and "was killed" in result.stderr, result.stderr
    assert result.exported == len(spans) == 0 and result.dropped == 200 * SPANS_PER_STEP + 2, result.stderr
    report("exporter process SIGSTOPped, then SIGTERM to the trainer (bound 3 s)", "nothing (it cannot run)",
           f"all {result.dropped}, counted; the closing line says it was killed", result, None)


UMASK = """
    import os, stat
    os.umask(0)
    import otel_train
    otel_train.init()
    with otel_train.step():
        with otel_train.span("train.forward"):
            pass
    otel_train.shutdown()
    for folder in ("out", "out/deeper", "out/deeper/umask-run"):
        print(folder, oct(stat.S_IMODE(os.stat(folder).st_mode)))
"""


def test_the_output_folders_are_private_under_umask_000(tmp_path: Path) -> None:
    """Row 7. Before: under umask 000 the run's folder was 0700 but the folders above it
    (`otel-train/` itself) were 0777 (the files are 0600). Now each folder we create is 0700."""
    result = run_script(UMASK, {"OTEL_TRAIN_OUTPUT_DIR": "out/deeper", "OTEL_TRAIN_RUN_ID": "umask-run"},
                        cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    modes = dict(line.split() for line in result.stdout.splitlines())
    assert modes == {"out": "0o700", "out/deeper": "0o700", "out/deeper/umask-run": "0o700"}, modes


DATALOADER = """
    import torch
    from torch.utils.data import DataLoader, Dataset
    import otel_train

    class Items(Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            with otel_train.span("inside.worker"):
                return torch.tensor([i])

    otel_train.init()
    # A worker that initialises (its `worker_init_fn`, or a spawned worker's auto-init) is told once.
    loader = DataLoader(Items(), batch_size=2, num_workers=2, worker_init_fn=lambda worker: otel_train.init())
    for epoch in range(3):
        for batch in loader:
            with otel_train.step():
                pass
    print("LOOP DONE", flush=True)
"""


def test_the_dataloader_worker_notice_is_said_once_per_run(tmp_path: Path) -> None:
    """Row 7. Before: "not recorded in DataLoader workers" was said by worker 0 of every epoch
    (new worker processes each epoch). Now once per trainer; the steps are all kept."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    result = run_script(DATALOADER, {"TMPDIR": str(temp)}, cwd=tmp_path, timeout=180)
    assert result.returncode == 0 and "LOOP DONE" in result.stdout, result.stderr
    assert result.stderr.count("DataLoader worker processes are not recorded") == 1, result.stderr
    assert result.exported == 12 and result.dropped == 0, result.stderr
    # the once-a-run marker is the trainer's to remove at shutdown: no run leaves one behind
    assert not list(temp.glob("otel_train-*-dataloader-notice")), list(temp.iterdir())


# --- row 1's audit: every walk up the parents stops at a cycle -----------------------------------------
@pytest.mark.timeout(30)
def test_an_actors_spans_that_name_each_other_as_parents_still_go_out() -> None:
    """Row 1 (the audit). Regions exited out of order can record each other as parents; an
    inference actor's exporter held both and, flushing, walked that cycle forever. Now both go
    out at the flush."""
    from otel_train.export.actor_traces import ActorTraces

    traces, out = ActorTraces("run", 7), []
    traces.place(1, 2, lambda trace: (1, trace), out)
    traces.place(2, 1, lambda trace: (2, trace), out)
    assert out == []
    traces.flush(out)
    assert sorted(seq for seq, _ in out) == [1, 2] and traces.count == 0


def _bounds(result: Result) -> tuple[int, int]:
    """What the receiver may hold by the closing line: (exported, exported + unconfirmed + twice)."""
    extra = 0
    for pattern in (r"(\d+) of them unconfirmed", r"(\d+) of the exported may have arrived twice"):
        found = re.search(pattern, result.stderr)
        extra += int(found.group(1)) if found else 0
    assert result.exported is not None, result.stderr
    return result.exported, result.exported + extra


def test_short_parallel_runs_against_a_slow_collector_count_what_it_got(receiver: OTLPReceiver) -> None:
    """Row 5. Before: three short parallel runs said "0 exported" while the receiver got up to
    2,048 spans of each, and a slow collector's delivered spans were counted as failed (830-2,254
    of them). Now each closing line's exported count is at most what the receiver holds, and
    the receiver holds at most that plus what the line calls unconfirmed or possibly twice."""
    receiver.inject([Fault(delay_s=0.4, count=None)])
    runs = [TrainingRun({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.grpc_endpoint, "OTEL_TRAIN_SHUTDOWN_TIMEOUT_S": "2",
                         "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "256"}, 400, 0.0) for _ in range(3)]
    results = [run.finish() for run in runs]
    time.sleep(1.0)  # requests answered after their runs ended still arrive
    for run, result in zip(runs, results):
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
        got = len(settle(receiver, run.run_id))
        low, high = _bounds(result)
        assert low <= got <= high, (low, got, high, result.stderr)
        assert result.exported + result.dropped == 400 * SPANS_PER_STEP, result.stderr


def test_an_exporter_starved_at_start_loses_only_the_counted_overflow(receiver: OTLPReceiver) -> None:
    """Row 3. Before: an exporter process starved of CPU for its first 5 s (default buffer) died
    of the records that had waited for it (25 lines of "exporting 2048 records failed", 63,640
    spans lost beyond the counted overflow). Now what waited past the buffer is the only loss,
    counted, and every other span arrives."""
    run = TrainingRun({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.grpc_endpoint, "OTEL_TRAIN_BUFFER_SIZE": "2048",
                       "OTEL_TRAIN_TESTING_EXPORTER_START_DELAY_S": "3", "OTEL_TRAIN_SHUTDOWN_TIMEOUT_S": "30"},
                      2000, 0.002)
    result = run.finish()
    spans = settle(receiver, run.run_id)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "records failed" not in result.stderr and "exporter failed" not in result.stderr, result.stderr
    assert result.exported == len(spans) > 0, result.stderr
    assert result.exported + result.dropped == 2000 * SPANS_PER_STEP, result.stderr
    report("exporter process starved for its first 3 s, OTEL_TRAIN_BUFFER_SIZE=2048",
           f"{len(spans)} of 10000 spans", f"{result.dropped} (buffer full), counted", result, None)


def test_grpc_log_lines_stay_silent_where_the_trainer_exports_itself(tls: TlsMaterial) -> None:
    """Row 7. Before: gRPC's C core printed its own lines ("I1128 ... Handshake failed ...
    CERTIFICATE_VERIFY_FAILED") beside our one message wherever the training process exported
    itself (thread mode, or taking over from an exporter that never started). Now the first
    import of gRPC there is silenced, unless the user set GRPC_VERBOSITY or imported gRPC."""
    with OTLPReceiver(tls=tls) as receiver:
        run = TrainingRun({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.grpc_endpoint, "OTEL_TRAIN_SHUTDOWN_TIMEOUT_S": "3",
                           "OTEL_EXPORTER_OTLP_CERTIFICATE": tls.other_ca_file, "OTEL_TRAIN_EXPORT_MODE": "thread"}, 30)
        result = run.finish()
    assert result.returncode == 0 and result.exported == 0 and result.dropped == 30 * SPANS_PER_STEP, result.stderr
    assert len([line for line in result.stderr.splitlines() if "TLS handshake failed" in line]) == 1, result.stderr
    assert not re.search(r"^[EWIF]\d{4} ", result.stderr, re.M), result.stderr
