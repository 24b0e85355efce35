"""Shared pytest fixtures for the otel_train test suite."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# tests/ is not a package: make its helper modules (otlp_receiver, ...) importable.
_TESTS_DIR = str(Path(__file__).resolve().parent)
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

from otlp_receiver import OTLPReceiver  # noqa: E402


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
