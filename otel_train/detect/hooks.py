"""Step and phase detection for unmodified PyTorch training loops: the hooks and the state machine.

`install()` uses torch's own hooks where torch has them and patches only where it has none
(plain functions for what runs every step, wrapt for the rest); `uninstall()` undoes every
one. What each hook sees becomes (CONVENTIONS.md §3):

| source                                                        | span                              |
|---------------------------------------------------------------|-----------------------------------|
| global module forward pre/post hooks, outermost module only   | `train.forward`, or `train.eval`  |
| `torch.autograd.backward` (patched; `Tensor.backward` calls it) | `train.backward`                |
| global optimizer step pre/post hooks                          | `train.optimizer`, step boundary  |
| `GradScaler.step` (also when it skips the optimizer's step)   | `train.optimizer`, step boundary  |
| `Optimizer.zero_grad`, `Module.zero_grad`, `clip_grad_norm_`  | `train.optimizer` inside a step   |
| `_BaseDataLoaderIter.__next__` and the `Tensor.to` calls after it | `train.data`                  |
| `torch.save`, `torch.distributed.checkpoint.save/load`        | `train.checkpoint`                |
| `gc.callbacks` (full collections, or any pause >= 1 ms)       | `train.gc`                        |
| `torch.distributed` collectives                               | `train.collective`                |

The step machine. A step is one optimizer update: it spans from the previous boundary (the end
of the last step's update, or of the checkpoint / evaluation that followed it) to the end of
its own update (the optimizer step, and the zero_grad or collective that comes right after
it). It opens lazily, at the first training phase after a boundary, backdated to that
boundary, so the end of a loop leaves no empty step behind. An optimizer step does not close
the step at once, since another optimizer may follow (a GAN's generator after its
discriminator); the step is closed, at the end of its last update, by what comes next:

- in a loop that pulls batches from a DataLoader: the next batch fetch (a loop that makes
  several updates per batch with one optimizer gives itself away at the first batch's second
  update, which still counts in the first step; from then on the next forward closes a step);
- otherwise: the next forward (or backward) pass;
- a checkpoint or an evaluation pass (they are siblings of the step, never inside it);
- the end of training (a framework callback, `uninstrument()`, or interpreter exit).

Batch fetches are held until a forward shows what they were for: the training step that
follows, or an evaluation. A forward after a backward starts a new micro-batch of the same step
(`train.micro_batch`; `train.micro_batches` on the step): gradient accumulation. A loop with no
optimizer at all (manual `p.data.add_` updates) gets one step per forward/backward cycle. The
epoch is counted from the training loader's iterators, unless a framework says it. Calls of
loss modules (`nn.MSELoss()(out, y)`) are not forwards of their own.

A forward under `no_grad()` / `inference_mode()`, or of a module in `.eval()` mode, is evaluation:
consecutive ones form one `train.eval` span (with the batch fetches feeding them), which tags
the step it follows. Auxiliary forwards stay inside their step instead: one made in the middle
of a step (a target network between forward and optimizer step), one right after the loop
fetched a training batch, and one by another module on the very batch the next training
forward uses (a distillation teacher). Lightning and Hugging Face callbacks replace this
guesswork with the frameworks' own validation loop (`eval_begin()` / `eval_end()`).

Everything on the hot path returns at once when the recorder is off (`_recorder._rec is None`)
or while torch.compile traces (`torch.compiler.is_compiling()`, tested first so Dynamo folds it
and guards on nothing of ours). It only creates, enters and leaves `_recorder._Region` objects
and opens and closes steps. State is per process and assumes one training thread.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import logging
import sys
import warnings
import weakref
from collections.abc import Callable, Iterator
from types import CodeType, FunctionType, ModuleType, SimpleNamespace
from typing import Any

import torch
import wrapt
from torch.compiler import is_compiling
from torch.nn.modules.loss import _Loss

from otel_train import _imports, _runtime, semconv
from otel_train.record import recorder as _recorder
from otel_train.record.recorder import _Region, _Step

_log = logging.getLogger("otel_train")

_DATA = semconv.SPAN_DATA
_FORWARD = semconv.SPAN_FORWARD
_BACKWARD = semconv.SPAN_BACKWARD
_OPTIMIZER = semconv.SPAN_OPTIMIZER
_EVAL = semconv.SPAN_EVAL
_CHECKPOINT = semconv.SPAN_CHECKPOINT
_GC = semconv.SPAN_GC
_COLLECTIVE = semconv.SPAN_COLLECTIVE

#: A young-generation collection becomes a span only when it pauses at least this long;
#: full collections always do. Gen-0 collections run thousands of times a second for microseconds.
GC_MIN_PAUSE_NS = 1_000_000

# What the outermost forward in flight is.
_FWD_TRAIN, _FWD_EVAL, _FWD_AUX, _FWD_SKIP = range(4)
# Which training phase reaches `_train_activity`.
_PH_FWD, _PH_BWD, _PH_OPT = range(3)
# Pending entry fields: [name, t0, t1, dataset, iterator].
_P_NAME, _P_T0, _P_T1, _P_SRC, _P_ITER = range(5)

# One shared, never mutated attribute dict per micro-batch index: no dict per call.
_MB_ATTRS = tuple({semconv.TRAIN_MICRO_BATCH: i} for i in range(256))

# `torch.compile(module)` warns when global module hooks exist (they fire for the wrapper and
# the wrapped module); the outermost-forward rule already counts that pair once.
_COMPILE_HOOK_WARNING = r"Using `torch.compile\(module\)` when there are global hooks"


def _mb_attrs(i: int) -> dict[str, int]:
    return _MB_ATTRS[i] if i < 256 else {semconv.TRAIN_MICRO_BATCH: i}


# `torch.compiler.is_compiling()` is two Python calls (it asks TorchScript first). The hooks that
# run every step ask the same with one: Dynamo folds `is_dynamo_compiling()` to True while it
# traces (so it neither reads the flag nor guards on it), and the flag is torch.export's tracing.
if hasattr(torch.compiler, "is_dynamo_compiling") and hasattr(torch.compiler, "_is_compiling_flag"):
    _dynamo_compiling: Callable[[], bool] = torch.compiler.is_dynamo_compiling
    _tc: Any = torch.compiler
else:  # another torch: the public check alone
    _dynamo_compiling, _tc = is_compiling, SimpleNamespace(_is_compiling_flag=False)


def _region(name: str, attrs: dict[str, Any] | None = None) -> _Region:
    """A live phase region of the class in force (`_device._DeviceRegion` while a device is timed)."""
    region = _recorder.region_factory(name)
    if attrs is not None:
        region.attrs = attrs
    return region


class _State:
    """Where the detector is in the current step; one per process."""

    __slots__ = ("step", "boundary", "opt_end", "last_end", "stepped", "mb", "mb_fwd", "mb_bwd",
                 "pending", "data_driven", "train_src", "train_iter", "epoch", "epoch_fixed", "uses_opt",
                 "fetching", "fwd_depth", "fwd_kind", "fwd_region", "bwd_depth", "opt_depth", "opt_region",
                 "opt_owner", "opt_closure", "scaling", "aux_depth", "ckpt_depth", "coll_depth", "eval_t0",
                 "eval_t1", "eval_data", "eval_module", "eval_region", "eval_explicit", "gc_t0", "lazy")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.step: _Step | None = None  # the step this module opened and has not closed
        self.boundary: int | None = None  # perf ns where the next step begins
        self.opt_end: int | None = None  # end of the open step's last update: the step is complete
        self.last_end: int | None = None  # end of the open step's last phase
        self.stepped: list[int] = []  # ids of the optimizers that stepped in the open step
        self.mb = 0
        self.mb_fwd = False  # the current micro-batch had a forward
        self.mb_bwd = False  # ... and a backward
        self.pending: list[list[Any]] = []  # fetches (and zero_grads) not yet given to a step
        self.data_driven: bool | None = None  # batches come from a DataLoader; False: not one per step
        self.train_src: Any = None  # the loader (its sampler) training batches come from
        self.train_iter: weakref.ref[Any] | None = None  # the iterator of the current epoch
        self.epoch: int | None = None
        self.epoch_fixed = False  # a framework callback sets the epoch
        self.uses_opt: bool | None = None
        self.fetching = False
        self.fwd_depth = 0
        self.fwd_kind = _FWD_SKIP
        self.fwd_region: _Region | None = None
        self.bwd_depth = 0
        self.opt_depth = 0
        self.opt_region: _Region | None = None
        self.opt_owner: Any = None
        self.opt_closure = False
        self.scaling = False  # inside GradScaler.step: its optimizer's own step() is nested
        self.aux_depth = 0
        self.ckpt_depth = 0
        self.coll_depth = 0
        self.eval_t0: int | None = None
        self.eval_t1: int | None = None
        self.eval_data: list[list[Any]] = []  # the fetches an implicit evaluation pass absorbed
        self.eval_module: Any = None  # the module it last ran
        self.eval_region: _Region | None = None  # the live region of an explicit (framework) pass
        self.eval_explicit = False
        self.gc_t0: int | None = None
        self.lazy = False


_s = _State()


def _active() -> _recorder.Recorder | None:
    """The recorder, initialising it on first training activity in a process that waits to know
    whether it is a trainer (a `multiprocessing` child, see `install(lazy=True)`)."""
    r = _recorder._rec
    if r is None and _s.lazy:
        _s.lazy = False
        from torch.utils.data import get_worker_info
        if get_worker_info() is None:  # a DataLoader worker is never a trainer
            r = _recorder.auto_init()
    return r


# --- the step machine ------------------------------------------------------------------
def _ours(r: _recorder.Recorder, s: _State) -> bool:
    return s.step is not None and r.step is s.step


def _manual(s: _State) -> bool:
    """True in a loop that updates its weights without any torch optimizer."""
    if s.uses_opt is None:
        # Once per process, at the first ambiguous moment (forward after backward, no
        # optimizer step yet): gradient accumulation or a manual update?
        # At C speed (tens of ns per live object, no Python call each); type(), not isinstance(),
        # so no object's __class__ property runs (some warn, e.g. torch.distributed.reduce_op).
        s.uses_opt = any(map(issubclass, map(type, gc.get_objects()), itertools.repeat(torch.optim.Optimizer)))
    return not s.uses_opt


def _complete(s: _State) -> bool:
    return s.opt_end is not None or (s.mb_bwd and _manual(s))


def _begin(r: _recorder.Recorder, s: _State, t: int) -> _Step | None:
    t0 = t
    if s.pending:
        for entry in s.pending:
            if entry[_P_T0] < t0:
                t0 = entry[_P_T0]
        if not s.epoch_fixed:
            _track_epoch(s)
    if s.boundary is not None and s.boundary < t0:
        t0 = s.boundary
    # `_recorder.begin_step` written out: this runs every step.
    step = _Step(None, s.epoch, None)
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
    return step


def _close(r: _recorder.Recorder, s: _State, t1: int) -> None:
    step = s.step
    s.step = None
    s.opt_end = None
    if step is not None and r.step is step:
        _recorder._close_step(r, step, t1 if t1 > step.t0 else step.t0, None)  # `end_step`, written out
        roots = _roots
        if roots.discovering or not step.n % roots.REDISCOVER_EVERY:
            roots.step_closed(step.n)
    if s.boundary is None or s.boundary < t1:
        s.boundary = t1


def _close_if_complete(r: _recorder.Recorder, s: _State, t: int) -> None:
    """Before a sibling (checkpoint, evaluation): end our step if its update is done."""
    if _ours(r, s) and _complete(s):
        _close(r, s, s.opt_end if s.opt_end is not None else t)


def _train_activity(r: _recorder.Recorder, s: _State, t: int, phase: int, module: Any = None) -> _Step | None:
    """A training phase starts at `t`: close what it ends, open the step it belongs to."""
    if s.eval_t0 is not None and not s.eval_explicit:
        if module is not None and module is not s.eval_module and s.eval_data and not s.pending:
            # Another module's no-grad forward on the very batch this one now trains on (no
            # fetch in between): a teacher, not an evaluation. The batch goes back to the step.
            s.pending, s.eval_data = s.eval_data, []
            s.eval_t0 = s.eval_t1 = s.eval_module = None
        else:
            _end_eval(r, s)
    step = r.step
    if isinstance(step, _Step):
        if step is not s.step:
            return step  # the user's explicit `otel_train.step()` rules; phases only
        if phase != _PH_OPT:
            new_mb = s.mb_bwd and (phase == _PH_FWD or not s.mb_fwd)
            if s.opt_end is not None and not s.data_driven:
                _close(r, s, s.opt_end)  # a new forward after an optimizer step begins a new step
                step = None
            elif new_mb:
                if s.opt_end is None and _manual(s):
                    _close(r, s, _first_pending(s, t))
                    step = None
                else:
                    s.mb += 1
                    s.mb_fwd = s.mb_bwd = False
    if not isinstance(step, _Step):
        step = _begin(r, s, t)
    if s.pending:
        _resolve_pending(r, s)
    return step


def _first_pending(s: _State, t: int) -> int:
    for entry in s.pending:
        if entry[_P_T0] < t:
            t = entry[_P_T0]
    return t


def _resolve_pending(r: _recorder.Recorder, s: _State) -> None:
    """The batches fetched (and zero_grads made) before this training phase belong to its step."""
    attrs = _mb_attrs(s.mb)
    parent = _recorder.current_region()
    sources = []
    for name, t0, t1, src, _ in s.pending:
        _recorder.record(name, attrs if name is _DATA else None, t0, t1, parent)
        if src is not None:
            sources.append(src)
    s.pending.clear()
    if sources:
        if s.data_driven is None:
            s.data_driven = True
        if s.train_src is None or not any(src is s.train_src for src in sources):
            s.train_src = sources[-1]


def _track_epoch(s: _State) -> None:
    """A new pass over the training batches is a new epoch: a new iterator of the training
    loader, or a training loader never seen before (one built per epoch)."""
    data = [entry for entry in s.pending if entry[_P_ITER] is not None]
    if not data:
        return
    if s.train_src is None or not any(entry[_P_SRC] is s.train_src for entry in data):
        s.train_src = data[-1][_P_SRC]
    for entry in data:
        it = entry[_P_ITER]
        if entry[_P_SRC] is s.train_src and (s.train_iter is None or s.train_iter() is not it):
            s.epoch = 0 if s.epoch is None else s.epoch + 1
            s.train_iter = weakref.ref(it)  # weak: a dead iterator must shut its workers down


def _end_eval(r: _recorder.Recorder, s: _State) -> None:
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
        _recorder.record(_EVAL, None, t0, t1)
    if t1 is None:
        return
    if s.step is None and (s.boundary is None or s.boundary < t1):
        s.boundary = t1


def _eval_forward(r: _recorder.Recorder, s: _State, t: int) -> int:
    """An outermost forward without gradients or in eval mode starts at `t`: what is it?"""
    if s.eval_explicit:
        return _FWD_SKIP
    ours = _ours(r, s)
    if ours and (s.mb_fwd or s.mb_bwd) and not _complete(s):
        return _FWD_AUX  # mid-step (a target network, a metric): part of the step
    pending = s.pending
    if pending and pending[-1][_P_NAME] is _DATA and s.train_src is not None \
            and pending[-1][_P_SRC] is s.train_src:
        return _FWD_AUX  # right after fetching a training batch (a distillation teacher)
    t0 = t
    keep = []
    for entry in pending:
        if entry[_P_NAME] is _DATA and (s.train_src is None or entry[_P_SRC] is not s.train_src):
            if entry[_P_T0] < t0:
                t0 = entry[_P_T0]
            s.eval_data.append(entry)
        else:
            keep.append(entry)
    s.pending = keep
    if ours:
        _close(r, s, s.opt_end if s.opt_end is not None else t0)
    if s.eval_t0 is None:
        s.eval_t0 = t0
    return _FWD_EVAL


# --- hooks: forward ----------------------------------------------------------------------
class _Roots:
    """Forward hooks: global while discovering which modules are called outermost, then on those
    root modules only.

    Any global module hook sends *every* module call in the process down torch's slow path
    (measured here: +1.8 ms on an 18 ms step of a 2-layer transformer with no-op hooks). So the
    global hooks stay only for the first `DISCOVERY_STEPS` closed steps, time enough to see every
    model a step calls (a GAN's two, a teacher), and again for that long every
    `REDISCOVER_EVERY` steps, for models that first appear later (not once torch.compile has
    compiled anything: see `_compiled_anything`). In between, only the roots
    carry hooks; their submodules keep torch's fast path. While both are installed a root's call
    reaches our hooks twice, which the depth count absorbs.
    """

    DISCOVERY_STEPS = 2
    REDISCOVER_EVERY = 500

    def __init__(self) -> None:
        self.seen: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self.hooked: weakref.WeakKeyDictionary[torch.nn.Module, tuple[Any, Any]] = weakref.WeakKeyDictionary()
        self.global_handles: list[Any] = []
        self.discovering = False
        self.closed = 0

    def start(self) -> None:
        if self.discovering:
            return
        self._add_global()
        self.discovering = True
        self.closed = 0

    def _add_global(self) -> None:
        from torch.nn.modules import module as nn_module
        self.global_handles = [nn_module.register_module_forward_pre_hook(_forward_pre_hook),
                               nn_module.register_module_forward_hook(_forward_hook, always_call=True)]

    def _hook(self, module: torch.nn.Module) -> None:
        self.hooked[module] = (module.register_forward_pre_hook(_forward_pre_hook),
                               module.register_forward_hook(_forward_hook, always_call=True))

    def detach(self) -> None:
        """Remove every forward hook, remembering the roots found and the discovery under way."""
        for handle in self.global_handles:
            handle.remove()
        for pre, post in list(self.hooked.values()):
            pre.remove()
            post.remove()

    def attach(self) -> None:
        """Put back what `detach` removed."""
        if self.discovering:
            self._add_global()
        for module in list(self.hooked):
            self._hook(module)

    def step_closed(self, n: int | None) -> None:
        if self.discovering:
            self.closed += 1
            if self.closed >= self.DISCOVERY_STEPS and not _compiled_anything():
                self._settle()
        elif n is not None and n > 0 and n % self.REDISCOVER_EVERY == 0 and not _compiled_anything():
            self.start()

    def _settle(self) -> None:
        # Safe inside a hook: torch snapshots the hook dicts before it calls any of them.
        for module in list(self.seen):
            # A loss module only ever tells its hooks "not another forward": left unhooked,
            # its calls skip torch's hook dispatch (and ours) with the same outcome.
            if module not in self.hooked and not isinstance(module, _Loss):
                self._hook(module)
        self.seen = weakref.WeakSet()
        for handle in self.global_handles:
            handle.remove()
        self.global_handles = []
        self.discovering = False

    def remove_all(self) -> None:
        for handle in self.global_handles:
            handle.remove()
        for pre, post in list(self.hooked.values()):
            pre.remove()
            post.remove()
        self.__init__()  # type: ignore[misc]


_roots = _Roots()


def _compiled_anything() -> bool:
    """True once torch.compile has compiled a frame. Dynamo guards on the global hooks, so from
    then on they are never added or removed (that would compile every graph again); inside a
    compiled graph they cost nothing at run time anyway."""
    dynamo_utils = sys.modules.get("torch._dynamo.utils")
    return dynamo_utils is not None and dynamo_utils.counters["frames"]["total"] > 0


def _forward_pre_hook(module: torch.nn.Module, args: Any) -> None:
    if _dynamo_compiling() or _tc._is_compiling_flag:
        return None
    s = _s
    if s.fwd_depth:
        s.fwd_depth += 1
        return None
    if s.fetching:
        return None  # a transform module inside a batch fetch
    if _to_switch.armed:
        _to_switch.disarm()  # the batch is on its way in: no more copies of it to count
    if _roots.discovering:
        _roots.seen.add(module)
    r = _recorder._rec
    if r is None:
        if not s.lazy or not torch.is_grad_enabled() or (r := _active()) is None:
            return None
    t = r.now()
    if isinstance(module, _Loss):
        s.fwd_kind = _FWD_AUX  # a loss module called on the model's output is not another forward
    elif torch.is_grad_enabled() and module.training:
        if s.opt_depth and s.opt_region is not None and _recorder.current_region() is s.opt_region:
            # optimizer.step(closure): the closure's forward and backward are not the update.
            _recorder.abandon(s.opt_region)
            s.opt_region = None
            s.opt_closure = True
        step = _train_activity(r, s, t, _PH_FWD, module)
        s.fwd_region = _region(_FORWARD, _mb_attrs(s.mb)).__enter__()
        s.mb_fwd = True
        if step is not None and step is s.step:
            step.micro_batches = s.mb + 1
        s.fwd_kind = _FWD_TRAIN
    else:
        s.fwd_kind = _eval_forward(r, s, t)
        if s.fwd_kind == _FWD_EVAL:
            s.eval_module = module
    s.fwd_depth = 1
    return None


def _forward_hook(module: torch.nn.Module, args: Any, output: Any) -> None:
    if _dynamo_compiling() or _tc._is_compiling_flag:
        return None
    s = _s
    if not s.fwd_depth:
        return None
    s.fwd_depth -= 1
    if s.fwd_depth:
        return None
    kind = s.fwd_kind
    if kind == _FWD_TRAIN:
        region = s.fwd_region
        s.fwd_region = None
        if region is not None:
            region.__exit__(None, None, None)
            if region.rec is not None:
                s.last_end = region.t1
    elif kind == _FWD_EVAL:
        r = _recorder._rec
        if r is not None and s.eval_t0 is not None:
            s.eval_t1 = r.now()
    return None


# --- hooks: backward -----------------------------------------------------------------------
def _backward_patch(original: Callable[..., Any]) -> Callable[..., Any]:
    """`torch.autograd.backward` (which `Tensor.backward` calls) inside a `train.backward` region.

    The patched function itself, not a wrapper called by one (`_lean`): it runs every
    micro-batch, and each Python frame between torch's operations costs a few µs of cold cache."""
    s = _s

    @functools.wraps(original)
    def backward(*args: Any, **kwargs: Any) -> Any:
        if _dynamo_compiling() or _tc._is_compiling_flag or s.bwd_depth or s.eval_explicit:
            return original(*args, **kwargs)
        r = _recorder._rec
        if r is None and (r := _active()) is None:
            return original(*args, **kwargs)
        step = _train_activity(r, s, r.now(), _PH_BWD)
        region = _region(_BACKWARD, _mb_attrs(s.mb)).__enter__()
        s.bwd_depth = 1
        try:
            out = original(*args, **kwargs)
        except BaseException as err:
            region.__exit__(type(err), err, None)
            raise
        else:
            region.__exit__(None, None, None)
        finally:
            s.bwd_depth = 0
            s.mb_bwd = True
            if step is not None and step is s.step:
                step.micro_batches = s.mb + 1
            if region.rec is not None:
                s.last_end = region.t1
            if s.opt_closure and s.opt_depth and s.opt_region is None:
                s.opt_region = _region(_OPTIMIZER).__enter__()  # the update after the closure
        return out
    return backward


# --- hooks: optimizer ----------------------------------------------------------------------
def _optimizer_pre_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    if _dynamo_compiling() or _tc._is_compiling_flag:
        return None
    s = _s
    if s.opt_depth:
        stale = (optimizer is s.opt_owner and not s.scaling) or (
            s.opt_region is not None and _recorder.current_region() is not s.opt_region)
        if not stale:
            s.opt_depth += 1  # an optimizer wrapping another one
            return None
        if s.opt_region is not None:  # the previous step() raised: forget it
            _recorder.abandon(s.opt_region)
        s.opt_depth = 0
        s.opt_region = None
    r = _recorder._rec
    if r is None and (r := _active()) is None:
        return None
    _train_activity(r, s, r.now(), _PH_OPT)
    if s.data_driven and s.opt_end is not None and id(optimizer) in s.stepped:
        # The same optimizer twice for one fetched batch: several updates per batch, so a
        # batch fetch no longer marks a step; the next forward after an update does.
        s.data_driven = False
        _log.debug("otel_train: several optimizer steps per batch; steps now end at the next forward")
    s.opt_region = _region(_OPTIMIZER).__enter__()
    s.opt_owner = optimizer
    s.opt_closure = False
    s.opt_depth = 1
    return None


def _optimizer_post_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    if _dynamo_compiling() or _tc._is_compiling_flag:
        return None
    s = _s
    if not s.opt_depth:
        return None
    s.opt_depth -= 1
    if s.opt_depth:
        return None
    region = s.opt_region
    s.opt_region = None
    s.opt_owner = None
    s.opt_closure = False
    r = _recorder._rec
    if region is not None:
        region.__exit__(None, None, None)
    if r is None:
        return None
    t = region.t1 if region is not None and region.rec is not None else r.now()
    s.uses_opt = True
    if s.step is not None and r.step is s.step:  # `_ours`
        s.opt_end = s.last_end = t
        s.stepped.append(id(optimizer))
    return None


def _scaler_step_wrapper(wrapped: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    """`GradScaler.step(optimizer)` is the update, whether or not the scaler found inf/NaN
    gradients and skipped the optimizer's own `step()` (a skipped update is still a step)."""
    s = _s
    optimizer = args[1] if len(args) > 1 else kwargs.get("optimizer")
    if is_compiling() or s.opt_depth or optimizer is None:
        return wrapped(*args, **kwargs)
    _optimizer_pre_hook(optimizer, (), {})
    s.scaling = True
    try:
        out = wrapped(*args, **kwargs)
    finally:
        s.scaling = False
    _optimizer_post_hook(optimizer, (), {})
    return out


def _optimizer_aux_patch(original: Callable[..., Any]) -> Callable[..., Any]:
    """zero_grad and clip_grad_norm_: part of the update when inside a step. The patched
    function itself, as `_backward_patch` is."""
    s = _s

    @functools.wraps(original)
    def aux(*args: Any, **kwargs: Any) -> Any:
        if _dynamo_compiling() or _tc._is_compiling_flag or s.opt_depth or s.aux_depth or s.fwd_depth \
                or s.bwd_depth:
            return original(*args, **kwargs)
        r = _recorder._rec
        if r is None:
            return original(*args, **kwargs)
        if s.step is not None and r.step is s.step:  # `_ours`
            s.aux_depth = 1
            try:
                with _region(_OPTIMIZER) as region:
                    return original(*args, **kwargs)
            finally:
                s.aux_depth = 0
                if region.rec is not None:
                    s.last_end = region.t1
                    if s.opt_end is not None:
                        s.opt_end = region.t1  # step(); zero_grad(): the update ends after it
        pending = s.pending
        if not isinstance(r.step, _Step) and pending and pending[-1][_P_NAME] is _DATA:
            # A batch is waiting: the step it starts will own this.
            t0 = r.now()
            s.aux_depth = 1
            try:
                out = original(*args, **kwargs)
            finally:
                s.aux_depth = 0
            pending.append([_OPTIMIZER, t0, r.now(), None, None])
            return out
        return original(*args, **kwargs)
    return aux


# --- hooks: data ---------------------------------------------------------------------------
def _next_wrapper(wrapped: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    s = _s
    if is_compiling() or s.fetching or s.fwd_depth or s.eval_explicit:
        return wrapped(*args, **kwargs)
    r = _active()
    if r is None:
        return wrapped(*args, **kwargs)
    t0 = r.now()
    s.fetching = True
    try:
        batch = wrapped(*args, **kwargs)  # StopIteration: not a batch, nothing recorded
    finally:
        s.fetching = False
    t1 = r.now()
    # The loader's own (batch) sampler tells loaders apart, even two over one dataset.
    instance = args[0]
    src = getattr(instance, "_index_sampler", None)
    if _ours(r, s) and src is not None:
        if s.opt_end is not None and s.data_driven:
            _close(r, s, s.opt_end)  # the next batch: the step's updates are over
        elif s.opt_end is None and s.mb_bwd and s.data_driven and _manual(s):
            _close(r, s, t0)
    s.pending.append([_DATA, t0, t1, src, instance])
    _to_switch.arm()  # the batch's copies to the device, if any, come next
    return batch


def _lean_to(original: Callable[..., Any]) -> Callable[..., Any]:
    """`Tensor.to` with the batch's host-to-device copy counted as part of getting it.

    A plain function, not a wrapt wrapper: wrapt's binding and argument packing cost ~1.3 µs a
    call where this function costs ~0.5 µs. Dynamo traces through it (`is_compiling()`).
    """
    s = _s

    @functools.wraps(original)
    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        if is_compiling():  # first: Dynamo must not guard on our state
            return out
        pending = s.pending
        if pending and not s.fwd_depth:
            entry = pending[-1]
            r = _recorder._rec
            if entry[_P_NAME] is _DATA and r is not None:
                entry[_P_T1] = r.now()
        return out
    return to


class _ToSwitch:
    """`Tensor.to` is patched (`_lean_to`) only from a batch fetch until the next forward.

    `.to()` runs often where no batch is being copied: 28 times a step of the ~20 ms benchmark
    model (15 inside `clip_grad_norm_`, the rest inside attention). Patched throughout, each of
    those calls went through the wrapper, ~0.5 µs with warm caches and several µs between ops.
    Armed by a fetch and disarmed by the forward, it costs two attribute writes a step instead.
    Once torch.compile has compiled anything the switch stays as it is (Dynamo may guard on
    `Tensor.to`): armed, as before; disarmed, the copies count as part of the step, not its data.
    """

    __slots__ = ("owner", "original", "own", "patched", "armed")

    def __init__(self) -> None:
        self.owner: Any = None
        self.original: Any = None
        self.own = False
        self.patched: Any = None
        self.armed = False

    def install(self, owner: Any) -> None:
        self.owner, self.own = owner, "to" in vars(owner)
        self.original = vars(owner)["to"] if self.own else owner.to
        self.patched = _lean_to(self.original)
        self.armed = False

    def arm(self) -> None:
        if not self.armed and self.patched is not None and not _compiled_anything():
            self.owner.to = self.patched
            self.armed = True

    def disarm(self) -> None:
        if self.armed and not _compiled_anything():
            self._restore()

    def remove(self) -> None:
        if self.armed:
            self._restore()
        self.__init__()  # type: ignore[misc]

    def _restore(self) -> None:
        self.armed = False
        if vars(self.owner).get("to") is not self.patched:
            # Someone patched it over ours while armed: theirs stays, once, and we stop switching.
            _log.warning("otel_train: Tensor.to was patched again by someone else; it keeps their "
                         "wrapper, and a batch's copies to the device no longer count as data time.")
            self.patched = None
            return
        _unpatch(self.owner, "to", self.original, self.own, self.patched)


_to_switch = _ToSwitch()


# --- hooks: siblings (checkpoint, GC) -------------------------------------------------------
def _checkpoint_wrapper(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
    s = _s
    if s.ckpt_depth or s.fetching or is_compiling():
        return wrapped(*args, **kwargs)
    r = _recorder._rec
    if r is None:
        return wrapped(*args, **kwargs)
    _checkpoint_begin(r)
    s.ckpt_depth = 1
    try:
        with _region(_CHECKPOINT) as region:
            return wrapped(*args, **kwargs)
    finally:
        s.ckpt_depth = 0
        if region.rec is not None and s.step is None and (s.boundary is None or s.boundary < region.t1):
            s.boundary = region.t1


#: For the integrations: wrap a framework's "save a checkpoint" method with this.
checkpoint_wrapper = _checkpoint_wrapper


def eval_wrapper(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
    """For the integrations: a framework's "evaluate" method becomes one explicit eval pass."""
    if _recorder._rec is None or _s.eval_explicit or is_compiling():
        return wrapped(*args, **kwargs)
    eval_begin()
    try:
        return wrapped(*args, **kwargs)
    finally:
        eval_end()


def _checkpoint_begin(r: _recorder.Recorder) -> None:
    """A checkpoint starts: it follows the step, so a complete step ends first."""
    s = _s
    t = r.now()
    if s.eval_t0 is not None and not s.eval_explicit:
        _end_eval(r, s)
    _close_if_complete(r, s, t)


def _gc_callback(phase: str, info: dict[str, Any]) -> None:
    r = _recorder._rec
    if r is None:
        return
    s = _s
    if phase == "start":
        s.gc_t0 = r.now()
        return
    t0 = s.gc_t0
    if t0 is None:
        return
    s.gc_t0 = None
    t1 = r.now()
    if r.step is None or (info.get("generation", 2) < 2 and t1 - t0 < GC_MIN_PAUSE_NS):
        return  # before the first step there is no step to attribute a pause to
    _recorder.record(_GC, None, t0, t1)


# --- hooks: collectives ----------------------------------------------------------------------
#: Collective -> (parameter holding the payload, parameter holding the group).
_COLLECTIVES: dict[str, str | None] = {
    "all_reduce": "tensor", "broadcast": "tensor", "reduce": "tensor", "all_gather": "tensor",
    "all_gather_into_tensor": "input_tensor", "reduce_scatter": "input_list",
    "reduce_scatter_tensor": "input", "all_to_all": "input_tensor_list",
    "all_to_all_single": "input", "gather": "tensor", "scatter": "scatter_list", "barrier": None,
}


def _nbytes(payload: Any) -> int:
    if isinstance(payload, torch.Tensor):
        return payload.numel() * payload.element_size()
    if isinstance(payload, (list, tuple)):
        return sum(t.numel() * t.element_size() for t in payload if isinstance(t, torch.Tensor))
    return 0


def _collective_wrapper(op: str, payload_at: int | None, payload_name: str | None, group_at: int | None
                        ) -> Callable[..., Any]:
    def wrapper(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
        s = _s
        if s.coll_depth or is_compiling():
            return wrapped(*args, **kwargs)
        r = _recorder._rec
        if r is None:
            return wrapped(*args, **kwargs)
        payload = None
        if payload_at is not None:
            payload = args[payload_at] if len(args) > payload_at else kwargs.get(payload_name)
        group = args[group_at] if group_at is not None and len(args) > group_at else kwargs.get("group")
        attrs = {semconv.COMM_OP: op, semconv.COMM_BYTES: _nbytes(payload)}
        try:
            attrs[semconv.COMM_GROUP_SIZE] = torch.distributed.get_world_size(group)
        except Exception:  # noqa: BLE001 - not a member, or not initialised: the call itself will say
            pass
        s.coll_depth = 1
        try:
            with _region(_COLLECTIVE, attrs) as region:
                return wrapped(*args, **kwargs)
        finally:
            s.coll_depth = 0
            if s.opt_end is not None and region.rec is not None and region.step is s.step:
                s.opt_end = region.t1  # after the update (a logged loss): the step ends after it
    return wrapper


# --- the integrations' entry points ------------------------------------------------------------
def set_epoch(epoch: int | None) -> None:
    """A framework knows the epoch: it wins over the one counted from DataLoader iterators."""
    _s.epoch = epoch
    _s.epoch_fixed = epoch is not None


def eval_begin() -> None:
    """A framework starts an evaluation pass: no phase is recorded until `eval_end()`."""
    r = _recorder._rec
    s = _s
    if r is None or not _installed:
        return
    t = r.now()
    if s.eval_t0 is not None:
        if s.eval_explicit:
            return
        _end_eval(r, s)
    _close_if_complete(r, s, t)
    s.eval_explicit = True
    s.eval_region = _region(_EVAL).__enter__()
    s.eval_t0 = t
    s.eval_t1 = None


def eval_end() -> None:
    """The evaluation pass (explicit, or detected from forwards) is over."""
    r = _recorder._rec
    s = _s
    if r is None or s.eval_t0 is None:
        return
    if s.eval_explicit:
        s.eval_t1 = r.now()
    _end_eval(r, s)


def finish() -> None:
    """Training is over: close the evaluation pass and the last step at their real ends."""
    r = _recorder._rec
    s = _s
    s.pending.clear()
    if r is None:
        s.step = None
        return
    if s.eval_t0 is not None:
        if s.eval_explicit:
            s.eval_t1 = r.now()
        _end_eval(r, s)
    if _ours(r, s):
        end = s.opt_end if s.opt_end is not None else s.last_end
        _close(r, s, end if end is not None else r.now())
    s.step = None


def _at_exit() -> None:
    if _installed:
        finish()


# --- install / uninstall ------------------------------------------------------------------------
_installed = False
_handles: list[Any] = []
_patches: list[tuple[Any, str, Any, bool, Any]] = []
_skipped_code: list[Any] = []


def installed() -> bool:
    return _installed


def install(lazy: bool = False) -> None:
    """Install every hook and patch (idempotent). `lazy`: initialise the runtime at the first
    training activity, not now (a `multiprocessing` child may turn out to be a DataLoader worker)."""
    global _installed
    if _installed:
        return
    _installed = True
    _s.reset()
    _s.lazy = lazy
    _roots.start()
    _add_optimizer_hooks()
    gc.callbacks.append(_gc_callback)
    warnings.filterwarnings("ignore", message=_COMPILE_HOOK_WARNING, category=UserWarning)
    # shutdown() (explicit, at exit or on SIGTERM) first lets us close the last step at its real end.
    _runtime.before_shutdown(_at_exit)

    import torch.amp.grad_scaler
    import torch.nn.utils
    import torch.nn.utils.clip_grad
    import torch.utils.data.dataloader as dataloader
    # What runs every step gets a plain function (`lean`); the rest keeps wrapt.
    _patch_made(torch.autograd, "backward", _backward_patch)
    _patch_made(torch.optim.Optimizer, "zero_grad", _optimizer_aux_patch)
    _patch_made(torch.nn.Module, "zero_grad", _optimizer_aux_patch)
    _patch_made(torch.nn.utils, "clip_grad_norm_", _optimizer_aux_patch)
    _patch_made(torch.nn.utils.clip_grad, "clip_grad_norm_", _optimizer_aux_patch)
    _patch(dataloader._BaseDataLoaderIter, "__next__", _next_wrapper, lean=True)
    _patch(torch.amp.grad_scaler.GradScaler, "step", _scaler_step_wrapper, lean=True)
    _to_switch.install(torch.Tensor)
    _patch(torch, "save", _checkpoint_wrapper)
    _patch(torch.serialization, "save", _checkpoint_wrapper)
    if torch.distributed.is_available():
        _patch_collectives()
    _imports.when_imported("torch.distributed.checkpoint", _patch_dcp)
    _imports.when_imported("torch._dynamo.eval_frame", _skip_dynamo_frames)


def claim() -> bool | None:
    """For framework callbacks: make sure detection runs. None when disabled (nothing may be
    installed), True when this call installed it (the caller uninstalls it), False otherwise."""
    if _runtime.sdk_disabled() or _runtime.init() is None:
        return None
    if _installed:
        return False
    install()
    return True


def uninstall() -> None:
    """Close what is open, then remove every hook and restore every patched function."""
    global _installed
    if not _installed:
        return
    finish()
    _installed = False
    _imports.cancel(_patch_dcp)
    _imports.cancel(_skip_dynamo_frames)
    for handle in _handles:
        handle.remove()
    _handles.clear()
    _roots.remove_all()
    try:
        gc.callbacks.remove(_gc_callback)
    except ValueError:
        pass
    warnings.filters[:] = [f for f in warnings.filters if not (
        f[0] == "ignore" and getattr(f[1], "pattern", None) == _COMPILE_HOOK_WARNING)]
    getattr(warnings, "_filters_mutated", lambda: None)()
    while _patches:
        _unpatch(*_patches.pop())
    _to_switch.remove()
    _unskip_dynamo_frames()
    _runtime.remove_before_shutdown(_at_exit)
    _s.reset()


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Installed detection out of the way inside the block: every hook and patch removed, then put
    back as they were (the step machine keeps its state, discovery its roots; a step left open
    spans the block). For the overhead benchmark, whose plain steps alternate one by one with
    automatic ones: reinstalling for each would restart discovery every time. Not reentrant."""
    if not _installed:
        yield
        return
    _roots.detach()
    for handle in _handles:
        handle.remove()
    _handles.clear()
    gc.callbacks.remove(_gc_callback)
    _to_switch.disarm()
    ours = [patch for patch in _patches if vars(patch[0]).get(patch[1]) is patch[4]]
    for patch in ours:
        _unpatch(*patch)
    try:
        yield
    finally:
        for owner, name, _, _, patched in ours:
            setattr(owner, name, patched)
        gc.callbacks.append(_gc_callback)
        _add_optimizer_hooks()
        _roots.attach()


def _add_optimizer_hooks() -> None:
    from torch.optim import optimizer as optim_module
    _handles.append(optim_module.register_optimizer_step_pre_hook(_optimizer_pre_hook))
    _handles.append(optim_module.register_optimizer_step_post_hook(_optimizer_post_hook))


def patch_once(owner: Any, name: str, wrapper: Callable[..., Any]) -> None:
    """For the integrations: patch a framework method until `uninstall()` (once, while installed)."""
    if _installed and not any(p[0] is owner and p[1] == name for p in _patches):
        _patch(owner, name, wrapper)


def _patch(owner: Any, name: str, wrapper: Callable[..., Any], lean: bool = False) -> None:
    """Replace `owner.name` by a wrapt wrapper around it. `lean`, for what runs every step: by
    a plain function calling `wrapper(original, args, kwargs)` (a method's `self` is `args[0]`),
    ~0.1 µs a call where wrapt's binding costs 0.6-1.3 µs and trips torch.compile's guards when
    a compiled function calls it."""
    _patch_made(owner, name, lambda original: _lean(original, wrapper) if lean
                else wrapt.FunctionWrapper(original, wrapper))


def _patch_made(owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Replace `owner.name` by `make(original)`."""
    own = name in vars(owner)
    original = vars(owner)[name] if own else getattr(owner, name)
    patched = make(original)
    setattr(owner, name, patched)
    _patches.append((owner, name, original, own, patched))


def _lean(original: Callable[..., Any], wrapper: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def patched(*args: Any, **kwargs: Any) -> Any:
        return wrapper(original, args, kwargs)
    return patched


def _unpatch(owner: Any, name: str, original: Any, own: bool, patched: Any) -> None:
    current = vars(owner).get(name)
    if current is not patched:
        _log.warning("otel_train: %s.%s was patched again by someone else; it keeps their wrapper.",
                     getattr(owner, "__name__", owner), name)
        return
    if own:
        setattr(owner, name, original)
    else:
        delattr(owner, name)


def _patch_collectives() -> None:
    import inspect

    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d
    for op, payload_name in _COLLECTIVES.items():
        fn = getattr(c10d, op, None)
        if fn is None:
            continue
        try:
            params = list(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            continue
        payload_at = params.index(payload_name) if payload_name in params else None
        group_at = params.index("group") if "group" in params else None
        wrapper = _collective_wrapper(op, payload_at, payload_name, group_at)
        for owner in (dist, c10d):
            if getattr(owner, op, None) is fn:
                _patch(owner, op, wrapper)


def _patch_dcp(module: ModuleType) -> None:
    if not _installed:
        return
    for name in ("save", "load", "async_save", "save_state_dict", "load_state_dict"):
        fn = getattr(module, name, None)
        if fn is None:
            continue
        _patch(module, name, _checkpoint_wrapper)
        for sub in ("state_dict_saver", "state_dict_loader"):
            submodule = getattr(module, sub, None)
            if submodule is not None and getattr(submodule, name, None) is fn:
                _patch(submodule, name, _checkpoint_wrapper)


def _our_code() -> list[CodeType]:
    """The code of every function and method of the hot-path modules, nested ones included."""
    from otel_train.record import device as _device

    found: dict[CodeType, None] = {}

    def add(code: CodeType) -> None:
        found[code] = None
        for const in code.co_consts:
            if isinstance(const, CodeType):
                add(const)

    for module in (sys.modules[__name__], _recorder, _device):
        for obj in vars(module).values():
            if getattr(obj, "__module__", None) != module.__name__:
                continue
            members = vars(obj).values() if isinstance(obj, type) else (obj,)
            for member in members:
                for fn in (member, getattr(member, "fget", None), getattr(member, "__func__", None)):
                    # Only code written in that module: a decorated function's is often the
                    # decorator's, shared by every function it decorates (`contextmanager`'s
                    # `helper` for `paused`), which must stay Dynamo's to judge.
                    if isinstance(fn, FunctionType) and fn.__code__.co_filename == module.__file__:
                        add(fn.__code__)
    return list(found)


def _skip_dynamo_frames(module: ModuleType) -> None:
    """Our hooks and patched functions run eagerly between the frames torch.compile captures
    (the compiled module's own hooks, a `.backward()` after a graph break), and Dynamo would
    otherwise try to compile each frame they and the recorder open, counting an attempt for
    every one. Skipped here, each frame still lets Dynamo see what it calls (the patched torch
    function); inside a traced frame Dynamo inlines them (`is_compiling()` comes first)."""
    if not _installed:
        return
    try:
        from torch._dynamo.types import FrameAction, FrameExecStrategy
        for code in _our_code():
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
