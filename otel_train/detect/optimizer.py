"""Optimizer updates: global optimizer step pre/post hooks, `GradScaler.step`, and zero_grad /
gradient clipping.

`clip_grad_norm_`, the update (`optimizer.step()`, or `GradScaler.step`, which is the update
even when it skips the optimizer's own step for inf/NaN gradients) and the `zero_grad()` right
after it are one optimizer phase: one `train.optimizer` span (`phase`). Its end is a possible
step boundary (`machine`).

A `zero_grad()` elsewhere is a `train.zero_grad` span of its own: before the step's first phase
(the top of an iteration; after a batch fetch, or `sites` says the loop came round) it belongs
to the next step; in the middle of a step (after the forward, before the backward) to this one.

`optimizer.step(closure)`: an optimizer that evaluates its closure several times per step
(LBFGS's line search, or any that has been seen doing so) has every evaluation's forward and
backward nested under its `train.optimizer`; one that evaluates it once (SGD, Adam: what
Lightning's automatic optimisation passes) has them as the step's micro-batch, and the update
after them as `train.optimizer`.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Any

import torch

from otel_train.detect import _loops, coverage, entry, phase, sites, torch_hooks
from otel_train.detect.compile import compiled as _c, dynamo_compiling, tc
from otel_train.detect.machine import close, complete, ours, train_activity
from otel_train.detect.patches import Patches
from otel_train.detect.state import P_T0, PH_OPT, ZERO_GRAD, State, active, caught_up
from otel_train.detect.state import s as _s
from otel_train.record import direct, recorder
from otel_train.record.recorder import Recorder, Step

_log = logging.getLogger("otel_train")
patches = Patches()
#: The global optimizer hooks' entries, while installed.
handles: list[Any] = []
#: Optimizer classes seen evaluating their closure more than once in one step (LBFGS is known).
_reevaluating: set[type] = set()


def nests(optimizer: Any) -> bool:
    """Whether `optimizer.step(closure)`'s closure evaluations nest under the update."""
    return isinstance(optimizer, torch.optim.LBFGS) or type(optimizer) in _reevaluating


def optimizer_pre_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    if _c.seen and dynamo_compiling() or tc._is_compiling_flag:
        return None
    return optimizer_begin(optimizer, args, kwargs)


def optimizer_post_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    if _c.seen and dynamo_compiling() or tc._is_compiling_flag:
        return None
    return optimizer_end(optimizer, args, kwargs)


def optimizer_begin_rest(optimizer: Any, args: Any, kwargs: Any) -> None:
    """The pre-hook past its compile check, called by it (`sys._getframe(2)` is torch's step
    wrapper, or ours for GradScaler), from its start, for what `optimizer_begin` (in C,
    `_loops.optimizer_begin`) does not take."""
    s = _s
    if s.opt_depth:
        if not _stale(s, optimizer):
            s.opt_depth += 1  # an optimizer wrapping another one
            return None
        _forget_update(s)  # the previous step() raised
    r = recorder._rec
    if r is None and (r := active()) is None:
        return None
    t = r.now()
    if s.site_probe:
        sites.remember_update(s)
    closure = args[1] if len(args) > 1 else kwargs.get("closure")
    nest = closure is not None and nests(optimizer)
    if nest and s.opt_end is not None and ours(r, s):
        # Its forwards and backwards nest under its update: each step(closure) is a step.
        close(r, s, s.opt_end)
    train_activity(r, s, t, PH_OPT)
    if s.data_driven and s.opt_end is not None:
        several_updates(s, optimizer)
    if s.replay is not None:  # replayed (`batch`): the frames as the call saw them
        s.opt_frame = s.replay[3]
        if s.replay[4] is not None:
            s.last_callers = s.replay[4]
    else:
        s.opt_frame = frame = sys._getframe(2)  # torch's step wrapper (or ours for GradScaler): on the stack until step() ends
        caller = frame.f_back
        if caller is not None:  # where the update was called from, for a zero_grad site not placed yet (`sites`)
            outer = caller.f_back
            s.last_callers = sites.callers(caller, outer)
    s.opt_owner = optimizer
    s.opt_closure = closure is not None
    s.nest = nest
    s.opt_t0 = t
    s.evaluations = 0
    s.opt_depth = 1
    if not s.opt_closure or s.nest:
        phase.part_begin(s, phase.STEP)
    return None


def several_updates(s: State, optimizer: Any) -> None:
    """An update in a data-driven step that had one: the same optimizer twice for one fetched
    batch is several updates per batch, so a batch fetch no longer marks a step; the next
    forward after an update does."""
    if id(optimizer) in s.stepped:
        s.data_driven = False
        _log.debug("otel_train: several optimizer steps per batch; steps now end at the next forward")


