"""Research switches for `benchmarks/` and the tests that compare detection's forms (not
installed): batched detection's calls run another way inside a block.

- `calls_at_once()`, `notes_dropped()`, `entry_points_stubbed()`
  (`python -m benchmarks.auto_cost --per-call`, `--parts`).
- `root_hooks()`: the roots' forwards timed by hooks in their tables inside a block, not from
  their slots (`python -m benchmarks.auto_cost --root-hooks`).

The product benchmarks' own switches (`paused_detection`, `held`, `spans_disabled`,
`SyncCounter`) are in `otel_train.bench.switches`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any


@contextlib.contextmanager
def calls_at_once() -> Iterator[None]:
    """Detection's calls each run at their call inside the block, none batched
    (`otel_train.detect.batch`): what automatic mode did before batching, for `python -m benchmarks.auto_cost
    --per-call` and for tests that compare the two. Calls waiting run first."""
    from otel_train.detect import batch

    batch.settle()
    was = batch.b.on
    batch.b.on = False
    try:
        yield
    finally:
        batch.b.on = was


@contextlib.contextmanager
def root_hooks() -> Iterator[None]:
    """Inside the block, each root timed from its forward slot carries our forward hooks instead,
    as once torch.compile may trace (`roots.slots_to_hooks`); its slot is back after. For `bench
    auto-cost --root-hooks`, which times the two forms in the same rounds. Calls waiting run first."""
    from otel_train.detect import batch, torch_hooks
    from otel_train.detect.roots import roots

    batch.settle()
    slotted = [module for module, handles in list(roots.hooked.items())
               if isinstance(handles[0], torch_hooks.SlotEntry) and handles[0].installed()]
    roots.slots_to_hooks()
    try:
        yield
    finally:
        batch.settle()
        for module in slotted:
            for handle in roots.hooked.get(module, ()):
                handle.remove()
            roots.hook(module)


@contextlib.contextmanager
def notes_dropped() -> Iterator[None]:
    """Batched detection's calls noted inside the block as usual, but never replayed: each batch
    is dropped where it would run, so nothing is recorded and detection's state stands still.
    For `python -m benchmarks.auto_cost --parts`, which times the notes apart from their replay; a block of
    whole steps leaves the state as it found it. Calls waiting run first."""
    from otel_train.detect import batch

    batch.settle()
    was = batch._batch
    batch._batch = _DroppingReplay  # type: ignore[assignment]
    try:
        yield
    finally:
        batch.settle()
        batch._batch = was


class _DroppingReplay:
    @staticmethod
    def replay(notes: Any, i: int, end: int, r: Any) -> int:
        return end  # every note taken, none run


@contextlib.contextmanager
def entry_points_stubbed() -> Iterator[None]:
    """Automatic mode's hooks and patched functions as installed, but the entry points they call
    (`forward_begin`, `backward_run`, `fetch`, ...) replaced by stubs that only run the user's
    function: the hooks' own cost, with nothing noted or recorded. For `python -m benchmarks.auto_cost
    --parts`. Calls waiting run first."""
    import operator

    from otel_train.detect import backward, batch, data, forward, optimizer

    def run(original: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        return original(*args, **(kwargs or {}))

    def run_aux(r: Any, s: Any, original: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        return original(*args, **(kwargs or {}))

    def nothing(optimizer: Any, args: Any, kwargs: Any) -> None:
        return None

    none_for: dict[Any, Any] = {}  # `.get(module)`: None, in C
    stubs = {(forward, "forward_begin"): none_for.get, (forward, "forward_end"): none_for.get,
             (backward, "backward_run"): run, (data, "fetch"): operator.call,
             (optimizer, "optimizer_begin"): nothing, (optimizer, "optimizer_end"): nothing,
             (optimizer, "zero_grad_run"): run_aux, (optimizer, "clip_run"): run_aux}
    batch.settle()
    saved = {key: getattr(*key) for key in stubs}
    for (module, name), stub in stubs.items():
        setattr(module, name, stub)
    try:
        yield
    finally:
        for (module, name), entry in saved.items():
            setattr(module, name, entry)


