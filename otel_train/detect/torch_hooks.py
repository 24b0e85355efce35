"""torch's hook tables, used without leaving a trace in the user's objects.

Detection keeps its forward hooks on the outermost modules only (`roots`): a global module hook
sends every submodule call down torch's slow path. A hook registered on a module lives in that
module's `__dict__` (`_forward_pre_hooks`, ...), and `torch.save(model)`, `pickle.dumps(model)`
and `copy.deepcopy(model)` pickle `__dict__`: the file then names our functions, needs
otel_train to load, fails `weights_only=True`, and re-attaches our hooks when loaded. Two things
keep the user's objects byte for byte what they are without us:

- `Module.__reduce_ex__` (which pickle, `torch.save` and `copy.deepcopy` call for every module)
  returns the state with our entries taken out of its hook tables (installed with
  detection). `copy.copy` is left alone: a shallow copy shares the tables, as it does
  without us.
- `torch.jit.script(module)` compiles the module tree's hooks into the script module; ours are
  taken out of the tables for the call (`_script_wrapper`).
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

from otel_train.detect.patches import Patches

#: Our keys in torch's hook tables: at or below `FLOOR`, so never one of torch's (its counter
#: counts up from 0), and told from theirs by that alone.
FLOOR = -(1 << 40)
_keys = itertools.count(FLOOR, -1)
#: The tables a module's forward hooks live in (what `__reduce_ex__` filters).
_MODULE_TABLES = ("_forward_pre_hooks", "_forward_hooks", "_forward_hooks_always_called")

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


def global_forward(pre: Callable[..., Any], post: Callable[..., Any]) -> tuple[Entry, Entry]:
    """`register_module_forward_pre_hook(pre)` and `register_module_forward_hook(post, always_call=True)`."""
    from torch.nn.modules import module as nn_module
    return (put(nn_module._global_forward_pre_hooks, pre),
            put(nn_module._global_forward_hooks, post, nn_module._global_forward_hooks_always_called))


def global_optimizer(pre: Callable[..., Any], post: Callable[..., Any]) -> tuple[Entry, Entry]:
    """`register_optimizer_step_pre_hook(pre)` and `register_optimizer_step_post_hook(post)`."""
    from torch.optim import optimizer as optim_module
    return (put(optim_module._global_optimizer_pre_hooks, pre),
            put(optim_module._global_optimizer_post_hooks, post))


_object_reduce_ex = object.__reduce_ex__
_COPY = copy.copy.__code__


def our_key(key: Any) -> bool:
    """Whether a key of a hook table is one of ours (`put`)."""
    return type(key) is int and key <= FLOOR


def ours(table: Any) -> bool:
    """Whether a hook table holds an entry of ours."""
    return any(our_key(key) for key in table)


def _reduce_ex(self: torch.nn.Module, protocol: int) -> Any:
    """`Module.__reduce_ex__`: what `object` gives, our hook entries taken out of the state."""
    rv = _object_reduce_ex(self, protocol)
    if type(rv) is not tuple or len(rv) < 3 or sys._getframe(1).f_code is _COPY:
        return rv
    state = rv[2]
    slots = None
    if type(state) is tuple and len(state) == 2:
        state, slots = state
    if not isinstance(state, dict):
        return rv
    clean = None
    for name in _MODULE_TABLES:
        table = state.get(name)
        if table and ours(table):
            if clean is None:
                clean = dict(state)  # never the module's own __dict__, which some __getstate__ return
            clean[name] = type(table)((k, v) for k, v in table.items() if not our_key(k))
    if clean is None:
        return rv
    return (*rv[:2], clean if slots is None else (clean, slots), *rv[3:])


def _script_wrapper(wrapped: Callable[..., Any], instance: Any, args: Any, kwargs: Any) -> Any:
    """`torch.jit._recursive.create_script_module(nn_module, ...)`, behind `torch.jit.script`:
    TorchScript compiles every hook in a module tree's tables into the script module (and fails
    on ours: they are not TorchScript). Ours are out of the tables for the call and back after,
    so the scripted module is what it is without us."""
    module = args[0] if args else kwargs.get("nn_module")
    saved: list[tuple[MutableMapping[int, Any], list[tuple[Any, Any]]]] = []
    if isinstance(module, torch.nn.Module):
        for sub in module.modules():
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


def install() -> None:
    """Modules pickle, deep-copy and script without our hook entries (until `uninstall()`)."""
    import torch.jit._recursive
    patches.replace(torch.nn.Module, "__reduce_ex__", lambda original: _reduce_ex)
    patches.wrap(torch.jit._recursive, "create_script_module", _script_wrapper)


def uninstall() -> None:
    patches.undo()