def optimizer_end_rest(optimizer: Any, args: Any, kwargs: Any) -> None:
    """The post-hook past its compile check, from its start, for what `optimizer_end` (in C,
    `_loops.optimizer_end`) does not take."""
    s = _s
    if not s.opt_depth:
        return None
    s.opt_depth -= 1
    if s.opt_depth:
        return None
    r = recorder._rec
    if r is None:
        _forget_update(s)
        return None
    if s.opt_closure and not s.nest:
        if s.evaluations > 1:
            _reevaluating.add(type(optimizer))  # from its next step on, evaluations nest
        if s.part_phase is None:  # its closure never ran a backward: the update is all of step()
            phase.part_begin(s, phase.STEP)
            if s.phase is not None and s.phase_parts == [phase.STEP]:
                s.phase.t0 = s.opt_t0
    t = phase.part_end(r, s)
    s.opt_frame = None
    s.opt_owner = None
    s.opt_closure = s.nest = False
    s.uses_opt = True
    if s.step is not None and r.step is s.step:  # `machine.ours`, written out: every update
        s.opt_end = s.last_end = t
        s.stepped.append(id(optimizer))
    return None


def _stale(s: State, optimizer: Any) -> bool:
    """Inside step() again: an optimizer wrapping another, a subclass's step() calling its base
    class's (both hooked), or the last step() raised (its frame is gone from the stack)."""
    return not _running(s)


def _running(s: State) -> bool:
    """Whether the step() our pre-hook saw begin is still on the stack (it did not raise)."""
    return on_stack(s.opt_frame, sys._getframe(2))


def on_stack(target: Any, frame: Any) -> bool:
    """Whether `target` is `frame` or one of the frames that called it."""
    while frame is not None:
        if frame is target:
            return True
        frame = frame.f_back
    return False


def _forget_update(s: State) -> None:
    s.opt_depth = 0
    s.opt_frame = None
    s.opt_owner = None
    s.opt_closure = s.nest = False
    if s.part_phase is not None:
        r = recorder._rec
        if r is not None:
            phase.part_end(r, s)


def closure_evaluation(s: State) -> bool:
    """A forward inside step(): True when it nests under the update (an evaluation of a closure
    while the update is the current region); False for the first evaluation of a closure the
    optimizer evaluates once, which is the step's micro-batch. When the step() is no longer on
    the stack it raised: it is forgotten, and the forward is the step's."""
    if not _running(s):
        _forget_update(s)
        return False
    if not s.opt_closure:  # a forward run by step() itself (no closure given): part of the update
        return s.part_phase is not None
    s.evaluations += 1
    return s.part_phase is not None


