"""Every private torch, CPython and OpenTelemetry SDK name the package reaches, in one place.

Each access below says what it is, why no public API serves, and the versions it was checked
on; `tests/test_compat.py` has one test per access that fails loudly (naming the access) on a
torch, Python or SDK that removed or changed it, so a new release shows here first, not as a
silent loss of spans. Nothing here imports torch at import time: `import otel_train` stays light,
and the torch accessors are called only by `otel_train.detect`, which imports torch anyway.

Checked on: CPython 3.10.13, 3.11.7, 3.12.1, 3.13.0; torch 2.13.0 (CPU, the CI pin) and 2.11
(the H200 run, docs/benchmarks/2026-11-27-h200-device.md); opentelemetry-sdk 1.45.2. Where an
access is missing the code that uses it falls back as its docstring says.

Not wrapped here, and why: `sys._getframe` (CPython's documented frame access, called on hot
paths where a wrapper's call would cost more than the rest; `detect/` and `record/` use it
directly, `tests/test_compat.py` checks it); the C extensions' own reads of torch's attributes
(`detect/_entry.c`, `detect/_loops.c`: `_compiled_call_impl`, `_call_impl`,
`_is_compiling_flag`), which take their names from the C source and are covered by the same
tests through the Python names below.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, MutableMapping
from types import CodeType, SimpleNamespace
from typing import Any

# --- CPython -----------------------------------------------------------------------------------------


def multiprocessing_inheriting(process: Any) -> bool:
    """Whether `process` (`multiprocessing.current_process()`) is a spawned or forkserver child
    still re-importing its parent's main module: `BaseProcess._inheriting`, set by
    `multiprocessing.spawn.prepare` before `parent_process()` is. No public flag says so.
    CPython 3.10-3.13."""
    return bool(getattr(process, "_inheriting", False))


def multiprocessing_identity(process: Any) -> tuple[int, ...]:
    """`BaseProcess._identity`: (1,), (2,), (1, 3)... for the children `multiprocessing` started,
    () for a main process (what its default names, `Process-1:3`, are made of; no public
    accessor). CPython 3.10-3.13."""
    return tuple(getattr(process, "_identity", ()) or ())


def process_target(process: Any) -> Any:
    """`BaseProcess._target`: the function a `multiprocessing.Process` runs (no public accessor;
    `run()` calls it). CPython 3.10-3.13."""
    return getattr(process, "_target", None)


def module_initializing(module: Any) -> bool:
    """Whether `module` is still being imported: `module.__spec__._initializing`, which
    `importlib._bootstrap` sets around a module's execution (no public flag). CPython 3.10-3.13."""
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def warnings_filters_changed() -> None:
    """Tell `warnings` its filter list was edited in place (`warnings._filters_mutated()`), as
    `warnings.filterwarnings` does, so cached "already warned" registries are dropped. There is
    no public way to remove one filter. CPython 3.10-3.13; a Python without it: nothing to do."""
    getattr(warnings, "_filters_mutated", lambda: None)()


# --- OpenTelemetry SDK -------------------------------------------------------------------------------


def set_collect_callback(reader: Any, callback: Callable[..., Any]) -> None:
    """Register as a `MetricReader`'s provider: `MetricReader._set_collect_callback`, what the
    SDK's own `MeterProvider` calls (the package aggregates its metrics itself and hands the
    readers the SDK's `MetricsData`; `export/metrics.py` says why). opentelemetry-sdk 1.30-1.45."""
    reader._set_collect_callback(callback)


def reader_temporalities(reader: Any) -> dict[type, Any]:
    """A `MetricReader`'s temporality by instrument class, `_instrument_class_temporality` (set
    from its `preferred_temporality`; no public getter). opentelemetry-sdk 1.30-1.45; empty
    where it is gone (the caller then exports cumulative, the SDK's default)."""
    return dict(getattr(reader, "_instrument_class_temporality", {}) or {})


# --- torch -------------------------------------------------------------------------------------------


def cuda_capturing_check(torch: Any) -> Callable[[], bool]:
    """The current CUDA stream's capture check in C, `torch._C._cuda_isCurrentStreamCapturing`
    (the public `torch.cuda.is_current_stream_capturing` is a Python function around it), or the
    public one where this torch lacks it. torch 2.11, 2.13."""
    return getattr(torch._C, "_cuda_isCurrentStreamCapturing", torch.cuda.is_current_stream_capturing)


def xpu_compiled(xpu: Any) -> bool:
    """Whether this torch was built with XPU support: `torch.xpu._is_compiled()` (a compile-time
    fact; the public `is_available()` also asks the driver). True where it is missing (the caller
    then probes). torch 2.11, 2.13."""
    return bool(getattr(xpu, "_is_compiled", lambda: True)())


