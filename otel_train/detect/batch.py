"""Detection's common calls run in batches: the step machine settled a few steps at a time.

Per call, each of detection's bodies (`forward_begin`, `backward_run`, `fetch`...) runs cold:
its code, the state it reads and the CPython API behind them have left the core's caches by
the next call, and on a small CPU step that costs more than the work itself (docs/design.md,
"Detection's calls batched"). So on the main thread the hooks' entry points (`_ENTRY_POINTS`),
and the GC callback, only note the call with what only its moment knows (the clock; grad mode
and the module's `training`; the batch's size; the update's frames; zero_grad's place), and
`settle` runs the notes through the same bodies in order, the recorder's clock reading each
note's times and the bodies reading the noted facts (`State.replay`, `_loops.set_replay`):

- once `BATCH_CALLS` notes wait, or the first has waited `MAX_WAIT_NS`;
- before anything reads or changes what the bodies keep: a region or step entered or the
  current region read (`_hotpath.set_settle`), tags, events, links, a flush, detection's other
  hooks (evaluation, checkpoints, collectives, GradScaler, the framework callbacks),
  `set_epoch`, `finish`, `outside_training`;
- before any call that goes straight to its body.

Where something reads the step every step (a span of the user's, a tag), batches stay a step
or less, which saves nothing and costs the notes: after `SMALL_BATCHES` such batches in a row
every call runs at once, as before.

A call goes straight to its body (after `settle`) where a note could not hold what the body
reads: off the main thread, where torch has an accelerator (device events and the batch's
copies are read at the call), while roots are discovered, once anything was compiled, inside
an optimizer step() that evaluates a closure or wraps another, an evaluation forward, a
zero_grad at a call site not placed yet. A wrapped call (a fetch, a backward, a zero_grad) is
noted when it begins and completed when it ends; replayed, its body calls a stand-in for the
user's function that replays the calls noted in between and returns (or raises what the call
raised). A settle inside a wrapped call still running replays up to it: a span opened inside a
backward (a tensor hook) nests under what was current before it. GC pauses during a replay
are not recorded (they are the replay's own). A replay that fails is logged once, the rest of
its batch dropped and counted, and calls go straight to their bodies from then on.

The noting entry points' common paths and the replay are in C (`_batch.c`): a note made in
Python cost each hook three to five Python calls of its own. The entry points here are what
it calls, from their start, for anything it does not take (`_IN_C`). Batching runs where the
recorder's C hot path is built (`record._hotpath`, whose clock the replay pins).
"""

from __future__ import annotations

import logging
import sys
from threading import get_ident, main_thread
from typing import Any

import torch

from otel_train.detect import _batch, _loops, backward, data, forward, gc_pauses, optimizer, sites
from otel_train.detect._batch import (BACKWARD, CLIP, ERROR, FETCH, FWD_BEGIN, FWD_END, GC, INDEX, INNER, OPT_BEGIN,
                                      OPT_END, T1, ZERO_GRAD)
from otel_train.detect.batch_size import size_of
from otel_train.detect.compile import compiled as _c
from otel_train.detect.roots import roots
from otel_train.detect.state import s as _s
from otel_train.record import recorder

try:  # the recorder's hot path in C (optional: `otel_train.record.recorder` has it in Python)
    from otel_train.record import _hotpath
except ImportError:
    _hotpath = None  # type: ignore[assignment]

_log = logging.getLogger("otel_train")

#: Notes that make a batch: about 32 steps of a loop with two micro-batches (~12 notes a step).
#: A settle costs ~50 µs of its own whatever its size, and leaves torch's next steps to reload
#: what it displaced: at 8 steps a batch (96 notes) issue 31's loop paid 8-19 µs a step more in
#: the same rounds (docs/benchmarks/2026-11-28-batch-size.md). `MAX_WAIT_NS` bounds it on slower
#: steps.
BATCH_CALLS = 384
#: The longest a note waits for a batch to fill (perf ns): a step this long runs its notes each
#: step, so records never trail the training by more than about this, or a step.
MAX_WAIT_NS = 100_000_000
#: Batches this small gain nothing and cost the notes: after `SMALL_BATCHES` of them in a row
#: (something reads the step every step: a span of the user's, a tag), calls run at once.
SMALL_BATCH = 24
SMALL_BATCHES = 16

