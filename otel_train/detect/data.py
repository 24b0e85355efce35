"""Batch fetches: `_BaseDataLoaderIter.__next__`, and the `Tensor.to` copies right after it.

A fetch is `train.data`, with the batch's host-to-device copy when seen, and the batch's size
(`batch_size`); it is held until a forward shows what it fed (the training step that follows, or an evaluation: `machine`). The
loader's own (batch) sampler tells loaders apart, even two over one dataset; a new iterator of
the training loader is a new epoch.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch

from otel_train.detect import phase
from otel_train.detect.batch_size import size_of
from otel_train.detect.compile import compiled_anything, is_compiling
from otel_train.detect.machine import close, manual, ours
from otel_train.detect.patches import Patches, unpatch
from otel_train.detect.state import DATA, P_NAME, P_T1, active
from otel_train.detect.state import s as _s
from otel_train.record import recorder

_log = logging.getLogger("otel_train")
patches = Patches()


def next_wrapper(wrapped: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    s = _s
    if is_compiling() or s.fetching or s.fwd_depth or s.eval_explicit:
        return wrapped(*args, **kwargs)
    r = active()
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
    if ours(r, s) and src is not None:
        if s.opt_end is not None and s.data_driven:
            close(r, s, s.opt_end)  # the next batch: the step's updates are over
        elif s.opt_end is None and s.mb_bwd and s.data_driven and manual(s):
            close(r, s, t0)
    if s.phase is not None:
        phase.end(r, s)
    s.pending.append([DATA, t0, t1, src, instance, size_of(batch)])
    to_switch.arm()  # the batch's copies to the device, if any, come next
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
            r = recorder._rec
            if entry[P_NAME] is DATA and r is not None:
                entry[P_T1] = r.now()
        return out
    return to


class ToSwitch:
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
        if not self.armed and self.patched is not None and not compiled_anything():
            self.owner.to = self.patched
            self.armed = True

    def disarm(self) -> None:
        if self.armed and not compiled_anything():
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
        unpatch(self.owner, "to", self.original, self.own, self.patched)


to_switch = ToSwitch()


def install() -> None:
    import torch.utils.data.dataloader as dataloader
    patches.wrap(dataloader._BaseDataLoaderIter, "__next__", next_wrapper, lean=True)
    to_switch.install(torch.Tensor)


def uninstall() -> None:
    patches.undo()
    to_switch.remove()
