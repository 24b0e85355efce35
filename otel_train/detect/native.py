"""Detection's C extensions: automatic detection runs on them, and stays off without them.

The hooks' bodies and the step machine's per-step work (`_loops`), the batched notes
(`_batch`) and the patched functions that keep our frames out of the user's tracebacks
(`_entry`) exist in C only: what each buys is in its header, and
docs/benchmarks/2026-11-28-what-detection-c-buys.md. They are built at install with the rest
of the package; where one cannot be imported (no compiler at install, a build for another
Python), automatic detection (`otel_train.auto`, `otel-train run`, the instrumentor, the
Lightning and Hugging Face callbacks, which then do nothing) says so once and installs
nothing, and explicit spans and steps work as before: the training runs on.

This module imports no other module of detection: `otel_train.detect` asks it first.
"""

from __future__ import annotations

import importlib
import logging

_log = logging.getLogger("otel_train")

#: Detection's extensions, each `otel_train.detect.<name>`.
EXTENSIONS = ("_loops", "_batch", "_entry")


def _missing() -> str | None:
    """The first extension that cannot be imported, with why; None when every one can."""
    for name in EXTENSIONS:
        try:
            importlib.import_module(f"{__package__}.{name}")
        except ImportError as err:
            return f"{__package__}.{name} ({err})"
    return None


#: What is missing (the extension and why), or None: decided once, at the first import.
MISSING = _missing()


def off_line() -> str:
    """The one line that says automatic detection is off, and what still works."""
    return (f"otel_train: automatic step detection is off: its C extension {MISSING} cannot be imported; "
            "explicit spans and steps (otel_train.span, otel_train.step) still work. Reinstall otel-train "
            "where a C compiler is available to turn it on.")


def say_off() -> None:
    """Say `off_line()`, once a process."""
    global _said
    if not _said:
        _said = True
        _log.warning("%s", off_line())


_said = False