# A note: (kind, t0, ...); a wrapped call's is a list [kind, t0, t1, index, inner, error, ...]:
# t1 None while the call runs, `index` its place counted from the first note ever, `inner` the
# notes made during it, `error` what it raised. The kinds and fields are numbered once, in
# `_batch.c` (its module constants, imported above).
#: The facts of a call with nothing to note (`State.replay`): grad enabled, training, batch size,
#: step()'s wrapper frame, its callers, zero_grad's place.
_PLAIN = (True, True, None, None, None, 0)


class Batch:
    """The notes waiting, and what the entry points know live."""

    __slots__ = ("notes", "taken", "on", "thread", "replaying", "dropped", "failed", "real", "opt_depth",
                 "opt_note", "opt_frame", "fwd_seen", "fetching", "small", "waited")

    def __init__(self) -> None:
        self.notes: list[Any] = []
        self.taken = 0  # notes run (or dropped) so far: `INDEX` counts from the first
        self.on = False  # installed, with the C hot path, where torch has no accelerator
        self.thread: int | None = None  # the main thread's id
        self.replaying = False
        self.dropped = 0  # notes a failed replay dropped
        self.failed = False
        self.real: dict[str, Any] = {}  # the entry points as bound: name -> function
        self.opt_depth = 0  # optimizer step() calls running (live)
        self.opt_note: list[Any] | None = None  # the outermost one's note, while it runs
        self.opt_frame: Any = None  # ... and torch's step wrapper frame
        self.fwd_seen = False  # a forward since the last backward (live)
        self.fetching = 0  # noted fetches running (live: the state's `fetching` lags)
        self.small = 0  # batches of fewer than `SMALL_BATCH` notes in a row, run for a read
        self.waited = False  # the settle under way is `MAX_WAIT_NS`'s


b = Batch()
_ENTRY_POINTS = ((forward, "forward_begin"), (forward, "forward_end"), (backward, "backward_run"), (data, "fetch"),
                 (optimizer, "optimizer_begin"), (optimizer, "optimizer_end"), (optimizer, "zero_grad_run"),
                 (optimizer, "clip_run"))


def _can() -> bool:
    """A call may be noted rather than run: batching on, this the main thread, recording, no
    roots being discovered, nothing compiled."""
    return (b.on and not b.failed and get_ident() == b.thread and recorder._rec is not None
            and not roots.discovering and not _c.seen)


def _note(note: Any) -> None:
    notes = b.notes
    if notes and len(notes) >= BATCH_CALLS:
        settle()
    elif notes and note[1] - notes[0][1] > MAX_WAIT_NS:
        b.waited = True  # slow steps: a small batch here says nothing of reads
        settle()
    if not notes and _hotpath is not None:
        _hotpath.set_settle(settle)
    if type(note) is list and note[0] != OPT_BEGIN:
        note[INDEX] = b.taken + len(notes)
    notes.append(note)


def _wrapped(kind: int, t0: int, *rest: Any) -> list[Any]:
    note = [kind, t0, None, 0, 0, None, *rest]
    _note(note)
    return note


def _done(note: list[Any], t1: int, error: BaseException | None) -> None:
    note[INNER] = b.taken + len(b.notes) - note[INDEX] - 1
    note[ERROR] = error
    note[T1] = t1


def _inside(note: list[Any], r: Any, original: Any, args: Any, kwargs: Any) -> Any:
    """The user's function called inside its wrapped call's `note`, which its end completes:
    the end's time, and what it raised."""
    try:
        out = original(*args, **(kwargs or {}))
    except BaseException as err:
        _done(note, r.now(), err)
        raise
    _done(note, r.now(), None)
    return out


