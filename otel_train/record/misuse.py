"""What a misused region or step becomes: said once per kind, never raised into the caller.

The C hot path (`_hotpath.bind`) and the Python one (`recorder`) both call these: a region
entered twice or exited twice, a link that is not a trace context, a span name that is not a
str, a step number that is not an int from 0 to 2**63 - 1.
"""

from __future__ import annotations

import logging
import numbers
from typing import Any

_log = logging.getLogger("otel_train")

_MISUSES = {
    "reentered": "was entered again while still open (`with sp:` inside `with sp:` on the same object); "
                 "the inner entry and its exit are ignored: make a new `otel_train.span(...)` for each region",
    "exited": "was exited after it had ended (an `__exit__` twice); the second exit is ignored",
    "link": "is not a trace context: otel_train.link() takes what otel_train.inject() made (a dict with "
            "'traceparent'), a traceparent string, or a list of them; it is ignored",
}
_misuses_said: set[str] = set()


def misused(what: str, name: Any) -> None:
    """A region misused (`_MISUSES`): said once per kind, never raised into the caller."""
    if what in _misuses_said:
        return
    _misuses_said.add(what)
    try:
        shown = repr(name) if type(name) is str else f"<a {type(name).__name__}>"
    except Exception:  # noqa: BLE001 - a metaclass's __name__ is the user's code
        shown = "<an object>"
    _log.warning("otel_train: %s %s %s.", "link carrier" if what == "link" else "span", shown,
                 _MISUSES.get(what, what))


def span_name(name: Any) -> str:
    """A span name that is not a str, as text (said once): the exporter only takes str names.
    A str subclass (an enum's value) is its plain text; anything else its `str()`, or its type's
    name where that raises. Never raises."""
    try:
        text = str.__str__(name) if isinstance(name, str) else str(name)
        if type(text) is not str:
            text = str.__str__(text)
    except Exception:  # noqa: BLE001 - the user's __str__
        try:
            text = f"<{type(name).__name__}: str() failed>"
        except Exception:  # noqa: BLE001 - a metaclass's __name__
            text = "<span>"
    if not isinstance(name, str) and "name" not in _misuses_said:
        _misuses_said.add("name")
        _log.warning("otel_train: a span name is a %s, not a str; it is recorded as %r.",
                     type(name).__name__ if type(type(name).__name__) is str else "object", text)
    return text


STEP_MAX = (1 << 63) - 1
_said_steps: set[str] = set()


def step_number(n: Any, next_step: int) -> int:
    """A valid step number for an `n` given to `otel_train.step(n)` that is not an int from 0 to
    2**63 - 1: the same number where it plainly is one ("5", 5.0, a numpy integer), else the
    previous step + 1. Said once per kind of value; never raised into the training loop."""
    fixed: int | None = None
    if not isinstance(n, bool):
        try:
            if isinstance(n, numbers.Integral) or (isinstance(n, float) and n.is_integer()):
                fixed = int(n)
            elif isinstance(n, str) and n.strip().isdigit():
                fixed = int(n.strip())
        except (TypeError, ValueError, OverflowError):
            fixed = None
    if fixed is not None and not 0 <= fixed <= STEP_MAX:
        fixed = None
    if isinstance(n, numbers.Integral) and fixed is not None and not isinstance(n, bool):
        return fixed  # a numpy or other integer type: the same number, nothing to say
    problem = "" if fixed is not None else "/negative" if isinstance(n, (int, float)) and n < 0 else "/invalid"
    key = type(n).__name__ + problem
    if key not in _said_steps:
        _said_steps.add(key)
        used = f"using {fixed}" if fixed is not None else f"using {next_step} (the previous step + 1)"
        _log.warning("otel_train: step(%r): a step number is an integer from 0 to 2**63-1; %s.", n, used)
    return fixed if fixed is not None else next_step
