"""torch.compile: the hooks step aside while Dynamo traces, and Dynamo skips their frames.

Everything on the hot path returns at once while torch.compile traces. The check every hook
makes is `compiled.seen and dynamo_compiling() or tc._is_compiling_flag`: until anything was
compiled, `compiled.seen` is False and the check is two attribute reads, no call. It turns True
(and stays True) before Dynamo traces its first frame: at `torch.compile(...)` itself (patched
once at install), at Dynamo's compile-start callback (other entry points: `torch._dynamo.optimize`,
strict `torch.export`), or at install if something was compiled before. From then on Dynamo
folds `is_dynamo_compiling()` to True while it traces, so it never reads
`torch.compiler._is_compiling_flag` (True during a compile session: read while tracing, it
would be guarded on and fail at run time, one recompile per call). Outside traced code, our
hooks and patched functions run eagerly between the frames torch.compile captures, and Dynamo
is told to skip their frames (`install`).
"""

from __future__ import annotations

import functools
import logging
import sys
import warnings
from collections.abc import Callable
from types import CodeType, FunctionType, ModuleType
from typing import Any

import torch
from torch.compiler import is_compiling

from otel_train import _compat, _imports
from otel_train.detect import state
from otel_train.detect.patches import Patches

_log = logging.getLogger("otel_train")

__all__ = ["is_compiling", "dynamo_compiling", "tc", "compiled", "compiled_anything", "install", "uninstall"]

# `torch.compile(module)` warns when global module hooks exist (they fire for the wrapper and
# the wrapped module); the outermost-forward rule already counts that pair once.
_COMPILE_HOOK_WARNING = r"Using `torch.compile\(module\)` when there are global hooks"

# `torch.compiler.is_compiling()` is two Python calls (it asks TorchScript first). The hooks that
# run every step ask the same with one: Dynamo folds `is_dynamo_compiling()` to True while it
# traces (so it neither reads the flag nor guards on it), and the flag is torch.export's tracing.
#: Use as `compiled.seen and dynamo_compiling() or tc._is_compiling_flag` (module docstring).
dynamo_compiling, tc = _compat.compile_checks()  # another torch: the public check alone

#: Modules whose code Dynamo skips: detection, the hot path it drives, the record builder they
#: call (`wire.schema.region_record`) and the compat accessors (the device choice reads
#: `_compat.xpu_compiled` in the first compiled forward), not the integrations (framework
#: callbacks, never called from compiled code) or the clocks.
_OURS = ("otel_train.detect.", "otel_train.record.", "otel_train._compat", "otel_train.wire.schema")
_NOT_OURS = ("otel_train.detect.integrations", "otel_train.record.clock")
_skipped_code: list[Any] = []


class Compiled:
    """`seen`: torch.compile was called or Dynamo began to compile (never reset: Dynamo may have
    guarded on it being True)."""

    __slots__ = ("seen",)

    def __init__(self) -> None:
        self.seen = False


#: The one flag the hooks read first (`compiled.seen and dynamo_compiling() or tc._is_compiling_flag`).
compiled = Compiled()
_patches = Patches()


_when_seen: list[Callable[[], None]] = []


def when_seen(fn: Callable[[], None]) -> None:
    """Call `fn()` when `compiled.seen` turns True, before Dynamo traces anything
    (`roots.slots_to_hooks`)."""
    _when_seen.append(fn)


def _see() -> None:
    """`compiled.seen = True`, and what waits for it run once."""
    if compiled.seen:
        return
    compiled.seen = True
    for fn in _when_seen:
        try:
            fn()
        except Exception:  # noqa: BLE001 - never in torch.compile's way
            _log.warning("otel_train: could not make way for torch.compile (%s)", getattr(fn, "__qualname__", fn),
                         exc_info=True)


def compiled_anything() -> bool:
    """True once torch.compile may have compiled a frame. Dynamo guards on the global hooks, so
    from then on they are never added or removed (that would compile every graph again); inside
    a compiled graph they cost nothing at run time anyway."""
    return compiled.seen


def _frames_compiled() -> bool:
    return _compat.dynamo_frames_compiled()


def _on_compile_start(*_: Any) -> None:
    _see()


