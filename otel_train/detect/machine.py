"""The step machine: which training phase begins a step, which ends it, and what is a sibling.

A step is one optimizer update: it spans from the previous boundary (the end of the last step's
update, or of the checkpoint / evaluation that followed it) to the end of its own update (the
optimizer phase: clipping, the optimizer step and the zero_grad right after it, `phase`, or a
collective right after that). It opens lazily, at the first training phase after a boundary,
backdated to that boundary, so the end of a loop leaves no empty step behind. An optimizer step
does not close the step at once, since another optimizer may follow (a GAN's generator after its
discriminator); the step is closed, at the end of its last update, by what comes next:

- in a loop that pulls batches from a DataLoader: the next batch fetch (a loop that makes
  several updates per batch with one optimizer gives itself away at the first batch's second
  update, which still counts in the first step; from then on the next forward closes a step);
- otherwise: the next forward (or backward) pass, or a zero_grad written at the top of the loop
  (`sites`);
- a checkpoint or an evaluation pass (they are siblings of the step, never inside it);
- the end of training (a framework callback, `uninstrument()`, or interpreter exit).

Batch fetches (and zero_grads between steps) are held until a forward shows what they were for:
the training step that follows, or an evaluation. A forward after a backward starts a new
micro-batch of the same step (`train.micro_batch`; `train.micro_batches` on the step): gradient
accumulation. The sizes of the batches a step took add up to its `train.samples` /
`train.tokens` (`batch_size`). A loop with no optimizer at all (manual `p.data.add_` updates)
gets one step per forward/backward cycle. The epoch is counted from the training loader's
iterators, unless a framework says it. An evaluation or checkpoint before the first step joins
the first step's trace. When a step closes, `coverage` accounts for the time its phases left
uncovered.

The hook families (`forward`, `backward`, `optimizer`, `data`, `eval`, `checkpoint`,
`gc_pauses`, `collectives`) call in here; what each one sees is in its module. State is per
process (`state.s`) and assumes one training thread. docs/step-semantics.md tells it as a user
reads it in a trace.
"""

from __future__ import annotations

import gc
import itertools
import weakref

import torch

from otel_train import semconv
from otel_train.detect import _loops, coverage, phase
from otel_train.detect.roots import roots
from otel_train.detect.state import DATA, EVAL, MB_ATTRS, P_ITER, P_SRC, P_T0, PH_FWD, PH_OPT, State, mb_attrs
from otel_train.detect.state import s as _s
from otel_train.record import direct, recorder
from otel_train.record.recorder import Recorder, Step
from otel_train.wire.schema import KIND_SPAN, NO_STEP, NO_UPDATE

TRAIN_SAMPLES, TRAIN_TOKENS = semconv.TRAIN_SAMPLES, semconv.TRAIN_TOKENS


def ours(r: Recorder, s: State) -> bool:
    """The open step is the one detection opened (not the user's explicit `otel_train.step()`)."""
    return s.step is not None and r.step is s.step


def manual(s: State) -> bool:
    """True in a loop that updates its weights without any torch optimizer."""
    if s.uses_opt is None:
        # Once per process, at the first ambiguous moment (forward after backward, no
        # optimizer step yet): gradient accumulation or a manual update? This runs inside
        # the user's first step, so first the question that costs ~10 µs: was an optimizer ever
        # made? Its `__init__` marks its class's `step` `hooked`. If never, it is a manual update
        # (the regression example paid 126 ms here for the scan below).
        if not optimizer_made():
            s.uses_opt = False
        else:
            # One was: is one alive? At C speed (tens of ns per live object, no Python call
            # each); type(), not isinstance(), so no object's __class__ property runs (some
            # warn, e.g. torch.distributed.reduce_op).
            s.uses_opt = any(map(issubclass, map(type, gc.get_objects()), itertools.repeat(torch.optim.Optimizer)))
    return not s.uses_opt


def optimizer_made() -> bool:
    """Whether any `torch.optim.Optimizer` was created in this process: `Optimizer.__init__`
    wraps its class's `step` once and marks it `hooked` (`_patch_step_function`). True, so
    the caller looks, where torch does not do that."""
    if not hasattr(torch.optim.Optimizer, "_patch_step_function"):
        return True
    classes = [torch.optim.Optimizer]
    while classes:
        cls = classes.pop()
        if getattr(cls.__dict__.get("step"), "hooked", False):
            return True
        classes += cls.__subclasses__()
    return False