def compile_checks() -> tuple[Callable[[], bool], Any]:
    """`(dynamo_compiling, tc)` for the hooks' check `compiled.seen and dynamo_compiling() or
    tc._is_compiling_flag` (`detect/compile.py`): `torch.compiler.is_dynamo_compiling` and the
    module holding `torch.compiler._is_compiling_flag` (torch.export's tracing; the public
    `is_compiling()` costs two calls). A torch without them: the public check, flag never set.
    torch 2.11, 2.13."""
    import torch

    compiler = torch.compiler
    if hasattr(compiler, "is_dynamo_compiling") and hasattr(compiler, "_is_compiling_flag"):
        return compiler.is_dynamo_compiling, compiler
    return compiler.is_compiling, SimpleNamespace(_is_compiling_flag=False)


def dynamo_frames_compiled() -> bool:
    """Whether Dynamo has compiled a frame in this process: `torch._dynamo.utils.counters
    ["frames"]["total"]` (no public counter). Never imports Dynamo. torch 2.11, 2.13."""
    utils = sys.modules.get("torch._dynamo.utils")
    return utils is not None and utils.counters["frames"].get("total", 0) > 0


def dynamo_set_code_skipped(module: Any, code: CodeType, skipped: bool) -> None:
    """Have Dynamo skip (or no longer skip) the frames of `code`: `set_code_exec_strategy` of
    `torch._dynamo.eval_frame` (`module`) with a `FrameExecStrategy` (`torch._dynamo.types`);
    `torch.compiler.disable` would wrap the function, which the hooks' identity forbids.
    torch 2.11, 2.13; raises on a Dynamo without them (the caller logs and goes on)."""
    from torch._dynamo.types import FrameAction, FrameExecStrategy

    action = FrameAction.SKIP if skipped else FrameAction.DEFAULT
    module.set_code_exec_strategy(code, FrameExecStrategy(action, FrameAction.DEFAULT))


def global_forward_hook_tables() -> tuple[MutableMapping[int, Any], ...]:
    """torch's global forward hook tables: `_global_forward_pre_hooks`, `_global_forward_hooks`,
    `_global_forward_hooks_always_called` of `torch.nn.modules.module`. The public
    `register_module_forward_*_hook` returns a handle whose key torch picks; detection puts its
    own keys there so that its hooks never reach a user's pickled or copied objects
    (`detect/torch_hooks.py`). torch 2.11, 2.13."""
    from torch.nn.modules import module

    return (module._global_forward_pre_hooks, module._global_forward_hooks,
            module._global_forward_hooks_always_called)


def global_optimizer_hook_tables() -> tuple[MutableMapping[int, Any], MutableMapping[int, Any]]:
    """torch's global optimizer step hook tables, `_global_optimizer_pre_hooks` and
    `_global_optimizer_post_hooks` of `torch.optim.optimizer` (as `global_forward_hook_tables`).
    torch 2.11, 2.13."""
    from torch.optim import optimizer

    return optimizer._global_optimizer_pre_hooks, optimizer._global_optimizer_post_hooks


#: A module's own forward hook tables (what `__reduce_ex__` filters of ours). torch 2.11, 2.13.
MODULE_HOOK_TABLES = ("_forward_pre_hooks", "_forward_hooks", "_forward_hooks_always_called")

#: The attribute `torch.nn.Module.__call__` calls in place of `_call_impl` where an instance has
#: it (set by `Module.compile()`): a root module is timed from there. torch 2.11, 2.13.
FORWARD_SLOT = "_compiled_call_impl"


def module_call_with_slot() -> Any:
    """torch's `Module.__call__`, which looks for `FORWARD_SLOT` first; None where this torch has
    no such attribute (roots are then timed by hooks)."""
    import torch

    return torch.nn.Module.__call__ if hasattr(torch.nn.Module, FORWARD_SLOT) else None


def call_impl_code() -> CodeType:
    """The code of `torch.nn.Module._call_impl`, the frame every module call runs in (found on
    the stack to tell which module call is running). torch 2.11, 2.13."""
    import torch

    return torch.nn.Module._call_impl.__code__


def dataloader_iter_class() -> type:
    """`torch.utils.data.dataloader._BaseDataLoaderIter`, whose `__next__` every DataLoader
    iterator runs (the batch fetch is timed there; no public hook). torch 2.11, 2.13."""
    from torch.utils.data import dataloader

    return dataloader._BaseDataLoaderIter
