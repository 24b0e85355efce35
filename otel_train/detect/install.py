"""Installing detection: every hook family in, or every one out.

`install()` uses torch's own hooks where torch has them and patches only where it has none
(plain functions for what runs every step, wrapt for the rest); `uninstall()` undoes every
one. Each family's module pairs its `install()` with the `uninstall()` that undoes it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from otel_train import _runtime
from otel_train.detect import (backward, batch, checkpoint, collectives, compile, data, forward, gc_pauses, optimizer,
                               state, torch_hooks)
from otel_train.detect.machine import finish
from otel_train.detect.patches import Patches
from otel_train.detect.state import s as _s

#: In install order; uninstalled in reverse. `compile` comes last: it marks the code of every
#: module loaded by then as Dynamo's to skip.
FAMILIES = (torch_hooks, forward, optimizer, gc_pauses, backward, data, checkpoint, collectives, compile)

#: Framework methods the integrations patched (`patch_once`), restored at `uninstall()`.
_framework = Patches()


def installed() -> bool:
    return state.installed


def install(lazy: bool = False) -> None:
    """Install every hook and patch (idempotent). `lazy`: initialise the runtime at the first
    training activity, not now (a `multiprocessing` child may turn out to be a DataLoader worker)."""
    if state.installed:
        return
    state.installed = True
    _s.reset()
    _s.lazy = lazy
    # shutdown() (explicit, at exit or on SIGTERM) first lets us close the last step at its real end.
    _runtime.before_shutdown(_at_exit)
    for family in FAMILIES:
        family.install()
    batch.install()


def uninstall() -> None:
    """Close what is open, then remove every hook and restore every patched function."""
    if not state.installed:
        return
    batch.uninstall()
    finish()
    state.installed = False
    for family in reversed(FAMILIES):
        family.uninstall()
    _framework.undo()
    _runtime.remove_before_shutdown(_at_exit)
    _s.reset()


def forked_trainer() -> None:
    """In a forked child that `_children` follows: what the parent's detection was in the middle
    of is not the child's; the child's own first training activity starts its runtime."""
    if not state.installed:
        return
    batch.b.notes.clear()
    batch.b.thread = threading.main_thread().ident
    _s.reset()
    _s.lazy = True


def claim() -> bool | None:
    """For framework callbacks: make sure detection runs. None when disabled (nothing may be
    installed), True when this call installed it (the caller uninstalls it), False otherwise."""
    if _runtime.sdk_disabled() or _runtime.init() is None:
        return None
    if state.installed:
        return False
    install()
    return True


def patch_once(owner: Any, name: str, wrapper: Callable[..., Any]) -> None:
    """For the integrations: patch a framework method until `uninstall()` (once, while installed)."""
    if state.installed and not _framework.has(owner, name):
        _framework.wrap(owner, name, wrapper)


def _at_exit() -> None:
    if state.installed:
        finish(cut=_runtime.cut_by() is not None)
