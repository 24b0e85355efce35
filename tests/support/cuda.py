"""What the CUDA tests share: an otel_train session on the device, and every `torch.cuda.Event`
query and read, by thread (the `event_calls` fixture)."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest


def started(run_id: str) -> Any:
    """CUDA initialised and otel_train started with an in-memory exporter (returned), exporting
    on its worker thread every 20 ms."""
    import torch
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import otel_train

    torch.cuda.init()
    exporter = InMemorySpanExporter()
    otel_train.init(span_processors=[SimpleSpanProcessor(exporter)], export_mode="thread",
                    traces_exporter="none", metrics_exporter="none", flush_interval_ms=20, run_id=run_id)
    return exporter


@pytest.fixture
def event_calls(monkeypatch: pytest.MonkeyPatch) -> Counter[tuple[int, str, bool]]:
    """(thread ident, method, were both events complete) for every query / elapsed_time call."""
    import torch

    calls: Counter[tuple[int, str, bool]] = Counter()
    query, elapsed = torch.cuda.Event.query, torch.cuda.Event.elapsed_time

    def logged_query(self: Any) -> bool:
        done = query(self)
        calls[(threading.get_ident(), "query", done)] += 1
        return done

    def logged_elapsed(self: Any, end: Any) -> float:
        calls[(threading.get_ident(), "elapsed_time", bool(query(self) and query(end)))] += 1
        return elapsed(self, end)

    monkeypatch.setattr(torch.cuda.Event, "query", logged_query)
    monkeypatch.setattr(torch.cuda.Event, "elapsed_time", logged_elapsed)
    if hasattr(torch, "Event"):
        # Device timing records `torch.Event`s on CUDA from torch 2.4 (`record/device.py`): a C type,
        # whose methods cannot be patched, so the factory finds this subclass in its place (its
        # `record()` the C one).
        generic = torch.Event
        g_query, g_elapsed = generic.query, generic.elapsed_time

        class LoggedEvent(generic):  # type: ignore[misc,valid-type]
            def query(self) -> bool:
                done = g_query(self)
                calls[(threading.get_ident(), "query", done)] += 1
                return done

            def elapsed_time(self, end: Any) -> float:
                calls[(threading.get_ident(), "elapsed_time", bool(g_query(self) and g_query(end)))] += 1
                return g_elapsed(self, end)

        monkeypatch.setattr(torch, "Event", LoggedEvent)
    return calls
