"""What the public API attaches to the open step or region: tags, events and links.

`otel_train.tag/event/link` land here. Between steps a tag or event goes to the step just ended
(a record of its own, `KIND_TAG`/`KIND_EVENT`), and a link waits for the next step; outside
any step each is said once and dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from otel_train.record import recorder
from otel_train.record.misuse import misused
from otel_train.record.recorder import After, Region, Step, current_get, settle
from otel_train.wire.ids import format_traceparent, parse_traceparent
from otel_train.wire.schema import KIND_EVENT, KIND_TAG

_log = logging.getLogger("otel_train")

_said_outside: set[str] = set()


def _outside(what: str) -> None:
    """`tag()` / `event()` with no step to go to: said once for each, then dropped quietly."""
    if what not in _said_outside:
        _said_outside.add(what)
        _log.warning("otel_train: %s() outside any step (and, for event(), any span) has nowhere to go; it is "
                     "dropped. Call it inside `with otel_train.step():`, or right after a step to note that step.",
                     what)


def tag(name: str) -> None:
    """Tag the open step, or the step just ended when called between steps."""
    settle()
    r = recorder._rec if recorder._rec is not None else recorder.auto_init()
    if r is None:
        return  # disabled, shut down, or a DataLoader worker: nothing is recorded
    step = r.step
    if isinstance(step, Step):
        if step.tags is None:
            step.tags = [name]
        else:
            step.tags.append(name)
    elif isinstance(step, After):
        r.append((KIND_TAG, step.step.ref, name))
    else:
        _outside("tag")


def event(name: str, attrs: Mapping[str, Any] | None) -> None:
    """An instant on the innermost open region, else the open step, else the step just ended."""
    r = recorder._rec if recorder._rec is not None else recorder.auto_init()
    if r is None:
        return
    t = r.now()
    payload = (name, t, dict(attrs) if attrs else None)
    region = current_get()
    target: Region | Step | None = region if region is not None and region.rec is r else None
    if target is None and isinstance(r.step, Step):
        target = r.step
    if target is not None:
        events = target.events
        if events is None:
            target.events = events = []
        events.append(payload)
    elif isinstance(r.step, After):
        r.append((KIND_EVENT, r.step.step.ref, payload))
    else:
        _outside("event")


def link(carrier: Any) -> None:
    """Link the open step (or the next one) to the span that produced a sample: `carrier` is
    what `inject()` made (a dict with `traceparent`), a `traceparent` string, or a list of them.
    Kept as the `traceparent` text alone: the user's object never crosses to the exporter (an
    int there, or a mapping whose `get` raises, once took the whole run's spans with it)."""
    settle()
    r = recorder._rec
    if r is None or carrier is None:
        return
    for one in carrier if isinstance(carrier, (list, tuple)) else (carrier,):
        ids = parse_traceparent(one)
        if ids is None:
            misused("link", one)
            continue
        header = format_traceparent(*ids)
        step = r.step
        if isinstance(step, Step):
            if step.links is None:
                step.links = []
            step.links.append(header)
        else:
            r.pending_links.append(header)


def current_region() -> Region | None:
    region = current_get()
    return region if region is not None and region.rec is recorder._rec else None
