"""torch.compile: the hooks step aside while Dynamo traces, and Dynamo skips their frames.

Everything on the hot path returns at once while torch.compile traces
(`torch.compiler.is_compiling()`, tested first so Dynamo folds it and guards on nothing of
ours). Outside traced code, our hooks and patched functions run eagerly between the frames
torch.compile captures, and Dynamo is told to skip their frames (`install`).
"""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Callable
from types import CodeType, FunctionType, ModuleType, SimpleNamespace
from typing import Any

import torch
from torch.compiler import is_compiling

from otel_train import _imports
from otel_train.detect import state

_log = logging.getLogger("otel_train")

__all__ = ["is_compiling", "dynamo_compiling", "tc", "compiled_anything", "install", "uninstall"]

# `torch.compile(module)` warns when global module hooks exist (they fire for the wrapper and
# the wrapped module); the outermost-forward rule already counts that pair once.
_COMPILE_HOOK_WARNING = r"Using `torch.compile\(module\)` when there are global hooks"

# `torch.compiler.is_compiling()` is two Python calls (it asks TorchScript first). The hooks that
# run every step ask the same with one: Dynamo folds `is_dynamo_compiling()` to True while it
# traces (so it neither reads the flag nor guards on it), and the flag is torch.export's tracing.
#: Use as `dynamo_compiling() or tc._is_compiling_flag`.
if hasattr(torch.compiler, "is_dynamo_compiling") and hasattr(torch.compiler, "_is_compiling_flag"):
    dynamo_compiling: Callable[[], bool] = torch.compiler.is_dynamo_compiling
    tc: Any = torch.compiler
else:  # another torch: the public check alone
    dynamo_compiling, tc = is_compiling, SimpleNamespace(_is_compiling_flag=False)

#: Modules whose code Dynamo skips: detection and the hot path it drives, not the integrations
#: (framework callbacks, never called from compiled code) or the clocks.
_OURS = ("otel_train.detect.", "otel_train.record.")
_NOT_OURS = ("otel_train.detect.integrations", "otel_train.record.clock")
_skipped_code: list[Any] = []


def compiled_anything() -> bool:
    """True once torch.compile has compiled a frame. Dynamo guards on the global hooks, so from
    then on they are never added or removed (that would compile every graph again); inside a
    compiled graph they cost nothing at run time anyway."""
    dynamo_utils = sys.modules.get("torch._dynamo.utils")
    return dynamo_utils is not None and dynamo_utils.counters["frames"]["total"] > 0


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
        from torch._dynamo.types import FrameAction, FrameExecStrategy
        for code in our_code():
            module.set_code_exec_strategy(code, FrameExecStrategy(FrameAction.SKIP, FrameAction.DEFAULT))
            _skipped_code.append(code)
    except Exception:  # noqa: BLE001 - an older or newer Dynamo: only the frame counters differ
        _log.debug("otel_train: cannot mark hooks as skipped for torch.compile", exc_info=True)


def _unskip_dynamo_frames() -> None:
    if not _skipped_code:
        return
    try:
        from torch._dynamo import eval_frame
        from torch._dynamo.types import FrameAction, FrameExecStrategy
        for code in _skipped_code:
            eval_frame.set_code_exec_strategy(code, FrameExecStrategy(FrameAction.DEFAULT, FrameAction.DEFAULT))
    except Exception:  # noqa: BLE001
        _log.debug("otel_train: cannot restore Dynamo's frame strategy for our hooks", exc_info=True)
    _skipped_code.clear()


def install() -> None:
    warnings.filterwarnings("ignore", message=_COMPILE_HOOK_WARNING, category=UserWarning)
    _imports.when_imported("torch._dynamo.eval_frame", _skip_dynamo_frames)


def uninstall() -> None:
    _imports.cancel(_skip_dynamo_frames)
    warnings.filters[:] = [f for f in warnings.filters if not (
        f[0] == "ignore" and getattr(f[1], "pattern", None) == _COMPILE_HOOK_WARNING)]
    getattr(warnings, "_filters_mutated", lambda: None)()
    _unskip_dynamo_frames()
