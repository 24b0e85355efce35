"""The patched functions that call torch's or the user's code inside them, as objects in C (`_entry.c`).

`torch.autograd.backward`, `_BaseDataLoaderIter.__next__`, `zero_grad`, `clip_grad_norm_` and
`GradScaler.step` run autograd, the user's dataset or torch's checks inside the call. Made as
Python functions, their frame (and the Python bodies' they fall back to) stood in the
traceback of every error raised there, between the user's frames and torch's. `make` returns
an `Entry` that does what the Python function does, in C: no frame of ours on the user's
stack, and an error that comes back through a body of ours loses those frames too (unless it
began in one). In C for that, not for speed: a Python function cannot take itself off the
stack it runs on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import MethodType
from typing import Any

from otel_train.detect import _entry
from otel_train.detect.compile import compiled, dynamo_compiling, tc
from otel_train.detect.state import caught_up, s
from otel_train.record import recorder

_entry.bind(compiled, dynamo_compiling, tc, s, caught_up, vars(recorder))
FETCH, CALL, RECORDED = _entry.FETCH, _entry.CALL, _entry.RECORDED


class MethodEntry(_entry.Entry):
    """An `Entry` set on a class. Dynamo traces a Python `__get__` (not a C one): while it
    traces, the method is its `for_dynamo` function with the instance bound by
    `functools.partial`, which it inlines (torch 2.11's Dynamo cannot trace `function.__get__`
    or `MethodType` and gave up on the whole frame); otherwise the entry, bound."""

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self
        if compiled.seen and dynamo_compiling():
            return functools.partial(getattr(self, "__original_fn"), obj)
        return MethodType(self, obj)


def make(original: Callable[..., Any], busy: Callable[[Any], bool] | None, owner: dict[str, Any], run: str,
         kind: int, for_dynamo: Callable[..., Any] | None = None, method: bool = False) -> Callable[..., Any]:
    """`original` replaced by an object that checks as the families' patched functions do and
    then calls `owner[run](original, iterator)` (FETCH), `owner[run](original, args, kwargs)`
    (CALL) or, while a run records, `owner[run](recorder._rec, s, original, args, kwargs)`
    (RECORDED). `busy` None: never busy.

    `for_dynamo`, a Python function that does the same, is what Dynamo traces in the object's place
    (it cannot trace C): the entry carries it as torch.jit's `script_if_tracing` wrappers carry
    theirs, under the two attributes Dynamo inlines through (`__original_fn`), and with `method`
    (the entry is set on a class) binds to it while Dynamo traces. Without one, a compiled
    function that calls the entry breaks its graph there."""
    made = (MethodEntry if method else _entry.Entry)(original, busy, owner, run, kind)
    functools.update_wrapper(made, original)
    if for_dynamo is not None:
        setattr(made, "__script_if_tracing_wrapper", True)
        setattr(made, "__original_fn", for_dynamo)
    return made


def lean(original: Callable[..., Any], wrapper: Callable[..., Any], method: bool) -> Callable[..., Any]:
    """A patch for what runs every step (`Patches.replace(owner, name, lambda original: lean(...))`):
    an `Entry` (C) calling `wrapper(original, args, kwargs)` (a method's `self` is `args[0]`;
    `method`: it is set on a class) with our frames taken out of a traceback, ~0.1 µs a call
    where a wrapt wrapper's binding (`Patches.wrap`) costs 0.6-1.3 µs and trips torch.compile's
    guards when a compiled function calls it; Dynamo traces `patched` in its place."""
    @functools.wraps(original)
    def patched(*args: Any, **kwargs: Any) -> Any:
        return wrapper(original, args, kwargs)
    return make(original, None, {"run": wrapper}, "run", CALL, for_dynamo=patched, method=method)