def complete(s: State) -> bool:
    """The open step's update is done: what comes next may close it."""
    return s.opt_end is not None or (s.mb_bwd and manual(s))


def begin(r: Recorder, s: State, t: int) -> Step | None:
    """Open a step for a training phase at `t`, backdated to the boundary or its first fetch."""
    t0 = t
    if s.pending:
        for entry in s.pending:
            if entry[P_T0] < t0:
                t0 = entry[P_T0]
        if not s.epoch_fixed:
            track_epoch(s)
    if s.boundary is not None and s.boundary < t0:
        t0 = s.boundary
    # `direct.begin_step` written out: this runs every step.
    step = Step(None, s.epoch, None)
    step.__enter__()
    if step.rec is None:
        step = None
    else:
        step.t0 = t0
    s.step = step
    s.mb = 0
    s.mb_fwd = s.mb_bwd = False
    s.opt_end = s.last_end = None
    s.stepped.clear()
    s.cover = []
    return step


def close_if_complete(r: Recorder, s: State, t: int) -> None:
    """Before a sibling (checkpoint, evaluation): end our step if its update is done."""
    if ours(r, s) and complete(s):
        close(r, s, s.opt_end if s.opt_end is not None else t)


def train_activity_rest(r: Recorder, s: State, t: int, phase_kind: int, module: object = None) -> Step | None:
    """A training phase starts at `t`: close what it ends, open the step it belongs to. From its
    start, for what `train_activity` (in C, `_loops.train_activity`) does not take."""
    if s.phase is not None and phase_kind != PH_OPT:
        phase.end(r, s)  # the update is over: a forward or backward follows it
    if s.eval_t0 is not None and not s.eval_explicit:
        if module is not None and module is not s.eval_module and s.eval_data and not s.pending:
            # Another module's no-grad forward on the very batch this one now trains on (no
            # fetch in between): a teacher, not an evaluation. The batch goes back to the step.
            s.pending, s.eval_data = s.eval_data, []
            s.eval_t0 = s.eval_t1 = s.eval_module = None
        else:
            end_eval(r, s)
    step = r.step
    if isinstance(step, Step):
        if step is not s.step:
            return step  # the user's explicit `otel_train.step()` rules; phases only
        if phase_kind != PH_OPT:
            new_mb = s.mb_bwd and (phase_kind == PH_FWD or not s.mb_fwd)
            if s.opt_end is not None and not s.data_driven:
                close(r, s, s.opt_end)  # a new forward after an optimizer step begins a new step
                step = None
            elif new_mb:
                if s.opt_end is None and (s.uses_opt is False or s.uses_opt is None and manual(s)):
                    close(r, s, first_pending(s, t))
                    step = None
                else:
                    s.mb += 1
                    s.mb_fwd = s.mb_bwd = False
    if not isinstance(step, Step):
        step = begin(r, s, t)
    if s.pending:
        resolve_pending(r, s)
    return step


def drop_pending_zero_grads(s: State) -> None:
    """A sibling begins: a zero_grad made since the last step is the script's own time between
    steps (`coverage`), not the next step's (whose start it would move before the sibling)."""
    if s.pending:
        s.pending = [entry for entry in s.pending if entry[0] is DATA]


def first_pending(s: State, t: int) -> int:
    for entry in s.pending:
        if entry[P_T0] < t:
            t = entry[P_T0]
    return t


_loops.bind_state(State)
_loops.bind_machine(recorder.current_get, recorder.seq, KIND_SPAN, DATA, MB_ATTRS, mb_attrs, NO_STEP,
                    TRAIN_SAMPLES, TRAIN_TOKENS)
