"""Optimizer updates: global optimizer step pre/post hooks, `GradScaler.step`, and zero_grad /
gradient clipping inside a step.

Each update is `train.optimizer` and, at its end, a possible step boundary (`machine`).
`GradScaler.step` is the update whether or not the scaler skipped the optimizer's own `step()`
(inf/NaN gradients: a skipped update is still a step). `Optimizer.zero_grad`,
`Module.zero_grad` and `clip_grad_norm_` are part of the update when inside a step, and belong
to the next step when a fetched batch is waiting for it. `optimizer.step(closure)`: the
closure's forward and backward are not the update.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from otel_train.detect.compile import compiled as _c, dynamo_compiling, tc
from otel_train.detect.machine import train_activity
from otel_train.detect.patches import Patches
from otel_train.detect.state import DATA, OPTIMIZER, P_NAME, PH_OPT, active, region
from otel_train.detect.state import s as _s
from otel_train.record import direct, recorder
from otel_train.record.recorder import Step

_log = logging.getLogger("otel_train")
patches = Patches()
#: The global optimizer hooks' handles, while installed.
handles: list[Any] = []


def optimizer_pre_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    if _c.seen and dynamo_compiling() or tc._is_compiling_flag:
        return None
    s = _s
    if s.opt_depth:
        stale = (optimizer is s.opt_owner and not s.scaling) or (
            s.opt_region is not None and recorder.current_region() is not s.opt_region)
        if not stale:
            s.opt_depth += 1  # an optimizer wrapping another one
            return None
        if s.opt_region is not None:  # the previous step() raised: forget it
            direct.abandon(s.opt_region)
        s.opt_depth = 0
        s.opt_region = None
    r = recorder._rec
    if r is None and (r := active()) is None:
        return None
    train_activity(r, s, r.now(), PH_OPT)
    if s.data_driven and s.opt_end is not None and id(optimizer) in s.stepped:
        # The same optimizer twice for one fetched batch: several updates per batch, so a
        # batch fetch no longer marks a step; the next forward after an update does.
        s.data_driven = False
        _log.debug("otel_train: several optimizer steps per batch; steps now end at the next forward")
    s.opt_region = region(OPTIMIZER).__enter__()
    s.opt_owner = optimizer
    s.opt_closure = False
    s.opt_depth = 1
    return None


def optimizer_post_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    if _c.seen and dynamo_compiling() or tc._is_compiling_flag:
        return None
    s = _s
    if not s.opt_depth:
        return None
    s.opt_depth -= 1
    if s.opt_depth:
        return None
    live = s.opt_region
    s.opt_region = None
    s.opt_owner = None
    s.opt_closure = False
    r = recorder._rec
    if live is not None:
        live.__exit__(None, None, None)
    if r is None:
        return None
    t = live.t1 if live is not None and live.rec is not None else r.now()
    s.uses_opt = True
    if s.step is not None and r.step is s.step:  # `machine.ours`
        s.opt_end = s.last_end = t
        s.stepped.append(id(optimizer))
    return None


def scaler_step_wrapper(wrapped: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    """`GradScaler.step(optimizer)` is the update, whether or not the scaler found inf/NaN
    gradients and skipped the optimizer's own `step()` (a skipped update is still a step)."""
    s = _s
    optimizer = args[1] if len(args) > 1 else kwargs.get("optimizer")
    if _c.seen and dynamo_compiling() or tc._is_compiling_flag or s.opt_depth or optimizer is None:
        return wrapped(*args, **kwargs)
    optimizer_pre_hook(optimizer, (), {})
    s.scaling = True
    try:
        out = wrapped(*args, **kwargs)
    finally:
        s.scaling = False
    optimizer_post_hook(optimizer, (), {})
    return out


def aux_patch(original: Callable[..., Any]) -> Callable[..., Any]:
    """zero_grad and clip_grad_norm_: part of the update when inside a step. The patched
    function itself, as `backward.backward_patch` is."""
    s = _s

    @functools.wraps(original)
    def aux(*args: Any, **kwargs: Any) -> Any:
        if _c.seen and dynamo_compiling() or tc._is_compiling_flag or s.opt_depth or s.aux_depth or s.fwd_depth \
                or s.bwd_depth:
            return original(*args, **kwargs)
        r = recorder._rec
        if r is None:
            return original(*args, **kwargs)
        if s.step is not None and r.step is s.step:  # `machine.ours`
            s.aux_depth = 1
            try:
                with region(OPTIMIZER) as live:
                    return original(*args, **kwargs)
            finally:
                s.aux_depth = 0
                if live.rec is not None:
                    s.last_end = live.t1
                    if s.opt_end is not None:
                        s.opt_end = live.t1  # step(); zero_grad(): the update ends after it
        pending = s.pending
        if not isinstance(r.step, Step) and pending and pending[-1][P_NAME] is DATA:
            # A batch is waiting: the step it starts will own this.
            t0 = r.now()
            s.aux_depth = 1
            try:
                out = original(*args, **kwargs)
            finally:
                s.aux_depth = 0
            pending.append([OPTIMIZER, t0, r.now(), None, None])
            return out
        return original(*args, **kwargs)
    return aux


def add_hooks() -> None:
    """Register the global optimizer step hooks (their handles in `handles`)."""
    from torch.optim import optimizer as optim_module
    handles.append(optim_module.register_optimizer_step_pre_hook(optimizer_pre_hook))
    handles.append(optim_module.register_optimizer_step_post_hook(optimizer_post_hook))


def remove_hooks() -> None:
    for handle in handles:
        handle.remove()
    handles.clear()


def install() -> None:
    import torch.amp.grad_scaler
    import torch.nn.utils
    import torch.nn.utils.clip_grad
    add_hooks()
    patches.replace(torch.optim.Optimizer, "zero_grad", aux_patch)
    patches.replace(torch.nn.Module, "zero_grad", aux_patch)
    patches.replace(torch.nn.utils, "clip_grad_norm_", aux_patch)
    patches.replace(torch.nn.utils.clip_grad, "clip_grad_norm_", aux_patch)
    patches.wrap(torch.amp.grad_scaler.GradScaler, "step", scaler_step_wrapper, lean=True)


def uninstall() -> None:
    remove_hooks()
    patches.undo()
