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


@pytest.fixture(autouse=True)
def _no_otel_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """In-process tests start from a clean slate: no OTEL_* / torchrun variables, no live session."""
    import os

    for key in list(os.environ):
        if key.startswith("OTEL_") or key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK",
                                               "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID",
                                               "TORCHELASTIC_RESTART_COUNT", "MASTER_PORT", "MASTER_ADDR"):
            monkeypatch.delenv(key, raising=False)
    yield
    from otel_train import _runtime

    _runtime.shutdown(0.5)


class Harness:
    """otel_train initialised in-process with a fake clock and an in-memory exporter."""

    def __init__(self, **overrides: object) -> None:
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        import otel_train
        from otel_train.record.clock import FakeClock

        class KeepingReader(InMemoryMetricReader):
            """Keeps what it held at shutdown, so tests can read metrics after `finish()`."""

            final = None

            def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
                self.final = self.get_metrics_data()
                super().shutdown(timeout_millis=timeout_millis, **kwargs)

        self.exporter = InMemorySpanExporter()
        self.metrics = KeepingReader()
        self.clock = FakeClock()
        settings: dict[str, object] = dict(run_id="test-run", traces_exporter="none", metrics_exporter="none",
                                           flush_interval_ms=10**9)
        settings.update(overrides)
        self.run = otel_train.init(span_processors=[SimpleSpanProcessor(self.exporter)],
                                   metric_readers=[self.metrics], clock=self.clock, **settings)

    def finish(self) -> list:
        """Shut down (flushing everything) and return the finished spans in emission order."""
        import otel_train

        otel_train.shutdown(5.0)
        return list(self.exporter.get_finished_spans())

    def metric_points(self, name: str) -> list:
        """Data points of metric `name` as collected at shutdown (call after `finish()`)."""
        data = self.metrics.final
        points = []
        for rm in data.resource_metrics if data else ():
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name == name:
                        points.extend(metric.data.data_points)
        return points


@pytest.fixture
def harness() -> Harness:
    return Harness()


def by_name(spans: list, name: str) -> list:
    return [s for s in spans if s.name == name]
