"""The fault matrix, round two (issue 53): inputs, settings and collectors that hung, killed or
silently emptied a run. Each test runs a real subprocess against a real (faulted) OTLP receiver
and compares the closing line's counts with what the receiver itself got.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest
from support.fault_run import run_script, run_spans, settle
from support.otlp_receiver import OTLPReceiver


@pytest.fixture
def receiver() -> Iterator[OTLPReceiver]:
    rec = OTLPReceiver().start()
    try:
        yield rec
    finally:
        rec.close()


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
