"""Backward passes: `torch.autograd.backward` (which `Tensor.backward` calls) is patched.

Each call is `train.backward` (per micro-batch). DDP's gradient all-reduce runs inside it in
C++ and is part of it. Inside `optimizer.step(closure)`, a closure evaluation's backward nests
under the update (`optimizer`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from otel_train.detect.machine import train_activity
from otel_train.detect.patches import Patches
from otel_train.detect.roots import roots
from otel_train.detect import _loops, entry, phase
from otel_train.detect.state import BACKWARD, MB_ATTRS, PH_BWD, active, mb_attrs, region
from otel_train.detect.state import s as _s
from otel_train.record import recorder
from otel_train.record.recorder import Region

patches = Patches()


def backward_patch(original: Callable[..., Any]) -> Callable[..., Any]:
    """`torch.autograd.backward` inside a `train.backward` region: an object in C that calls
    `backward_run` (`entry`: no frame of ours in a traceback from autograd)."""
    return entry.make(original, busy, globals(), "backward_run", entry.CALL)


#: `busy(s)`: a backward now is no micro-batch's: one inside a backward, or inside a framework's
#: evaluation pass. In C: every backward and replayed backward asks.
busy = _loops.backward_busy


def backward_rest(original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> Any:
    """The patched function past its checks: `original(*args, **kwargs)` as `train.backward`,
    from its start, for what `backward_run` (in C, `_loops.backward_run`) does not take."""
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


_loops.bind_backward(_s, roots, recorder, Region, BACKWARD, backward_rest, phase.part_begin, phase.STEP, PH_BWD)
#: `backward_run(original, args, kwargs)`: the patched function past its checks, in C; its common
#: path (a micro-batch's backward in the open step), `backward_rest` for the rest.
backward_run = _loops.backward_run


def install() -> None:
    patches.replace(torch.autograd, "backward", backward_patch)


def uninstall() -> None:
    patches.undo()