#: `resolve_pending(r, s)`: the batches fetched (and zero_grads made) before this training phase
#: belong to its step: each recorded under it (`train.micro_batch` on fetches), covering it where
#: top level, their sizes added to its `train.samples` / `train.tokens`, the last fetch's loader
#: the training loader. In C, as the two below: each runs every micro-batch or step.
resolve_pending = _loops.resolve_pending
_loops.bind_train_activity(train_activity_rest, Step, PH_FWD, PH_OPT)
#: `train_activity(r, s, t, phase_kind, module=None)`: a training phase starts at `t`; its common
#: path (a phase of the open step, a new micro-batch), `train_activity_rest` for the rest.
train_activity = _loops.train_activity
_loops.bind_close(phase.end, recorder.close_step, roots, Step, coverage.MAX_UNCOVERED, coverage.MIN_GAP_NS,
                  semconv.SPAN_OTHER, semconv.TRAIN_STEP_UNCOVERED_S)
#: `close(r, s, t1)`: close the step detection opened at `t1`, which becomes the next step's
#: boundary: the optimizer phase ended, the step's largest gaps recorded as `train.other`
#: (`coverage`), the step recorded, the between-steps cursor moved.
close = _loops.close


def track_epoch(s: State) -> None:
    """A new pass over the training batches is a new epoch: a new iterator of the training
    loader, or a training loader never seen before (one built per epoch)."""
    train_src = s.train_src
    last = None
    found = False
    for entry in s.pending:
        if entry[P_ITER] is not None:
            last = entry
            if train_src is not None and entry[P_SRC] is train_src:
                found = True
    if last is None:
        return
    if not found:
        s.train_src = train_src = last[P_SRC]
    for entry in s.pending:
        it = entry[P_ITER]
        if it is not None and entry[P_SRC] is train_src and (s.train_iter is None or s.train_iter() is not it):
            s.epoch = 0 if s.epoch is None else s.epoch + 1
            s.train_iter = weakref.ref(it)  # weak: a dead iterator must shut its workers down


def end_eval(r: Recorder, s: State) -> None:
    """The evaluation pass in progress (explicit or detected) is over: record it as a sibling."""
    t0 = s.eval_t0
    t1 = s.eval_t1 if s.eval_t1 is not None else t0
    region = s.eval_region
    s.eval_t0 = s.eval_t1 = s.eval_module = s.eval_region = None
    s.eval_data = []
    s.eval_explicit = False
    if region is not None:  # an explicit pass: a live region (device-timed, parent of user spans)
        region.__exit__(None, None, None)
        t1 = region.t1 if region.rec is not None else t1
    elif t0 is not None and t1 is not None:
        coverage.between(r, s, t0)
        direct.record(r, EVAL, None, t0, t1, ref=direct.before(r))
    if t1 is None:
        return
    if s.step is None:
        coverage.sibling_end(s, t1)
        if s.boundary is None or s.boundary < t1:
            s.boundary = t1


def set_epoch(epoch: int | None) -> None:
    """A framework knows the epoch: it wins over the one counted from DataLoader iterators."""
    recorder.settle()
    _s.epoch = epoch
    _s.epoch_fixed = epoch is not None


def finish(cut: bool = False) -> None:
    """Training is over: close the evaluation pass and the last step at their real ends. With
    `cut` (a signal or an uncaught exception ends the run) a step whose update is not done is
    left open, for the shutdown to mark it truncated: it was not completed."""
    recorder.settle()
    r = recorder._rec
    s = _s
    s.pending.clear()
    if r is None:
        phase.abandon(s)
        s.step = None
        return
    if s.eval_t0 is not None:
        if s.eval_explicit:
            s.eval_t1 = r.now()
        end_eval(r, s)
    if ours(r, s) and cut and not complete(s):
        if s.phase is not None:
            phase.end(r, s)
    elif ours(r, s):
        if s.phase is not None:
            phase.end(r, s)
        end = s.opt_end if s.opt_end is not None else s.last_end
        if s.opt_end is None and not s.mb and not s.mb_bwd:
            # Forwards alone since the last update (forward-forward's final `predict()` with
            # gradients, in train mode): no update followed them, so they were no step. They
            # were recorded as this step's children before anything could tell, so it is not
            # dropped but closed as what it was: an evaluation pass, no `train.step` (the
            # exporter, `spans.Spans._no_update`).
            attrs = s.step.attrs
            if attrs is None:
                s.step.attrs = {NO_UPDATE: True}
            else:
                attrs[NO_UPDATE] = True
        close(r, s, end if end is not None else r.now())
    elif s.phase is not None:
        phase.end(r, s)
    s.step = None
