"""Checkpoints: `torch.save` and `torch.distributed.checkpoint` save / load are patched.

Each call is one `train.checkpoint` span, a sibling after the step it follows (which it
closes first when that step's update is done) and which it tags; one before the first step
joins the first step's trace. A `torch.save` inside a batch
fetch (a dataset caching itself) is not a checkpoint, nor one of a bare tensor storage into a
buffer: that is how torch pickles a storage (`pickle.dumps(model)`, `copy.deepcopy`,
multiprocessing), once per storage.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from otel_train import _imports
from otel_train.detect import batch, coverage, state
from otel_train.detect.compile import compiled as _c, dynamo_compiling, tc
from otel_train.detect.machine import close_if_complete, drop_pending_zero_grads, end_eval
from otel_train.detect.patches import Patches
from otel_train.detect.roots import roots
from otel_train.detect.state import CHECKPOINT, region
from otel_train.detect.state import s as _s
from otel_train.record import direct, recorder
from otel_train.record.recorder import Recorder

patches = Patches()


def checkpoint_wrapper(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
    """A wrapt wrapper: the call is one `train.checkpoint` span (integrations use it too)."""
    recorder.settle()
    s = _s
    if s.ckpt_depth or batch.fetching() or _c.seen and dynamo_compiling() or tc._is_compiling_flag \
            or _pickling_a_storage(args):
        return wrapped(*args, **kwargs)
    r = recorder._rec
    if r is None:
        return wrapped(*args, **kwargs)
    _checkpoint_begin(r)
    s.ckpt_depth = 1
    try:
        with region(CHECKPOINT) as live:
            direct.place_before_first(live)
            return wrapped(*args, **kwargs)
    finally:
        s.ckpt_depth = 0
        if live.rec is not None and s.step is None:
            coverage.sibling_end(s, live.t1)
            if s.boundary is None or s.boundary < live.t1:
                s.boundary = live.t1


#: What torch's storages are (their `__reduce__` calls `torch.save(self, BytesIO())`).
_STORAGES = tuple(t for t in (getattr(torch.storage, "_StorageBase", None), getattr(torch.storage, "TypedStorage", None))
                  if t is not None)


def _pickling_a_storage(args: Any) -> bool:
    return len(args) > 1 and isinstance(args[0], _STORAGES) and isinstance(args[1], io.BytesIO)


def _checkpoint_begin(r: Recorder) -> None:
    """A checkpoint starts: it follows the step, so a complete step ends first."""
    s = _s
    t = r.now()
    if s.eval_t0 is not None and not s.eval_explicit:
        end_eval(r, s)
    close_if_complete(r, s, t)
    drop_pending_zero_grads(s)
    coverage.between(r, s, t)


def _patch_dcp(module: ModuleType) -> None:
    if not state.installed:
        return
    for name in ("save", "load", "async_save", "save_state_dict", "load_state_dict"):
        fn = getattr(module, name, None)
        if fn is None:
            continue
        patches.wrap(module, name, checkpoint_wrapper)
        for sub in ("state_dict_saver", "state_dict_loader"):
            submodule = getattr(module, sub, None)
            if submodule is not None and getattr(submodule, name, None) is fn:
                patches.wrap(submodule, name, checkpoint_wrapper)


def load_wrapper(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
    """`torch.load` of a whole module (the best model reloaded for a final test): our forward
    hooks never travel inside a pickle (`torch_hooks`), so the loaded module gets them here, as
    a root, or its forwards would go unseen until the next discovery (`roots`). Not a
    `train.checkpoint`: scripts load their data files with `torch.load` too."""
    out = wrapped(*args, **kwargs)
    if isinstance(out, torch.nn.Module):
        roots.adopt(out)
    return out


def install() -> None:
    patches.wrap(torch, "save", checkpoint_wrapper)
    patches.wrap(torch.serialization, "save", checkpoint_wrapper)
    patches.wrap(torch, "load", load_wrapper)
    patches.wrap(torch.serialization, "load", load_wrapper)
    _imports.when_imported("torch.distributed.checkpoint", _patch_dcp)


def uninstall() -> None:
    _imports.cancel(_patch_dcp)
    patches.undo()
