"""Evaluation passes: detected from forwards without gradients, or told by a framework.

A forward under `no_grad()` / `inference_mode()`, or of a module in `.eval()` mode, is
evaluation: consecutive ones form one `train.eval` span (with the batch fetches feeding them),
a sibling that tags the step it follows. Auxiliary forwards stay inside their step instead: one
made in the middle of a step (a target network between forward and optimizer step), one right
after the loop fetched a training batch, and one by another module on the very batch the next
training forward uses (a distillation teacher). A detected pass runs from its first forward (or
the fetch feeding it) to the end of its last forward: the script's own code after it (an RL
loop's advantage computation, plotting) is not evaluation. One before the first step joins the
first step's trace. Lightning and Hugging Face callbacks replace
this guesswork with the frameworks' own validation loop (`eval_begin()` / `eval_end()`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from otel_train.detect import coverage, state
from otel_train.detect.compile import compiled as _c, dynamo_compiling, tc
from otel_train.detect.machine import close, close_if_complete, complete, drop_pending_zero_grads, end_eval, ours
from otel_train.detect.state import DATA, EVAL, FWD_AUX, FWD_EVAL, FWD_SKIP, P_NAME, P_SRC, P_T0, State, region
from otel_train.detect.state import s as _s
from otel_train.record import direct, recorder
from otel_train.record.recorder import Recorder


def eval_forward(r: Recorder, s: State, t: int) -> int:
    """An outermost forward without gradients or in eval mode starts at `t`: what is it?"""
    if s.eval_explicit:
        return FWD_SKIP
    mine = ours(r, s)
    if mine and (s.mb_fwd or s.mb_bwd) and not complete(s):
        return FWD_AUX  # mid-step (a target network, a metric): part of the step
    pending = s.pending
    if pending and pending[-1][P_NAME] is DATA and s.train_src is not None \
            and pending[-1][P_SRC] is s.train_src:
        return FWD_AUX  # right after fetching a training batch (a distillation teacher)
    t0 = t
    keep = []
    for entry in pending:
        if entry[P_NAME] is DATA and (s.train_src is None or entry[P_SRC] is not s.train_src):
            if entry[P_T0] < t0:
                t0 = entry[P_T0]
            s.eval_data.append(entry)
        elif entry[P_NAME] is DATA:
            keep.append(entry)
        # (a zero_grad before an evaluation is the script's own time between steps, not the next step's)
    s.pending = keep
    if mine:
        close(r, s, s.opt_end if s.opt_end is not None else t0)
    if s.eval_t0 is None:
        s.eval_t0 = t0
    return FWD_EVAL


def eval_begin() -> None:
    """A framework starts an evaluation pass: no phase is recorded until `eval_end()`."""
    recorder.settle()
    r = recorder._rec
    s = _s
    if r is None or not state.installed:
        return
    t = r.now()
    if s.eval_t0 is not None:
        if s.eval_explicit:
            return
        end_eval(r, s)
    close_if_complete(r, s, t)
    drop_pending_zero_grads(s)
    coverage.between(r, s, t)
    s.eval_explicit = True
    s.eval_region = live = region(EVAL).__enter__()
    direct.place_before_first(live)
    s.eval_t0 = t
    s.eval_t1 = None


def eval_end() -> None:
    """The evaluation pass (explicit, or detected from forwards) is over."""
    recorder.settle()
    r = recorder._rec
    s = _s
    if r is None or s.eval_t0 is None:
        return
    if s.eval_explicit:
        s.eval_t1 = r.now()
    end_eval(r, s)


def eval_wrapper(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
    """A framework's "evaluate" method (a wrapt wrapper) becomes one explicit eval pass."""
    recorder.settle()
    if recorder._rec is None or _s.eval_explicit or _c.seen and dynamo_compiling() or tc._is_compiling_flag:
        return wrapped(*args, **kwargs)
    eval_begin()
    try:
        return wrapped(*args, **kwargs)
    finally:
        eval_end()