def scaler_step_wrapper(wrapped: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    """`GradScaler.step(optimizer)` is the update, whether or not the scaler found inf/NaN
    gradients and skipped the optimizer's own `step()` (a skipped update is still a step)."""
    recorder.settle()
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


def aux_patch(clip: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """zero_grad (`clip` False: a method of a class) or clip_grad_norm_ (True: a function)
    replaced by an object in C that places it (`entry`: no frame of ours in the traceback of an error raised
    inside, such as clipping's non-finite norm), else by the Python function `aux`, which
    Dynamo traces in its place."""
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        s = _s

        @functools.wraps(original)
        def aux(*args: Any, **kwargs: Any) -> Any:
            if _c.seen and dynamo_compiling() or tc._is_compiling_flag or aux_busy(s) and caught_up(aux_busy, s):
                return original(*args, **kwargs)
            r = recorder._rec
            if r is None:
                return original(*args, **kwargs)
            return (clip_run if clip else zero_grad_run)(r, s, original, args, kwargs)
        run = "clip_run" if clip else "zero_grad_run"
        return entry.make(original, aux_busy, globals(), run, entry.RECORDED, for_dynamo=aux, method=not clip)
    return make


#: `aux_busy(s)`: a zero_grad or clipping now is part of something else: inside an update, another
#: such call, a forward or a backward. In C: every zero_grad and clipping asks.
aux_busy = _loops.aux_busy


def _part(r: Recorder, s: State, name: str, original: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    phase.part_begin(s, name)
    s.aux_depth = 1
    try:
        return original(*args, **kwargs)
    finally:
        s.aux_depth = 0
        t = phase.part_end(r, s)
        if s.step is not None and r.step is s.step:  # `machine.ours`, written out: every update
            s.last_end = t
            if s.opt_end is not None:
                s.opt_end = t  # step(); zero_grad(): the update ends after it


def zero_grad_rest(r: Recorder, s: State, original: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    """The patched zero_grad while a run records, from its start, for what `zero_grad_run` (in
    C, `_loops.zero_grad_run`) does not take."""
    if s.step is not None and r.step is s.step:  # `machine.ours`, written out: every step
        if s.opt_end is None and complete(s):  # a manual update is done: this is the next iteration
            t0 = r.now()
            close(r, s, min([t0] + [entry[P_T0] for entry in s.pending]))
            return _pending(r, s, t0, original, args, kwargs)
        if s.opt_end is not None:
            place = sites.zero_grad_place(s)
            if place == sites.END and s.phase is not None:
                return _part(r, s, phase.ZERO_GRAD, original, args, kwargs)
            if place == sites.TOP:
                t0 = r.now()
                close(r, s, s.opt_end)
                return _pending(r, s, t0, original, args, kwargs)
        return _own(r, s, original, args, kwargs)
    step = r.step
    if isinstance(step, Step):  # the user's explicit step: part of its update, if one is under way
        if s.phase is not None:
            return _part(r, s, phase.ZERO_GRAD, original, args, kwargs)
        return original(*args, **kwargs)
    if s.eval_explicit:  # inside a framework's evaluation pass (Lightning zeroes gradients there)
        return original(*args, **kwargs)
    return _pending(r, s, r.now(), original, args, kwargs)


_loops.bind_optimizer(_s, recorder, optimizer_begin_rest, optimizer_end_rest, zero_grad_rest, several_updates,
                      sites._decided, sites.END)
#: `optimizer_begin(optimizer, args, kwargs)`, `optimizer_end(...)`: the hooks past their compile
#: checks, in C (the update of a step, no closure); the `_rest` functions for the rest.
optimizer_begin = _loops.optimizer_begin
optimizer_end = _loops.optimizer_end
#: `zero_grad_run(r, s, original, args, kwargs)`: the patched zero_grad while a run records, in C
#: (its call site decided), `zero_grad_rest` for the rest.
zero_grad_run = _loops.zero_grad_run
#: `clip_run(r, s, original, args, kwargs)`: gradient clipping in a step is the first call of its
#: update (`phase.CLIP`); outside the user's or our step, the clipping alone. In C (`batch` notes it).
clip_run = _loops.clip_run


def _own(r: Recorder, s: State, original: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    """A `train.zero_grad` in the open step (mid-step, or after the update from elsewhere)."""
    phase.end(r, s)
    t0 = r.now()
    s.aux_depth = 1
    try:
        return original(*args, **kwargs)
    finally:
        s.aux_depth = 0
        t1 = r.now()
        if ours(r, s):
            direct.record(r, ZERO_GRAD, None, t0, t1)
            coverage.cover(s, t0, t1)
            s.last_end = t1
            if s.opt_end is not None:
                s.opt_end = t1


def _pending(r: Recorder, s: State, t0: int, original: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    """Between steps: a `train.zero_grad` of the step to come (held like a batch fetch)."""
    s.aux_depth = 1
    try:
        out = original(*args, **kwargs)
    finally:
        s.aux_depth = 0
    s.pending.append([ZERO_GRAD, t0, r.now(), None, None, None])
    return out


def add_hooks() -> None:
    """Put the global optimizer step hooks in (their entries in `handles`)."""
    handles.extend(torch_hooks.global_optimizer(optimizer_pre_hook, optimizer_post_hook))


def remove_hooks() -> None:
    for handle in handles:
        handle.remove()
    handles.clear()


def install() -> None:
    import torch.amp.grad_scaler
    import torch.nn.utils
    import torch.nn.utils.clip_grad
    add_hooks()
    patches.replace(torch.optim.Optimizer, "zero_grad", aux_patch(False))
    patches.replace(torch.nn.Module, "zero_grad", aux_patch(False))
    clips: dict[Any, Any] = {}
    clip = aux_patch(True)

    def one_clip(original: Callable[..., Any]) -> Callable[..., Any]:
        """One object under both names: pickled by name, it must be the one found there."""
        if original not in clips:
            clips[original] = clip(original)
        return clips[original]
    for owner in (torch.nn.utils.clip_grad, torch.nn.utils):
        patches.replace(owner, "clip_grad_norm_", one_clip)
    patches.replace(torch.amp.grad_scaler.GradScaler, "step",
                    lambda original: entry.lean(original, scaler_step_wrapper, method=True))


def uninstall() -> None:
    remove_hooks()
    patches.undo()
    sites.forget()
