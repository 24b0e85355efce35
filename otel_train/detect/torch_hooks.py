"""torch's hook tables and a module's forward slot, used without leaving a trace in the user's objects.

Detection keeps its forward hooks on the outermost modules only (`roots`): a global module hook
sends every submodule call down torch's slow path. A root's own hooks send its call there too
(~13 µs a step on issue 31's loop, two forwards): until torch.compile may trace, a root is timed
from its `_compiled_call_impl` instead (`slot`, `_entry.Slot`), which torch's `Module.__call__`
calls in place of `_call_impl` where one is set, and `_call_impl` keeps its fast path. Once
`compiled.seen`, roots carry the hooks, which Dynamo traces (`roots.slots_to_hooks`).

A hook registered on a module lives in that module's `__dict__` (`_forward_pre_hooks`, ...),
as does the slot, and `torch.save(model)`, `pickle.dumps(model)` and `copy.deepcopy(model)`
pickle `__dict__`: the file then names our functions, needs otel_train to load, fails
`weights_only=True`, and re-attaches our hooks when loaded. Three things keep the user's
objects byte for byte what they are without us:

- `Module.__reduce_ex__` (which pickle, `torch.save`, `copy.deepcopy` and `copy.copy` call for
  every module) returns the state with our entries taken out of its hook tables (installed
  with detection) and without our slot (which torch's own `__getstate__` drops, a class's own
  may not). `copy.copy` keeps the tables: a shallow copy shares them, as it does without us.
- `torch.jit.script(module)` compiles the module tree's hooks into the script module; ours are
  taken out of the tables, and our slots out of the modules, for the call (`_script_wrapper`).
- A `__dict__` copied by hand (`DataParallel`'s replicas) carries the slot along: the slot reads
  which module calls it from torch's `__call__` frame and times only its own root; `copy` of
  the slot itself gives None.
- Our entries take no number from torch's `RemovableHandle` counter, which numbers every hook
  the program registers and which a pickled hook table holds as its keys: ours are negative
  numbers of our own (`put`), so a hook the user registers later gets the number it would get
  without us.

Per-module hooks were kept over global ones (`register_module_forward_pre_hook` for every
module) for their cost: the global ones were measured at +1.8 ms on an 18 ms step of a 2-layer
transformer (every submodule call leaves torch's fast path). Hiding them costs nothing per step:
`__reduce_ex__` runs only when a module is pickled or copied.
"""

from __future__ import annotations

import copy
import itertools
import sys
from collections.abc import Callable, MutableMapping
from typing import Any

import torch

from otel_train import _compat
from otel_train.detect import _entry
from otel_train.detect.compile import compiled
from otel_train.detect.patches import Patches

#: Our keys in torch's hook tables: at or below `FLOOR`, so never one of torch's (its counter
#: counts up from 0), and told from theirs by that alone.
FLOOR = -(1 << 40)
_keys = itertools.count(FLOOR, -1)
#: The tables a module's forward hooks live in (what `__reduce_ex__` filters).
_MODULE_TABLES = _compat.MODULE_HOOK_TABLES

patches = Patches()


class Entry:
    """One hook of ours in one or more of torch's tables; `remove()` takes it out of all."""

    __slots__ = ("key", "tables")

    def __init__(self, key: int, tables: tuple[MutableMapping[int, Any], ...]) -> None:
        self.key = key
        self.tables = tables

    def remove(self) -> None:
        for table in self.tables:
            table.pop(self.key, None)


def put(table: MutableMapping[int, Any], fn: Callable[..., Any],
        *flags: MutableMapping[int, Any]) -> Entry:
    """`table[key] = fn` (and `flag[key] = True` in each of `flags`) under a key of our own."""
    key = next(_keys)
    table[key] = fn
    for flag in flags:
        flag[key] = True
    return Entry(key, (table, *flags))


def module_forward(module: torch.nn.Module, pre: Callable[..., Any], post: Callable[..., Any]) -> tuple[Entry, Entry]:
    """`module.register_forward_pre_hook(pre)` and `register_forward_hook(post, always_call=True)`."""
    return (put(module._forward_pre_hooks, pre),
            put(module._forward_hooks, post, module._forward_hooks_always_called))


#: torch's `Module.__call__`, which calls a module's `_compiled_call_impl` where one is set
#: (`slot`); None where this torch has no such attribute.
_MODULE_CALL = _compat.module_call_with_slot()
_SLOT = _compat.FORWARD_SLOT


class SlotEntry:
    """A forward slot of ours in a module's `__dict__`; `remove()` takes it out."""

    __slots__ = ("attrs", "made")

    def __init__(self, attrs: dict[str, Any], made: Any) -> None:
        self.attrs = attrs  # the module's `__dict__`, not the module (`roots.hooked` holds it weakly)
        self.made = made

    def installed(self) -> bool:
        return self.attrs.get(_SLOT) is self.made

    def remove(self) -> None:
        if self.installed():
            del self.attrs[_SLOT]


def is_slot(value: Any) -> bool:
    return type(value) is _entry.Slot


def slot(module: torch.nn.Module, owner: dict[str, Any], begin: str, end: str) -> SlotEntry | None:
    """`owner[begin](module)` and `owner[end](module)` around each call of the module, from its
    `_compiled_call_impl`, where torch's `__call__` looks first (`_entry.Slot`): the module keeps
    torch's fast path, with no hook in its tables. None (nothing done) where that cannot be:
    torch.compile may trace the call (`compiled.seen`: Dynamo cannot trace
    the slot), the class has a `__call__` of its own, or the module was compiled
    (`module.compile()`)."""
    if (_MODULE_CALL is None or compiled.seen or type(module).__call__ is not _MODULE_CALL
            or vars(module).get(_SLOT) is not None):
        return None
    made = _entry.Slot(module, owner, begin, end, _MODULE_CALL.__code__)
    vars(module)[_SLOT] = made
    return SlotEntry(vars(module), made)


