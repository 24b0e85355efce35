"""Which modules carry the forward hooks: every module while discovering, then the roots only.

Any global module hook sends *every* module call in the process down torch's slow path
(measured here: +1.8 ms on an 18 ms step of a 2-layer transformer with no-op hooks). So the
global hooks stay only for the first `DISCOVERY_STEPS` closed steps, time enough to see every
model a step calls (a GAN's two, a teacher), and again for that long every `REDISCOVER_EVERY`
steps, for models that first appear later (not once torch.compile has compiled anything: see
`compile.compiled_anything`), and at once when a backward comes with no forward seen
(a model created after discovery: a script that trains a fresh model per loop), at most every
`UNSEEN_GAP` steps. In between, only the roots (the modules called outermost) carry
hooks (or a forward slot, which keeps even the root on torch's fast path: `torch_hooks`); their
submodules keep torch's fast path. While both are installed a root's call reaches the hooks
twice, which the forward family's depth count absorbs.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.nn.modules.loss import _Loss

from otel_train.detect import torch_hooks
from otel_train.detect.compile import compiled_anything, when_seen


#: The forward family's module namespace (`forward`, which imports this module, hands it over
#: as it is imported: `use_forward_hooks`). Its functions are looked up there at each use, so the
#: C bodies it binds after its definitions are the ones called.
_forward: dict[str, Any] = {}


def use_forward_hooks(namespace: dict[str, Any]) -> None:
    """The hooks the roots carry: `forward_pre_hook`/`forward_hook`, and for a slot
    `forward_begin`/`forward_end`, read from `namespace` (the forward module's `globals()`)."""
    global _forward
    _forward = namespace


def _hooks() -> tuple[Any, Any]:
    return _forward["forward_pre_hook"], _forward["forward_hook"]


def _slot(module: torch.nn.Module) -> torch_hooks.SlotEntry | None:
    return torch_hooks.slot(module, _forward, "forward_begin", "forward_end")


def _end_once(module: torch.nn.Module, frame: Any) -> torch_hooks.Entry:
    return torch_hooks.end_once(module, frame, _forward, "forward_end")


class Roots:
    """The forward hooks' handles, global or per root, and what discovery has seen."""

    # Slots: the forward hooks read `discovering` every call, where it lies (`_loops.c`).
    __slots__ = ("seen", "hooked", "global_handles", "discovering", "closed", "unseen_at", "unseen_gap",
                 "for_unseen")

    DISCOVERY_STEPS = 2
    REDISCOVER_EVERY = 500
    UNSEEN_GAP = 8

    def __init__(self) -> None:
        self.seen: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self.hooked: weakref.WeakKeyDictionary[torch.nn.Module, tuple[Any, Any]] = weakref.WeakKeyDictionary()
        self.global_handles: list[Any] = []
        self.discovering = False
        self.closed = 0
        self.unseen_at = -self.UNSEEN_GAP
        self.unseen_gap = self.UNSEEN_GAP  # doubles each time such a rediscovery finds no new module
        self.for_unseen = False  # the discovery under way was started by `unseen`

    def start(self) -> None:
        """Begin discovering: global hooks until `DISCOVERY_STEPS` more steps have closed."""
        if self.discovering:
            return
        self.add_global()
        self.discovering = True
        self.closed = 0

    def add_global(self) -> None:
        self.global_handles = list(torch_hooks.global_forward(*_hooks()))

    def hook(self, module: torch.nn.Module) -> None:
        # Its forward slot, or hooks in its own tables where it cannot have one; hidden from
        # pickles and copies either way (`torch_hooks`).
        slot = _slot(module)
        self.hooked[module] = (slot,) if slot is not None else torch_hooks.module_forward(module, *_hooks())

    def slots_to_hooks(self) -> None:
        """torch.compile may trace from now on (`compile.when_seen`), and Dynamo cannot trace a
        slot: each root timed from its slot carries the hooks instead."""
        for module, handles in list(self.hooked.items()):
            if isinstance(handles[0], torch_hooks.SlotEntry) and handles[0].installed():
                handles[0].remove()
                self.hooked[module] = (*torch_hooks.module_forward(module, *_hooks()), *handles[1:])

    def detach(self) -> None:
        """Remove every forward hook and slot, remembering the roots found and the discovery under way."""
        for handle in self.global_handles:
            handle.remove()
        for handles in list(self.hooked.values()):
            for handle in handles:
                handle.remove()

    def step_closed(self, n: int | None) -> None:
        if self.discovering:
            self.closed += 1
            if self.closed >= self.DISCOVERY_STEPS and not compiled_anything():
                self._settle()
        elif n is not None and n > 0 and n % self.REDISCOVER_EVERY == 0 and not compiled_anything():
            self.start()

    def adopt(self, module: torch.nn.Module) -> None:
        """A module made outside any forward (`torch.load`): hooked as a root unless discovery's
        global hooks see it anyway."""
        if not self.discovering and module not in self.hooked and not isinstance(module, _Loss):
            self.hook(module)

    def unseen(self, n: int | None) -> None:
        """A backward with no forward seen: a model no hook is on yet."""
        if n is not None and n - self.unseen_at >= self.unseen_gap and not compiled_anything():
            self.unseen_at = n
            self.start()
            self.for_unseen = True

    def _settle(self) -> None:
        # Safe inside a hook: torch snapshots the hook dicts before it calls any of them. A step
        # closes where the next begins, often a root's forward pre-hook: that call began under
        # the global hooks and must end through a hook too, not the slot set meanwhile.
        found = 0
        running = torch_hooks.calls_running()
        for module in list(self.seen):
            # A loss module only ever tells its hooks "not another forward": left unhooked,
            # its calls skip torch's hook dispatch (and ours) with the same outcome.
            if module not in self.hooked and not isinstance(module, _Loss):
                self.hook(module)
                found += 1
                if isinstance(self.hooked[module][0], torch_hooks.SlotEntry) and id(module) in running:
                    # removed with the rest if detached first
                    self.hooked[module] += (_end_once(module, running[id(module)]),)
        if self.for_unseen:
            # A loop whose backwards never follow a module's forward (two backwards per forward,
            # a graph built without modules) would restart discovery every few steps: back off.
            self.unseen_gap = self.UNSEEN_GAP if found else min(2 * self.unseen_gap, self.REDISCOVER_EVERY)
            self.for_unseen = False
        self.seen = weakref.WeakSet()
        for handle in self.global_handles:
            handle.remove()
        self.global_handles = []
        self.discovering = False

    def remove_all(self) -> None:
        """Remove every hook and forget every root (uninstall)."""
        self.detach()
        self.__init__()  # type: ignore[misc]


#: The one set of forward hooks.
roots = Roots()
when_seen(roots.slots_to_hooks)
