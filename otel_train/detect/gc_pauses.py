"""Garbage-collection pauses: a `gc.callbacks` entry.

A full collection, or any pause of at least `GC_MIN_PAUSE_NS`, is a `train.gc` span: a
sibling that tags the step it happened in. Young-generation collections run thousands of
times a second for microseconds; those are left out. Before the first step there is no step to
attribute a pause to.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

from otel_train.detect.state import GC
from otel_train.detect.state import s as _s
from otel_train.record import direct, recorder

#: A young-generation collection becomes a span only when it pauses at least this long;
#: full collections always do.
GC_MIN_PAUSE_NS = 1_000_000


#: `batch.gc_noted` while detection's calls are batched: True where it took the pause.
noted: Callable[[str, dict[str, Any]], bool] | None = None


def gc_callback(phase: str, info: dict[str, Any]) -> None:
    if noted is not None and noted(phase, info):
        return
    pause(phase, info)


def pause(phase: str, info: dict[str, Any]) -> None:
    """A collection starts or stops (`gc.callbacks`' phase and info)."""
    r = recorder._rec
    if r is None:
        return
    s = _s
    if phase == "start":
        s.gc_t0 = r.now()
        return
    t0 = s.gc_t0
    if t0 is None:
        return
    s.gc_t0 = None
    t1 = r.now()
    if r.step is None or (info.get("generation", 2) < 2 and t1 - t0 < GC_MIN_PAUSE_NS):
        return  # before the first step there is no step to attribute a pause to
    direct.record(r, GC, None, t0, t1)


def install() -> None:
    gc.callbacks.append(gc_callback)


def uninstall() -> None:
    try:
        gc.callbacks.remove(gc_callback)
    except ValueError:
        pass
