"""Post-import hooks: run a function once a module is imported, without importing it ourselves.

`when_imported(name, fn)` calls `fn(module)` at once when `name` is already imported, else right
after its import finishes; `cancel(fn)` forgets `fn`. A module whose import is already under way
when the hook is asked for (one of ours, importing the library a hook waits for) is past the
finder: it says itself when it is done, with `done(__name__)` as its last line. This is how the instrumentation patches
Lightning, transformers and `torch.distributed.checkpoint` only if the program uses them (and
waits for torch itself when `import otel_train.auto` comes first), so `import otel_train` stays
light. A finder sits first in `sys.meta_path` only while some hook waits, and leaves when none
does, so `uninstrument()` leaves nothing behind.
"""

from __future__ import annotations

import importlib.abc
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

from otel_train import _compat

_log = logging.getLogger("otel_train")
_lock = threading.RLock()
_waiting: dict[str, list[Callable[[ModuleType], None]]] = {}
_finished: set[str] = set()  # modules that said `done()` (their spec still says initialising)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: asks the other finders, then wraps the loader to notify after exec."""

    def __init__(self) -> None:
        self._busy: set[str] = set()

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname not in _waiting or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = _find_with_others(self, fullname, path, target)
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_then_notify(module: ModuleType) -> None:
            try:
                exec_module(module)
            finally:
                try:
                    del loader.exec_module  # type: ignore[attr-defined]
                except AttributeError:
                    pass
            _notify(fullname, module)

        try:
            loader.exec_module = exec_then_notify  # type: ignore[method-assign]
        except AttributeError:  # a loader that takes no attributes: notify on the next lookup instead
            _log.debug("otel_train: cannot watch the import of %s", fullname)
        return spec


def _find_with_others(me: _Finder, fullname: str, path: Sequence[str] | None,
                      target: ModuleType | None) -> ModuleSpec | None:
    for finder in list(sys.meta_path):
        if finder is me:
            continue
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        spec = find(fullname, path, target)
        if spec is not None:
            return spec
    return None


_finder = _Finder()


def _notify(name: str, module: ModuleType) -> None:
    with _lock:
        hooks = _waiting.pop(name, [])
        _drop_finder_if_idle()
    for fn in hooks:
        _call(fn, module)


def _call(fn: Callable[[ModuleType], None], module: ModuleType) -> None:
    try:
        fn(module)
    except Exception:  # noqa: BLE001 - a failing hook must never break the user's import
        _log.warning("otel_train: instrumenting %s failed; it stays uninstrumented.",
                     getattr(module, "__name__", module), exc_info=True)


def _drop_finder_if_idle() -> None:
    if not _waiting and _finder in sys.meta_path:
        sys.meta_path.remove(_finder)


def when_imported(name: str, fn: Callable[[ModuleType], None]) -> None:
    """Call `fn(module)` now if `name` is imported, else once its import completes."""
    module = sys.modules.get(name)
    if module is not None and not _initializing(module):
        _call(fn, module)
        return
    with _lock:
        _waiting.setdefault(name, []).append(fn)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)


def done(name: str) -> None:
    """The last line of a module of ours that a hook may wait for while it is being imported
    (`otel_train.detect.integrations.*`): run the hooks waiting for it."""
    module = sys.modules.get(name)
    with _lock:
        _finished.add(name)
        waiting = name in _waiting
    if module is not None and waiting:
        _notify(name, module)


def initializing(name: str) -> bool:
    """Whether module `name` is being imported right now (in `sys.modules`, not finished)."""
    module = sys.modules.get(name)
    return module is not None and _initializing(module) and name not in _finished


def cancel(fn: Callable[[ModuleType], None]) -> None:
    """Forget every pending call of `fn`."""
    with _lock:
        for name in list(_waiting):
            _waiting[name] = [f for f in _waiting[name] if f is not fn and f != fn]
            if not _waiting[name]:
                del _waiting[name]
        _drop_finder_if_idle()


def waiting() -> dict[str, int]:
    """Module name -> hooks still waiting for it (for tests and debugging)."""
    with _lock:
        return {name: len(fns) for name, fns in _waiting.items()}


def _initializing(module: Any) -> bool:
    return _compat.module_initializing(module)