# --- the noting entry points, from their start: what `_batch.c`'s call for what they do not take -

def forward_begin(module: Any) -> None:
    b.fwd_seen = True
    if _can() and not b.opt_depth and torch.is_grad_enabled() and module.training:
        _note((FWD_BEGIN, recorder._rec.now(), module))  # type: ignore[union-attr]
        return None
    settle()
    return b.real["forward_begin"](module)


def forward_end(module: Any) -> None:
    if _can():
        _note((FWD_END, recorder._rec.now(), module))  # type: ignore[union-attr]
        return None
    settle()
    return b.real["forward_end"](module)


def backward_run(original: Any, args: Any, kwargs: Any) -> Any:
    seen, b.fwd_seen = b.fwd_seen, False
    if not _can() or b.opt_depth or not seen:  # no forward seen: the body looks for the model now
        settle()
        return b.real["backward_run"](original, args, kwargs)
    r = recorder._rec
    return _inside(_wrapped(BACKWARD, r.now()), r, original, args, kwargs)  # type: ignore[union-attr]


def fetch(original: Any, iterator: Any) -> Any:
    if not _can():
        settle()
        return b.real["fetch"](original, iterator)
    r = recorder._rec
    note = _wrapped(FETCH, r.now(), iterator, None)  # type: ignore[union-attr]
    b.fetching += 1
    try:
        batch = original(iterator)
    except BaseException as err:
        b.fetching -= 1
        _done(note, r.now(), err)  # type: ignore[union-attr]
        raise
    b.fetching -= 1
    t1 = r.now()  # type: ignore[union-attr]
    note[7] = size_of(batch)
    _done(note, t1, None)
    return batch


def optimizer_begin(opt: Any, args: Any, kwargs: Any) -> None:
    frame = sys._getframe(2)  # torch's step wrapper, as the body finds it
    if b.opt_depth and not optimizer.on_stack(b.opt_frame, frame):
        b.opt_depth = 0  # the last step() raised
        b.opt_note = b.opt_frame = None
    b.opt_depth += 1
    caller = frame.f_back
    callers = sites.callers(caller, caller.f_back) if caller is not None else None
    if b.opt_depth == 1:
        b.opt_frame = frame
        closure = args[1] if len(args) > 1 else kwargs.get("closure")
        if closure is None and _can() and not _s.site_probe:
            note = [OPT_BEGIN, recorder._rec.now(), opt, args, kwargs, frame, callers]  # type: ignore[union-attr]
            _note(note)
            b.opt_note = note
            return None
    settle()
    # At once, but with the frames as the body would find them called from the hook (this
    # function's frame is one more on the stack).
    _facts((True, True, None, frame, callers, 0))
    try:
        return b.real["optimizer_begin"](opt, args, kwargs)
    finally:
        _facts(None)


def optimizer_end(opt: Any, args: Any, kwargs: Any) -> None:
    if b.opt_depth:
        b.opt_depth -= 1
        if not b.opt_depth:
            if b.opt_note is not None:
                b.opt_note[5] = None  # step() is over: its frame would keep the caller's alive
            b.opt_note = b.opt_frame = None
    if _can():
        _note((OPT_END, recorder._rec.now(), opt, args, kwargs))  # type: ignore[union-attr]
        return None
    settle()
    return b.real["optimizer_end"](opt, args, kwargs)


def zero_grad_run(r: Any, s: Any, original: Any, args: Any, kwargs: Any) -> Any:
    if _can() and not b.opt_depth:
        place = sites.decided_place()
        if place is not None:
            return _inside(_wrapped(ZERO_GRAD, r.now(), r, place), r, original, args, kwargs)
    settle()
    return b.real["zero_grad_run"](r, s, original, args, kwargs)