_CALL_IMPL = _compat.call_impl_code()


def calls_running() -> dict[int, Any]:
    """The module calls running on this thread's stack: `id(module)` -> the frame of its
    outermost `_call_impl`. For `roots._settle`, not every call: it reads each frame's locals."""
    running: dict[int, Any] = {}
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is _CALL_IMPL and (module := frame.f_locals.get("self")) is not None:
            running[id(module)] = frame  # outer frames come later: the outermost stays
        frame = frame.f_back
    return running


def end_once(module: torch.nn.Module, frame: Any, owner: dict[str, Any], end: str) -> Entry:
    """The call of `module` running in `frame` (its `_call_impl`), begun under discovery's global
    hooks, ends where no slot sees it (the slot was set during the call): a post-hook of ours
    calls `owner[end](module)` when that call ends, however it ends, and takes itself out. A
    call of the same module made inside it does not fire it. Returns the hook's entry."""
    entry: Entry | None = None

    def ended(mod: torch.nn.Module, args: Any, out: Any) -> None:
        caller = sys._getframe(1)
        while caller is not None and caller.f_code is not _CALL_IMPL:
            caller = caller.f_back
        if caller is frame and entry is not None:
            entry.remove()
            owner[end](mod)
        return None

    entry = put(module._forward_hooks, ended, module._forward_hooks_always_called)
    return entry


def global_forward(pre: Callable[..., Any], post: Callable[..., Any]) -> tuple[Entry, Entry]:
    """`register_module_forward_pre_hook(pre)` and `register_module_forward_hook(post, always_call=True)`."""
    pre_hooks, hooks, always_called = _compat.global_forward_hook_tables()
    return put(pre_hooks, pre), put(hooks, post, always_called)


def global_optimizer(pre: Callable[..., Any], post: Callable[..., Any]) -> tuple[Entry, Entry]:
    """`register_optimizer_step_pre_hook(pre)` and `register_optimizer_step_post_hook(post)`."""
    pre_hooks, post_hooks = _compat.global_optimizer_hook_tables()
    return put(pre_hooks, pre), put(post_hooks, post)


_object_reduce_ex = object.__reduce_ex__
_COPY = copy.copy.__code__


def our_key(key: Any) -> bool:
    """Whether a key of a hook table is one of ours (`put`)."""
    return type(key) is int and key <= FLOOR


def ours(table: Any) -> bool:
    """Whether a hook table holds an entry of ours."""
    return any(our_key(key) for key in table)


def _reduce_ex(self: torch.nn.Module, protocol: int) -> Any:
    """`Module.__reduce_ex__`: what `object` gives, our hook entries and forward slot taken out
    of the state (torch's `Module.__getstate__` drops the slot, a class's own may not)."""
    rv = _object_reduce_ex(self, protocol)
    if type(rv) is not tuple or len(rv) < 3:
        return rv
    state = rv[2]
    slots = None
    if type(state) is tuple and len(state) == 2:
        state, slots = state
    if not isinstance(state, dict):
        return rv
    clean = None
    if is_slot(state.get(_SLOT)):
        clean = dict(state)  # never the module's own __dict__, which some __getstate__ return
        del clean[_SLOT]
    for name in _MODULE_TABLES if sys._getframe(1).f_code is not _COPY else ():
        table = state.get(name)
        if table and ours(table):
            if clean is None:
                clean = dict(state)
            clean[name] = type(table)((k, v) for k, v in table.items() if not our_key(k))
    if clean is None:
        return rv
    return (*rv[:2], clean if slots is None else (clean, slots), *rv[3:])


def _script_wrapper(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
    """`torch.jit._recursive.create_script_module(nn_module, ...)`, behind `torch.jit.script`:
    TorchScript compiles every hook in a module tree's tables into the script module (and fails
    on ours: they are not TorchScript). Ours, and our slots, are out of the modules for the call
    and back after, so the scripted module is what it is without us."""
    module = args[0] if args else kwargs.get("nn_module")
    saved: list[tuple[MutableMapping[int, Any], list[tuple[Any, Any]]]] = []
    slots: list[tuple[dict[str, Any], Any]] = []
    if isinstance(module, torch.nn.Module):
        for sub in module.modules():
            if is_slot(vars(sub).get(_SLOT)):
                slots.append((vars(sub), vars(sub).pop(_SLOT)))
            for name in _MODULE_TABLES:
                table = getattr(sub, name, None)
                if table and ours(table):
                    saved.append((table, list(table.items())))
                    for key in [k for k in table if our_key(k)]:
                        del table[key]
    try:
        return wrapped(*args, **kwargs)
    finally:
        for table, items in saved:  # as they were, in their order
            table.clear()
            table.update(items)
        for attrs, made in slots:
            attrs[_SLOT] = made


def install() -> None:
    """Modules pickle, deep-copy and script without our hook entries (until `uninstall()`)."""
    import torch.jit._recursive
    patches.replace(torch.nn.Module, "__reduce_ex__", lambda original: _reduce_ex)
    patches.wrap(torch.jit._recursive, "create_script_module", _script_wrapper)


def uninstall() -> None:
    patches.undo()
