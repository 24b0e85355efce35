"""Work beside training that detection must neither see nor count in any step.

- `paused()`: installed detection out of the way inside a block: every hook and patch removed,
  then put back as they were (the step machine keeps its state, discovery its roots; a step
  left open spans the block). Not reentrant.
- `outside_training()`: for work a framework callback or a benchmark does *between* two steps
  (a latency benchmark on synthetic batches): a step whose update is complete ends now, as
  before a checkpoint; the block runs with detection paused, so its forwards and backwards are
  no phases of a step; and the next step begins at the end of the block, so its time lands in
  no step. Nested blocks are one.

Both are no-ops where detection is not installed (the explicit API's own steps rule there).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

from otel_train.detect import gc_pauses, optimizer, state
from otel_train.detect.machine import close_if_complete, end_eval
from otel_train.detect.patches import Patches, unpatch
from otel_train.detect.roots import roots
from otel_train.detect.state import s as _s
from otel_train.record import recorder

_depth = 0  # `outside_training` blocks open (`paused` is not reentrant)


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Installed detection out of the way inside the block (module docstring). Calls that wait
    to run (`batch`) keep waiting: they run with their own times, as a step left open does."""
    if not state.installed:
        yield
        return
    roots.detach()
    optimizer.remove_hooks()
    gc.callbacks.remove(gc_pauses.gc_callback)
    _s.copying = False  # no copies of a batch to count across the block (`data.copy_edge`)
    ours = [patch for patches in Patches.everywhere for patch in patches.made
            if vars(patch[0]).get(patch[1]) is patch[4]]
    for patch in ours:
        unpatch(*patch)
    try:
        yield
    finally:
        for owner, name, _, _, patched in ours:
            setattr(owner, name, patched)
        gc.callbacks.append(gc_pauses.gc_callback)
        optimizer.add_hooks()
        if roots.discovering:
            roots.add_global()
        for module in list(roots.hooked):
            roots.hook(module)


@contextlib.contextmanager
def outside_training() -> Iterator[None]:
    """Run the block between steps, unseen by detection and counted in no step (module docstring)."""
    recorder.settle()
    global _depth
    if _depth or not state.installed:
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1
        return
    s = _s
    r = recorder._rec
    if r is not None:
        if s.eval_t0 is not None and not s.eval_explicit:
            end_eval(r, s)  # a detected evaluation pass before the block is over
        close_if_complete(r, s, r.now())
    _depth += 1
    try:
        with paused():
            yield
    finally:
        _depth -= 1
        if r is not None and recorder._rec is r and s.step is None:
            end = r.now()
            if s.boundary is None or s.boundary < end:
                s.boundary = end  # the next step starts here, not before the block