def _compile_patch(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def compile(*args: Any, **kwargs: Any) -> Any:
        _see()  # before anything is traced: the hooks' check never changes under a guard
        return original(*args, **kwargs)
    return compile


def _watch_dynamo(module: ModuleType) -> None:
    """Dynamo's compile-start callback: every entry point, `torch.compile` or not (forgotten by
    `torch._dynamo.reset()`, which `torch.compile`'s own patch does not depend on)."""
    if _frames_compiled():
        _see()
    try:
        module.callback_handler.register_start_callback(_on_compile_start)
    except Exception:  # noqa: BLE001 - another Dynamo: torch.compile's patch alone
        _log.debug("otel_train: cannot register a Dynamo compile-start callback", exc_info=True)


def _unwatch_dynamo() -> None:
    callback = sys.modules.get("torch._dynamo.callback")
    if callback is None:
        return
    try:
        callback.callback_handler.remove_start_callback(_on_compile_start)
    except Exception:  # noqa: BLE001 - already cleared (`torch._dynamo.reset()`)
        pass


def our_code() -> list[CodeType]:
    """The code of every function and method of the detection and hot-path modules, nested ones
    included."""
    found: dict[CodeType, None] = {}

    def add(code: CodeType) -> None:
        found[code] = None
        for const in code.co_consts:
            if isinstance(const, CodeType):
                add(const)

    modules = [module for name, module in list(sys.modules.items())
               if name.startswith(_OURS) and not name.startswith(_NOT_OURS) and module is not None]
    for module in modules:
        for obj in vars(module).values():
            if getattr(obj, "__module__", None) != module.__name__:
                continue
            members = vars(obj).values() if isinstance(obj, type) else (obj,)
            for member in members:
                for fn in (member, getattr(member, "fget", None), getattr(member, "__func__", None)):
                    # Only code written in that module: a decorated function's is often the
                    # decorator's, shared by every function it decorates (`contextmanager`'s
                    # `helper`), which must stay Dynamo's to judge.
                    if isinstance(fn, FunctionType) and fn.__code__.co_filename == module.__file__:
                        add(fn.__code__)
    return list(found)


def _skip_dynamo_frames(module: ModuleType) -> None:
    """Our hooks and patched functions run eagerly between the frames torch.compile captures
    (the compiled module's own hooks, a `.backward()` after a graph break), and Dynamo would
    otherwise try to compile each frame they and the recorder open, counting an attempt for
    every one. Skipped here, each frame still lets Dynamo see what it calls (the patched torch
    function); inside a traced frame Dynamo inlines them (`is_compiling()` comes first)."""
    if not state.installed:
        return
    try:
        for code in our_code():
            _compat.dynamo_set_code_skipped(module, code, True)
            _skipped_code.append(code)
    except Exception:  # noqa: BLE001 - an older or newer Dynamo: only the frame counters differ
        _log.debug("otel_train: cannot mark hooks as skipped for torch.compile", exc_info=True)


def _unskip_dynamo_frames() -> None:
    if not _skipped_code:
        return
    try:
        from torch._dynamo import eval_frame
        for code in _skipped_code:
            _compat.dynamo_set_code_skipped(eval_frame, code, False)
    except Exception:  # noqa: BLE001
        _log.debug("otel_train: cannot restore Dynamo's frame strategy for our hooks", exc_info=True)
    _skipped_code.clear()


def install() -> None:
    warnings.filterwarnings("ignore", message=_COMPILE_HOOK_WARNING, category=UserWarning)
    if _frames_compiled():
        _see()
    _patches.replace(torch, "compile", _compile_patch)
    _imports.when_imported("torch._dynamo.callback", _watch_dynamo)
    _imports.when_imported("torch._dynamo.eval_frame", _skip_dynamo_frames)


def uninstall() -> None:
    _imports.cancel(_skip_dynamo_frames)
    _imports.cancel(_watch_dynamo)
    _unwatch_dynamo()
    _patches.undo()
    warnings.filters[:] = [f for f in warnings.filters if not (
        f[0] == "ignore" and getattr(f[1], "pattern", None) == _COMPILE_HOOK_WARNING)]
    _compat.warnings_filters_changed()
    _unskip_dynamo_frames()
