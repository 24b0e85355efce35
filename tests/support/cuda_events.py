"""The `event_calls` fixture of the CUDA tests: every `torch.cuda.Event` query and read, by thread."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest


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
    return calls
