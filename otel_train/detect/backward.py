"""Backward passes: `torch.autograd.backward` (which `Tensor.backward` calls) is patched.

Each call is `train.backward` (per micro-batch). DDP's gradient all-reduce runs inside it in
C++ and is part of it. Inside `optimizer.step(closure)`, a closure evaluation's backward nests
under the update (`optimizer`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from otel_train.detect.compile import compiled as _c, dynamo_compiling, tc
from otel_train.detect.machine import train_activity
from otel_train.detect.patches import Patches
from otel_train.detect.roots import roots
from otel_train.detect import entry, phase
from otel_train.detect.state import BACKWARD, MB_ATTRS, PH_BWD, State, active, caught_up, mb_attrs, region
from otel_train.detect.state import s as _s
from otel_train.record import recorder
from otel_train.record.recorder import Region

try:  # the common path in C (`_loops.c`); `backward_python` is the fallback
    from otel_train.detect import _loops
except ImportError:
    _loops = None  # type: ignore[assignment]

patches = Patches()


def backward_patch(original: Callable[..., Any]) -> Callable[..., Any]:
    """`torch.autograd.backward` inside a `train.backward` region: an object in C that calls
    `backward_run` (`entry`: no frame of ours in a traceback from autograd), else this Python
    function, the patched function itself rather than a wrapper called by one (a frame fewer in a
    traceback)."""
    made = entry.make(original, busy, globals(), "backward_run", entry.CALL)
    if made is not None:
        return made
    s = _s

    @functools.wraps(original)
    def backward(*args: Any, **kwargs: Any) -> Any:
        if _c.seen and dynamo_compiling() or tc._is_compiling_flag or busy(s) and caught_up(busy, s):
            return original(*args, **kwargs)
        return backward_run(original, args, kwargs)
    return backward


def busy_python(s: State) -> bool:
    """A backward now is no micro-batch's: one inside a backward, or inside a framework's
    evaluation pass. `busy`: in C (`_loops.backward_busy`)."""
    return bool(s.bwd_depth or s.eval_explicit)


busy = _loops.backward_busy if _loops is not None else busy_python


def backward_python(original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> Any:
    """The patched function past its checks: `original(*args, **kwargs)` as `train.backward`.
    `backward_run`: its common path in C (`_loops.backward_run`), which calls this for the rest."""
    s = _s
    kwargs = kwargs or {}
    r = recorder._rec
    if r is None and (r := active()) is None:
        return original(*args, **kwargs)
    if s.opt_depth and s.part_phase is not None:  # a closure evaluation nested under the update
        s.bwd_depth = 1
        try:
            with region(BACKWARD):
                return original(*args, **kwargs)
        finally:
            s.bwd_depth = 0
    step = train_activity(r, s, r.now(), PH_BWD)
    if not s.mb_fwd and step is not None and not roots.discovering:
        roots.unseen(step.n)  # no forward seen: a model built after discovery settled
    live = Region(BACKWARD)  # `state.region(BACKWARD, mb_attrs(mb))` written out: every micro-batch
    mb = s.mb
    live.attrs = MB_ATTRS[mb] if mb < 256 else mb_attrs(mb)
    live = live.__enter__()
    s.bwd_depth = 1
    try:
        out = original(*args, **kwargs)
    except BaseException as err:
        live.__exit__(type(err), err, None)
        raise
    else:
        live.__exit__(None, None, None)
    finally:
        s.bwd_depth = 0
        s.mb_bwd = True
        if step is not None and step is s.step:
            step.micro_batches = s.mb + 1
        if live.rec is not None:
            s.last_end = live.t1
            if live.parent is None and step is not None and step is s.step:
                s.cover += (live.t0, live.t1)  # `coverage.cover`, written out
        if s.opt_depth and s.opt_closure:
            phase.part_begin(s, phase.STEP)  # the update after the closure's one evaluation
    return out


if _loops is not None:
    _loops.bind_backward(_s, roots, recorder, Region, BACKWARD, backward_python, phase.part_begin, phase.STEP,
                         PH_BWD)
backward_run = _loops.backward_run if _loops is not None else backward_python


def install() -> None:
    patches.replace(torch.autograd, "backward", backward_patch)


def uninstall() -> None:
    patches.undo()