def fetching() -> bool:
    """Whether a batch fetch is running: the state's `fetching`, or a noted fetch's (for the
    checks that run at once)."""
    return bool(_s.fetching or b.fetching)


def clip_run(r: Any, s: Any, original: Any, args: Any, kwargs: Any) -> Any:
    if _can() and not b.opt_depth:
        return _inside(_wrapped(CLIP, r.now(), r), r, original, args, kwargs)
    settle()
    return b.real["clip_run"](r, s, original, args, kwargs)


def gc_noted(phase: str, info: dict[str, Any]) -> bool:
    """For the GC callback: True where the pause is noted (calls wait) or is the replay's own."""
    if b.replaying:
        return True
    if not b.notes or get_ident() != b.thread:
        return False
    r = recorder._rec
    if r is None:
        return False
    b.notes.append((GC, r.now(), phase, info.get("generation", 2)))
    return True


# --- settling ----------------------------------------------------------------------------------

def settle() -> None:
    """Run the notes waiting through detection's bodies, in order (the module's docstring)."""
    if not b.notes or b.replaying or get_ident() != b.thread:
        return
    if _hotpath is not None:
        _hotpath.set_settle(None)
    notes = b.notes[:]
    b.notes.clear()
    r = recorder._rec
    done = len(notes)
    if r is not None and not b.failed:
        own = r.now
        b.replaying = True
        try:
            done = _batch.replay(notes, 0, len(notes), r)
        except Exception:  # noqa: BLE001 - never into training: said once, dropped, counted
            b.failed = True
            b.dropped += len(notes)
            _log.warning("otel_train: replaying detection's calls failed; %d dropped, and calls run at once "
                         "from now on", len(notes), exc_info=True)
        finally:
            r.now = own
            b.replaying = False
            _facts(None)
    rest = notes[done:]
    b.taken += done
    b.small = b.small + 1 if done < SMALL_BATCH and not b.waited else 0
    b.waited = False
    if b.small >= SMALL_BATCHES and b.on:
        b.on = False
        _log.debug("otel_train: detection's calls run at once from now on: the step is read every few calls")
    if rest:
        b.notes[:0] = rest
    if b.notes and _hotpath is not None:
        _hotpath.set_settle(settle)


def _facts(facts: tuple[Any, ...] | None) -> None:
    """What the bodies read instead of the live values (`State.replay`, `_loops.set_replay`)."""
    if _s.replay is not facts:
        _s.replay = facts
        _loops.set_replay(facts)


# --- install -----------------------------------------------------------------------------------

#: The Python entry points `_batch.c`'s call for the rest, in its order (`P_*` there).
_IN_C = ("forward_begin", "forward_end", "backward_run", "fetch", "optimizer_end", "zero_grad_run", "clip_run",
         "optimizer_begin")


def install() -> None:
    """Put the noting entry points in, where batching can run (the module's docstring)."""
    if _hotpath is None or data._accelerator_present():
        return
    for module, name in _ENTRY_POINTS:
        b.real[name] = getattr(module, name)
    _batch.bind(b, globals(), vars(recorder), roots, _c, _hotpath.set_settle, settle, torch.is_grad_enabled,
                sites.decided_place, size_of, tuple(globals()[name] for name in _IN_C))
    _batch.bind_replay(_s, data.busy, backward.busy, optimizer.aux_busy, gc_pauses.pause, _loops.set_replay, _PLAIN)
    for module, name in _ENTRY_POINTS:  # the hooks call the noting entry points (`_batch.c`)
        setattr(module, name, getattr(_batch, name))
    gc_pauses.noted = gc_noted
    b.thread = main_thread().ident
    b.on = True


def uninstall() -> None:
    """Run what waits, then put the entry points back as they were bound."""
    settle()
    if b.real:
        for module, name in _ENTRY_POINTS:
            setattr(module, name, b.real[name])
    gc_pauses.noted = None
    _batch.unbind()
    b.__init__()  # type: ignore[misc]
