"""Batch fetches: `_BaseDataLoaderIter.__next__`, and the `Tensor.to` copies right after it.

A fetch is `train.data`, with the batch's host-to-device copy when seen, and the batch's size
(`batch_size`); it is held until a forward shows what it fed (the training step that follows,
or an evaluation: `machine`). The loader's own (batch) sampler tells loaders apart, even two
over one dataset; a new iterator of the training loader is a new epoch.

The copy edge (`Tensor.to` after a fetch, until the next forward) is decided once, at the
first fetch: where torch has an accelerator to copy to, `Tensor.to` is patched then and stays
patched (its check is one attribute read while no batch is on its way in); where it has none,
there is no host-to-device copy to count, `Tensor.to` is never touched, and `train.data` is
the fetch. Writing a class attribute of `torch.Tensor` invalidates CPython's attribute caches
for every `Tensor` lookup in torch's Python code: doing it around every batch cost ~+25 µs a
step on its own (issue 31), so it is done at most once.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch

from otel_train import _compat
from otel_train.detect import _loops, entry, phase
from otel_train.detect.batch_size import size_of
from otel_train.detect.compile import compiled as _c
from otel_train.detect.compile import dynamo_compiling, tc
from otel_train.detect.machine import close, manual
from otel_train.detect.patches import Patches
from otel_train.detect.state import DATA, P_NAME, P_T1, active
from otel_train.detect.state import s as _s
from otel_train.record import recorder

_log = logging.getLogger("otel_train")
patches = Patches()


def next_patch(original: Callable[..., Any]) -> Callable[..., Any]:
    """`_BaseDataLoaderIter.__next__` timed as a batch fetch: an object in C that calls `fetch`
    (`entry`: no frame of ours in a traceback from the user's dataset)."""
    return entry.make(original, busy, globals(), "fetch", entry.FETCH)


#: `busy(s)`: a fetch now is not a training batch: one inside a fetch or a forward, or inside a
#: framework's evaluation pass (which times its own). In C: every fetch and replayed fetch asks.
busy = _loops.fetch_busy


def fetch_rest(original: Callable[..., Any], iterator: Any) -> Any:
    """`original(iterator)` timed as a batch fetch, held pending: what `fetch` (in C,
    `_loops.fetch`) calls from its start for what it does not take (nothing records)."""
    s = _s
    r = recorder._rec
    if r is None and (r := active()) is None:
        return original(iterator)
    t0 = r.now()
    s.fetching = True
    try:
        batch = original(iterator)  # StopIteration: not a batch, nothing recorded
    finally:
        s.fetching = False
    t1 = r.now()
    # The loader's own (batch) sampler tells loaders apart, even two over one dataset.
    src = getattr(iterator, "_index_sampler", None)
    if src is not None and s.step is not None and r.step is s.step:  # `machine.ours`
        if s.opt_end is not None and s.data_driven:
            close(r, s, s.opt_end)  # the next batch: the step's updates are over
        elif s.opt_end is None and s.mb_bwd and s.data_driven and (
                s.uses_opt is False or s.uses_opt is None and manual(s)):  # `machine.manual`
            close(r, s, t0)
    if s.phase is not None:
        phase.end(r, s)
    s.pending.append([DATA, t0, t1, src, iterator, size_of(batch) if s.replay is None else s.replay[2]])
    if copy_edge.needed:
        s.copying = True  # the batch's copies to the device, if any, come next
    elif copy_edge.needed is None:
        copy_edge.decide(s)
    return batch


def _lean_to(original: Callable[..., Any]) -> Callable[..., Any]:
    """`Tensor.to` with the batch's host-to-device copy counted as part of getting it: an object
    in C that calls `copy_run` (`entry`: no frame of ours in the traceback of a copy that fails,
    a device out of memory among them); Dynamo traces the Python function `to` in its place
    (the compile check comes first: Dynamo must not guard on our state).

    Not a wrapt wrapper: wrapt's binding and argument packing cost ~1.3 µs a call. This adds
    ~0.25 µs to a `.to()` while no batch is on its way in (2026-11-27, the 2-core VM: 1.14-1.15
    µs a call against plain torch's 0.89; the Python function before it, 1.17-1.21).
    """
    @functools.wraps(original)
    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _c.seen and dynamo_compiling() or tc._is_compiling_flag:
            return original(self, *args, **kwargs)
        return copy_run(original, (self, *args), kwargs)
    # Not a `MethodEntry`: Dynamo calls a tensor's `to` by name, never through this attribute,
    # and an unbound `Tensor.to(x, ...)` is `to` called as it is.
    return entry.make(original, None, globals(), "copy_run", entry.CALL, for_dynamo=to)


def copy_run(original: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    """`original(*args, **kwargs)`; while a fetched batch's copies are under way (before its
    forward), the time after it is the end of the batch's `train.data`."""
    out = original(*args, **kwargs)
    if not _s.copying:
        return out
    pending = _s.pending
    if pending and not _s.fwd_depth:
        last = pending[-1]
        r = recorder._rec
        if last[P_NAME] is DATA and r is not None:
            last[P_T1] = r.now()
    return out


def _accelerator_present() -> bool:
    """Whether this process could copy a batch to a device: an accelerator compiled into torch
    and present (compile-time facts and device counts; no device is initialised)."""
    try:
        if torch.backends.cuda.is_built() and torch.cuda.is_available():
            return True
        xpu = getattr(torch, "xpu", None)
        if xpu is not None and xpu.is_available():
            return True
        return bool(torch.backends.mps.is_available())
    except Exception:  # noqa: BLE001 - an odd build: count copies as before
        _log.debug("otel_train: cannot tell whether an accelerator is present", exc_info=True)
        return True


class CopyEdge:
    """Whether `train.data` ends at the batch's last `Tensor.to` copy (`needed`: None until the
    first fetch decides, then True or False for the rest of the install)."""

    __slots__ = ("needed",)

    def __init__(self) -> None:
        self.needed: bool | None = None

    def decide(self, s: Any) -> None:
        self.needed = _accelerator_present()
        if self.needed:
            patches.replace(torch.Tensor, "to", _lean_to)
            s.copying = True  # this very batch's copies come next


copy_edge = CopyEdge()


_loops.bind_fetch(_s, recorder, fetch_rest, close, manual, phase.end, copy_edge)
#: `fetch(original, iterator)`: the patched `__next__` past its checks, `original(iterator)` timed
#: as a batch fetch and held pending for the next training phase. In C, `fetch_rest` for the rest.
fetch = _loops.fetch


def install() -> None:
    copy_edge.needed = None
    patches.replace(_compat.dataloader_iter_class(), "__next__", next_patch)


def uninstall() -> None:
    patches.undo()
    copy_edge.needed = None
