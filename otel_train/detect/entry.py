"""The patched functions that call the user's code inside them, as objects in C (`_entry.c`).

`torch.autograd.backward` and `_BaseDataLoaderIter.__next__` run autograd and the user's
dataset inside the call. Made as Python functions, their frame (and the Python bodies' they
fall back to) stood in the traceback of every error raised there, between the user's frames
and torch's, and each was one more Python call a micro-batch. `make` returns an `Entry` that
does what the Python function does, in C: no frame of ours on the user's stack, and an error
that comes back through a body of ours loses those frames too (unless it began in one).

Where `_entry` is not built, `make` returns None and each family keeps its Python function.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from otel_train.detect.compile import compiled, dynamo_compiling, tc
from otel_train.detect.state import caught_up, s

try:
    from otel_train.detect import _entry
except ImportError:
    _entry = None  # type: ignore[assignment]

if _entry is not None:
    _entry.bind(compiled, dynamo_compiling, tc, s, caught_up)
    FETCH, CALL = _entry.FETCH, _entry.CALL
else:
    FETCH, CALL = 0, 1


def make(original: Callable[..., Any], busy: Callable[[Any], bool], owner: dict[str, Any], run: str,
         kind: int) -> Callable[..., Any] | None:
    """`original` replaced by an object that checks as the families' patched functions do and
    then calls `owner[run](original, iterator)` (FETCH) or `owner[run](original, args, kwargs)`
    (CALL); None where the extension is not built."""
    if _entry is None:
        return None
    entry = _entry.Entry(original, busy, owner, run, kind)
    functools.update_wrapper(entry, original)
    return entry
