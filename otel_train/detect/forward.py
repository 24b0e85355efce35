"""Forward passes: global module forward pre/post hooks, outermost module only.

The outermost forward of a module in training mode with gradients is `train.forward` (per
micro-batch); one under `no_grad()` / `inference_mode()`, or of a module in `.eval()` mode, is
evaluation (`eval.eval_forward`). Calls of loss modules (`nn.MSELoss()(out, y)`) are not
forwards of their own. A closure evaluation inside `optimizer.step(closure)` of an optimizer that
re-evaluates it (LBFGS) is a `train.forward` nested under `train.optimizer` (`optimizer`).
Which modules carry the hooks: `roots`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.modules.loss import _Loss

from otel_train.detect import _loops
from otel_train.detect.compile import compiled as _c, dynamo_compiling, tc
from otel_train.detect.eval import eval_forward
from otel_train.detect.machine import train_activity
from otel_train.detect.optimizer import closure_evaluation
from otel_train.detect.roots import roots, use_forward_hooks
from otel_train.detect.state import (FORWARD, FWD_AUX, FWD_EVAL, FWD_TRAIN, MB_ATTRS, PH_FWD, active, mb_attrs,
                                     region)
from otel_train.detect.state import s as _s
from otel_train.record import recorder
from otel_train.record.recorder import Region


def forward_pre_hook(module: torch.nn.Module, args: Any) -> None:
    if _c.seen and dynamo_compiling() or tc._is_compiling_flag:
        return None
    return forward_begin(module)


def forward_hook(module: torch.nn.Module, args: Any, output: Any) -> None:
    if _c.seen and dynamo_compiling() or tc._is_compiling_flag:
        return None
    return forward_end(module)


def forward_begin_rest(module: torch.nn.Module) -> None:
    """The pre-hook past its compile check, from its start, for what `forward_begin` (in C,
    `_loops.forward_begin`) does not take."""
    s = _s
    if s.fwd_depth:
        s.fwd_depth += 1
        return None
    if s.fetching:
        return None  # a transform module inside a batch fetch
    s.copying = False  # the batch is on its way in: no more copies of it to count
    if roots.discovering:
        roots.seen.add(module)
    r = recorder._rec
    if r is None:
        if not s.lazy or not torch.is_grad_enabled() or (r := active()) is None:
            return None
    t = r.now()
    if isinstance(module, _Loss):
        s.fwd_kind = FWD_AUX  # a loss module called on the model's output is not another forward
    elif torch.is_grad_enabled() and module.training if s.replay is None else s.replay[0] and s.replay[1]:
        s.fwd_kind = FWD_TRAIN
        if s.opt_depth and closure_evaluation(s):
            # optimizer.step(closure), re-evaluating it: nested under the update, no micro-batch.
            s.fwd_nested = True
            s.fwd_region = region(FORWARD).__enter__()
        else:
            s.fwd_nested = False
            step = train_activity(r, s, t, PH_FWD, module)
            live = Region(FORWARD)  # `state.region(FORWARD, mb_attrs(mb))` written out: every micro-batch
            mb = s.mb
            live.attrs = MB_ATTRS[mb] if mb < 256 else mb_attrs(mb)
            s.fwd_region = live.__enter__()
            s.mb_fwd = True
            if step is not None and step is s.step:
                step.micro_batches = s.mb + 1
    else:
        s.fwd_kind = eval_forward(r, s, t)
        if s.fwd_kind == FWD_EVAL:
            s.eval_module = module
    s.fwd_depth = 1
    return None


def forward_end_rest(module: torch.nn.Module) -> None:
    """The post-hook past its compile check, from its start, for what `forward_end` (in C,
    `_loops.forward_end`) does not take (an evaluation forward)."""
    s = _s
    if not s.fwd_depth:
        return None
    s.fwd_depth -= 1
    if s.fwd_depth:
        return None
    kind = s.fwd_kind
    if kind == FWD_TRAIN:
        live = s.fwd_region
        s.fwd_region = None
        if live is not None:
            live.__exit__(None, None, None)
            if live.rec is not None and not s.fwd_nested:
                s.last_end = live.t1
                if live.parent is None and live.step is s.step:
                    s.cover += (live.t0, live.t1)  # `coverage.cover`, written out
                if live.step is s.step and s.opt_end is not None and live.t0 >= s.opt_end:
                    # After the step's update (a sample, `netG(fixed_noise)`; a GAN's next
                    # update's forward): the update ends after it, so what closes the step next
                    # (the next batch, an evaluation, the end) closes it after this forward.
                    s.opt_end = live.t1
    elif kind == FWD_EVAL:
        r = recorder._rec
        if r is not None and s.eval_t0 is not None:
            s.eval_t1 = r.now()
    return None


_loops.bind_forward(_s, roots, recorder, _Loss, torch.is_grad_enabled, Region, FORWARD, forward_begin_rest,
                    forward_end_rest, FWD_TRAIN, FWD_EVAL)
#: `forward_begin(module)`, `forward_end(module)`: the hooks past their compile checks, in C
#: (every micro-batch: a training forward of the open step begins; the outermost forward in
#: flight ends), the `_rest` functions for the rest.
forward_begin = _loops.forward_begin
forward_end = _loops.forward_end
use_forward_hooks(globals())  # the roots carry this module's hooks (`roots` cannot import it back)


def install() -> None:
    roots.start()


def uninstall() -> None:
    roots.remove_all()
