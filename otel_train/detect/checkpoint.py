"""Checkpoints: `torch.save` and `torch.distributed.checkpoint` save / load are patched.

Each call is one `train.checkpoint` span, a sibling after the step it follows (which it
closes first when that step's update is done) and which it tags. A `torch.save` inside a batch
fetch (a dataset caching itself) is not a checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from otel_train import _imports
from otel_train.detect import state
from otel_train.detect.compile import compiled as _c, dynamo_compiling, tc
from otel_train.detect.machine import close_if_complete, end_eval
from otel_train.detect.patches import Patches
from otel_train.detect.state import CHECKPOINT, region
from otel_train.detect.state import s as _s
from otel_train.record import recorder
from otel_train.record.recorder import Recorder

patches = Patches()


def checkpoint_wrapper(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
    """A wrapt wrapper: the call is one `train.checkpoint` span (integrations use it too)."""
    s = _s
    if s.ckpt_depth or s.fetching or _c.seen and dynamo_compiling() or tc._is_compiling_flag:
        return wrapped(*args, **kwargs)
    r = recorder._rec
    if r is None:
        return wrapped(*args, **kwargs)
    _checkpoint_begin(r)
    s.ckpt_depth = 1
    try:
        with region(CHECKPOINT) as live:
            return wrapped(*args, **kwargs)
    finally:
        s.ckpt_depth = 0
        if live.rec is not None and s.step is None and (s.boundary is None or s.boundary < live.t1):
            s.boundary = live.t1


def _checkpoint_begin(r: Recorder) -> None:
    """A checkpoint starts: it follows the step, so a complete step ends first."""
    s = _s
    t = r.now()
    if s.eval_t0 is not None and not s.eval_explicit:
        end_eval(r, s)
    close_if_complete(r, s, t)


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


def install() -> None:
    patches.wrap(torch, "save", checkpoint_wrapper)
    patches.wrap(torch.serialization, "save", checkpoint_wrapper)
    _imports.when_imported("torch.distributed.checkpoint", _patch_dcp)


def uninstall() -> None:
    _imports.cancel(_patch_dcp)
    patches.undo()
