"""Security (issue 30): TLS with a bearer token, failing closed, and no secret in any exported
byte or printed line. Real training subprocesses (`support.fault_run`) against the suite's
receiver serving TLS with a CA made in the test (`support.tls`) and refusing a wrong token.
"""

from __future__ import annotations

import re
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.fault_run import TrainingRun, settle, step_spans
from support.otlp_receiver import OTLPReceiver
from support.tls import TlsMaterial, make_tls

STEPS = 8
SPANS_PER_STEP = 5


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsMaterial:
    return make_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def token() -> str:
    return f"tok-{uuid.uuid4().hex}"


def _env(endpoint: str, protocol: str, headers: str, **extra: str) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
            "OTEL_EXPORTER_OTLP_HEADERS": headers, "OTEL_TRAIN_SHUTDOWN_TIMEOUT_S": "2", **extra}


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_tls_and_a_bearer_token_deliver_and_anything_wrong_fails_closed_with_one_message(
        tls: TlsMaterial, token: str, protocol: str) -> None:
    """Right CA and token: every span arrives. The wrong CA: nothing is sent (no plaintext
    fallback: the receiver sees no request at all), every span is counted, one message names the
    certificate setting. A wrong token: refused once per request (never retried), counted, one
    message names the headers setting."""
    with OTLPReceiver(tls=tls, token=token) as receiver:
        endpoint = receiver.grpc_endpoint if protocol == "grpc" else receiver.http_endpoint
        assert endpoint.startswith("https://")
        runs = {
            # A bound that a loaded machine's TLS handshake fits in (it ends as soon as all is sent).
            "good": TrainingRun(_env(endpoint, protocol, f"authorization=Bearer%20{token}",
                                     OTEL_EXPORTER_OTLP_CERTIFICATE=tls.ca_file,
                                     OTEL_TRAIN_SHUTDOWN_TIMEOUT_S="20"), STEPS),
            # Retried until the bound: long enough for a loaded machine's exporter to start and fail.
            # GRPC_VERBOSITY=ERROR, a user's for their own gRPC: the exporter's says nothing anyway.
            "wrong CA": TrainingRun(_env(endpoint, protocol, f"authorization=Bearer%20{token}",
                                         OTEL_EXPORTER_OTLP_CERTIFICATE=tls.other_ca_file,
                                         OTEL_TRAIN_SHUTDOWN_TIMEOUT_S="6", GRPC_VERBOSITY="ERROR"), STEPS),
            # Never retried, so it ends as soon as it is refused: the bound only has to be long enough.
            "wrong token": TrainingRun(_env(endpoint, protocol, "authorization=Bearer%20not-the-token",
                                            OTEL_EXPORTER_OTLP_CERTIFICATE=tls.ca_file,
                                            OTEL_TRAIN_SHUTDOWN_TIMEOUT_S="20"), STEPS),
        }
        results = {name: run.finish() for name, run in runs.items()}
        got = {name: step_spans(settle(receiver, run.run_id), run.run_id) for name, run in runs.items()}
        refused = list(receiver.refused)
    for result in results.values():
        assert result.returncode == 0 and result.completed == STEPS, result.stderr
        assert "Traceback" not in result.stderr and token not in result.stderr
    good, wrong_ca, wrong_token = results["good"], results["wrong CA"], results["wrong token"]
    assert len(got["good"]) == STEPS and "none dropped" in good.stderr, good.stderr

    assert got["wrong CA"] == [] and wrong_ca.exported == 0, wrong_ca.stderr
    assert wrong_ca.dropped == STEPS * SPANS_PER_STEP, wrong_ca.stderr
    tls_lines = [line for line in wrong_ca.stderr.splitlines() if "OTEL_EXPORTER_OTLP_CERTIFICATE" in line]
    assert len(tls_lines) == 1 and "TLS" in tls_lines[0], wrong_ca.stderr
    assert not re.search(r"^[EWIF]\d{4} ", wrong_ca.stderr, re.M), wrong_ca.stderr  # gRPC's own log lines

    assert got["wrong token"] == [] and wrong_token.exported == 0
    assert wrong_token.dropped == STEPS * SPANS_PER_STEP, wrong_token.stderr
    auth_lines = [line for line in wrong_token.stderr.splitlines() if "did not take an export" in line]
    assert len(auth_lines) == 1 and "OTEL_EXPORTER_OTLP_HEADERS" in auth_lines[0], wrong_token.stderr
    assert ("UNAUTHENTICATED" if protocol == "grpc" else "HTTP 401") in auth_lines[0]
    # Refused requests were the wrong token's (traces, then metrics at exit): none retried.
    assert refused and {r[2] for r in refused} == {"unauthenticated"}


def test_no_secret_in_any_exported_byte_file_or_printed_line(tmp_path: Path, token: str) -> None:
    """A token planted in OTEL_EXPORTER_OTLP_HEADERS (a good item and a malformed one), in
    another environment variable and in the script's argv reaches the collector only as the
    header it is; no exported span, metric, local file or line on stdout/stderr holds it, and
    the resource carries no command-line arguments."""
    headers = f"authorization=Bearer%20{token},x-broken: {token}"
    env = {"OTEL_EXPORTER_OTLP_HEADERS": headers, "MY_SERVICE_API_KEY": token, "OTEL_TRAIN_SHUTDOWN_TIMEOUT_S": "20"}
    argv = ("--api-key", token, f"--token={token}")
    with OTLPReceiver(token=token) as receiver:
        sent = TrainingRun({**env, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.grpc_endpoint}, STEPS, args=argv)
        local = TrainingRun(env, STEPS, cwd=tmp_path, args=argv)  # the embedded default: files
        results = [sent.finish(), local.finish()]
        delivered = step_spans(settle(receiver, sent.run_id), sent.run_id)
        requests = receiver.requests
    assert len(delivered) == STEPS  # the good header item authenticated every request
    assert any(r.signal == "metrics" for r in requests)
    secret = token.encode()
    for request in requests:
        assert secret not in request.message.SerializeToString(), request.signal
        assert request.headers.get("authorization") == f"Bearer {token}"
    files = [p for p in (tmp_path / "otel-train").rglob("*") if p.is_file()]
    assert {p.name for p in files} == {"traces-rank0.jsonl", "metrics-rank0.jsonl"}
    for path in files:
        assert secret not in path.read_bytes(), path
    for result in results:
        assert result.returncode == 0, result.stderr
        assert token not in result.stderr and token not in "\n".join(result.lines)
        assert result.stderr.count("OTEL_EXPORTER_OTLP_HEADERS item 2 of 2") == 1, result.stderr
    resource = delivered[0]["resource"]
    assert "process.command_args" not in resource and "process.command_line" not in resource
    assert resource["process.command"] == "-c"  # the program only, never its arguments
    # The local files are the owner's only: they hold attribute values, paths and host names.
    run_dir = files[0].parent
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in files} == {0o600}
