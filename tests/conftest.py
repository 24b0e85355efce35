"""Shared pytest fixtures for the otel_train test suite."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# tests/ is not a package: make its helpers (`support.otlp_receiver`, ...) importable.
_TESTS_DIR = str(Path(__file__).resolve().parent)
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

from support.harness import Harness  # noqa: E402
from support.otlp_receiver import OTLPReceiver  # noqa: E402


@pytest.fixture(scope="session")
def otlp_receiver() -> Iterator[OTLPReceiver]:
    """A started in-process OTLP receiver (gRPC + HTTP), shared by the session."""
    receiver = OTLPReceiver().start()
    try:
        yield receiver
    finally:
        receiver.close()


@pytest.fixture
def fresh_receiver(otlp_receiver: OTLPReceiver) -> Iterator[OTLPReceiver]:
    """The session receiver, emptied of everything received before this test."""
    otlp_receiver.clear()
    yield otlp_receiver


@pytest.fixture(autouse=True)
def _no_otel_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """In-process tests start from a clean slate: no OTEL_* / torchrun variables, no live session."""
    import os

    for key in list(os.environ):
        if key.startswith("OTEL_") or key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK",
                                               "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID",
                                               "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "MASTER_PORT",
                                               "MASTER_ADDR"):
            monkeypatch.delenv(key, raising=False)
    yield
    from otel_train import _runtime
    from otel_train.record import span

    _runtime.shutdown(0.5)
    span.set_disabled(False)  # a disabled session leaves `otel_train.span` the no-op until the next init


@pytest.fixture
def harness() -> Harness:
    return Harness()
