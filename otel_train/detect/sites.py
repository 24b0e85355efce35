"""Where a `zero_grad()` after the update is written: the end of this iteration, or the top of the next.

In a loop with no DataLoader, `opt.step(); opt.zero_grad()` at the end of an iteration and
`opt.zero_grad()` at the top of the next one make the same sequence of calls. The code tells
them apart: when `zero_grad()` is called from the same function as the update (looking through
up to `_WRAPPERS` frames outside torch on each side, for wrappers such as accelerate's
`AcceleratedOptimizer`), an earlier instruction offset in it means the loop came round (the top
of the next iteration: it belongs to the next step), a later one that it follows the update
(the end of this one: it joins the update's `train.optimizer`). Called from elsewhere (a
framework's hook), it is neither: a `train.zero_grad` of its own in the step.

A zero_grad at a call site not yet decided while not probing (a second loop) is placed from
the two live frames that called the last update (`State.last_callers`: their ids, codes and
offsets, not the frames), when it is called from one of them. The update's full call site is read while probing only (`State.site_probe`): once a zero_grad's call
site is decided, the decision is remembered by that site and the update's hook stops looking.
"""

from __future__ import annotations

from types import CodeType, FrameType
from typing import Any

from otel_train.detect import _loops
from otel_train.detect.state import State

TOP, END, ELSEWHERE = 1, 2, 3
#: Decided call sites: (id of the code, instruction offset) -> (the code, TOP / END / ELSEWHERE).
#: Keyed by id, not by the code object (hashing a code object hashes its whole body, every
#: step); the value holds the code, so its id stays its own.
_decided: dict[tuple[int, int], tuple[CodeType, int]] = {}
_OURS = ("torch.", "otel_train.")
_MAX_DEPTH = 16  # frames looked through, torch's and ours included
_WRAPPERS = 3  # frames outside torch looked at on each side


_loops.bind(_OURS, _MAX_DEPTH, _decided, ELSEWHERE)
#: `user_frames(limit)`: the innermost `limit` frames of the calling stack outside torch and
#: otel_train (its caller's frame first, looking through `_MAX_DEPTH`), called straight from the
#: function whose stack it walks. In C: it runs at every update and zero_grad.
user_frames = _loops.user_frames


def remember_update(s: State) -> None:
    """In the optimizer's pre-hook: note where step() was called from."""
    s.step_site = [(frame.f_code, frame.f_lasti) for frame in user_frames(_WRAPPERS)]


def zero_grad_place(s: State) -> int:
    """TOP, END or ELSEWHERE for the zero_grad being called (from our patched function)."""
    if s.replay is not None:  # replayed (`batch`): the place found for it when it was called
        return s.replay[5]
    site_of = _call_site()  # a call site decided already (every step after the first): no further
    if site_of is None:
        return ELSEWHERE
    code, key = site_of
    found = _decided.get(key)
    if found is not None:
        return found[1]
    frames = user_frames(_WRAPPERS)
    site = s.step_site
    if site is None:  # not probing: the live frames that called the last update, else the next one
        place = _by_callers(frames, s.last_callers)
        if place is not None:
            _decided[key] = (code, place)
            return place
        s.site_probe = True
        return ELSEWHERE
    place = ELSEWHERE
    for frame in frames:
        lasti = next((lasti for code, lasti in site if code is frame.f_code), None)
        if lasti is not None:
            place = TOP if frame.f_lasti < lasti else END
            break
    _decided[key] = (code, place)
    s.site_probe = False
    s.step_site = None
    return place


#: `decided_place()`: the place decided for the zero_grad being called (from our patched
#: function), None where its call site is not decided yet: `zero_grad_place`'s first look,
#: without probing. What a noted zero_grad asks (`batch`); in C.
decided_place = _loops.decided_place


def _call_site() -> tuple[CodeType, tuple[int, int]] | None:
    """The code of the user's frame calling the zero_grad, and its key in `_decided`; None when
    no frame of the user's called it."""
    first = user_frames(1)
    if not first:
        return None
    code = first[0].f_code
    return code, (id(code), first[0].f_lasti)


def callers(caller: FrameType, outer: FrameType | None) -> tuple[Any, ...]:
    """What the optimizer's pre-hook keeps of the two frames that called the update
    (`State.last_callers`): each one's id, code and instruction offset, never the frame itself,
    which would keep a per-step function's locals (its batch, the model's output) alive until
    the next update. `_loops.optimizer_begin` builds the same tuple."""
    return (id(caller), caller.f_code, caller.f_lasti, id(outer) if outer is not None else None,
            outer.f_code if outer is not None else None, outer.f_lasti if outer is not None else -1)


def _by_callers(frames: list[FrameType], last: tuple | None) -> int | None:
    """From the two frames that called the last update (`callers`): a zero_grad called from one
    of them, still running, at an offset before (or at: the same call made again, the loop came
    round) the update's is at the top of the next iteration, after it at the end of this one.
    A frame is told by its id and code: a live frame keeps its id; one that ended may leave its
    id to a new frame of the same code, whose offsets the same comparison places as probing would."""
    if last is None:
        return None
    for frame in frames:
        if id(frame) == last[0] and frame.f_code is last[1]:
            return TOP if frame.f_lasti <= last[2] else END
        if id(frame) == last[3] and frame.f_code is last[4]:
            return TOP if frame.f_lasti <= last[5] else END
    return None


def forget() -> None:
    _decided.clear()
