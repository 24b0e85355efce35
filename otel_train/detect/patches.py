"""The patch registry: what detection replaces is replaced through here, and always restored.

torch has hooks for modules and optimizers, and detection prefers them; for what it has none
(`torch.autograd.backward`, `DataLoader` iteration, `torch.save`, collectives) a function is
replaced. Each hook family keeps its own `Patches`, undone by its `uninstall()`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import wrapt

from otel_train.detect._entry import Hidden  # what a wrapt wrapper calls: our frames out of a traceback

_log = logging.getLogger("otel_train")

#: One patch: (owner, name, original, whether the owner had its own attribute, the replacement).
Patch = tuple[Any, str, Any, bool, Any]


class Patches:
    """The replacements one hook family made, restored newest first by `undo()`."""

    #: Every family's registry (`otel_train.detect.aside.paused` lifts them all).
    everywhere: list[Patches] = []

    def __init__(self) -> None:
        self.made: list[Patch] = []
        Patches.everywhere.append(self)

    def wrap(self, owner: Any, name: str, wrapper: Callable[..., Any]) -> None:
        """Replace `owner.name` by a wrapt wrapper around it, whose call (C) calls `wrapper`
        through `Hidden`: an error raised inside the original shows no frame of
        ours, as without us. For what runs every step, `replace(owner, name, lambda original:
        entry.lean(original, wrapper, ...))` is cheaper (`entry.lean`)."""
        hidden = Hidden(wrapper)
        self.replace(owner, name, lambda original: wrapt.FunctionWrapper(original, hidden))

    def replace(self, owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        """Replace `owner.name` by `make(original)`."""
        own = name in vars(owner)
        original = vars(owner)[name] if own else getattr(owner, name)
        patched = make(original)
        setattr(owner, name, patched)
        self.made.append((owner, name, original, own, patched))

    def has(self, owner: Any, name: str) -> bool:
        return any(p[0] is owner and p[1] == name for p in self.made)

    def undo(self) -> None:
        while self.made:
            unpatch(*self.made.pop())


def unpatch(owner: Any, name: str, original: Any, own: bool, patched: Any) -> None:
    """Put `owner.name` back, unless someone replaced our replacement meanwhile (theirs stays)."""
    current = vars(owner).get(name)
    if current is not patched:
        _log.warning("otel_train: %s.%s was patched again by someone else; it keeps their wrapper.",
                     getattr(owner, "__name__", owner), name)
        return
    if own:
        setattr(owner, name, original)
    else:
        delattr(owner, name)
