"""Switches for benchmarks and tests only (not the API): they change how the package runs.

- `paused_detection()`: installed automatic detection out of the way inside a block.
- `held(worker)`: keep the worker from draining inside a block.
- `spans_disabled()`: `otel_train.span` makes the disabled no-op inside a block.
- `calls_at_once()`, `notes_in_python()`, `notes_dropped()`, `entry_points_stubbed()`: batched
  detection's calls run another way inside a block (`bench auto-cost --per-call`, `--parts`).
- `root_hooks()`: the roots' forwards timed by hooks in their tables inside a block, not from
  their slots (`bench auto-cost --root-hooks`).
- `SyncCounter`: counts every call that makes the host wait for the device, per thread.
- `ENV_EXPORTER_START_DELAY`: the exporter process waits this many seconds before it is ready,
  as on a node too busy to start it (`exporter_start_delay`, called by the exporter process).

`otel-train bench` uses them to time parts of the pipeline alone and to count synchronisations;
the test suite uses them to check exactly that. Nothing in the package itself calls them.
Imports nothing heavy until used.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any


#: Seconds the exporter process sleeps after reading its setup, before it builds its pipeline and
#: says it is ready: what a loaded node does to it, made deterministic for a test.
ENV_EXPORTER_START_DELAY = "OTEL_TRAIN_TESTING_EXPORTER_START_DELAY_S"


def exporter_start_delay() -> None:
    """Sleep as `ENV_EXPORTER_START_DELAY` says (the exporter process calls this; unset: at once)."""
    raw = os.environ.get(ENV_EXPORTER_START_DELAY)
    if raw:
        time.sleep(float(raw))


def paused_detection() -> contextlib.AbstractContextManager[None]:
    """Installed detection out of the way inside the block: every hook and patch removed, then put
    back as they were (the step machine keeps its state, discovery its roots; a step left open
    spans the block). For the overhead benchmark, whose plain steps alternate one by one with
    automatic ones: reinstalling for each would restart discovery every time. Not reentrant.
    (`otel_train.detect.aside.paused`, which `outside_training` also uses.)"""
    from otel_train.detect.aside import paused
    return paused()


@contextlib.contextmanager
def calls_at_once() -> Iterator[None]:
    """Detection's calls each run at their call inside the block, none batched
    (`otel_train.detect.batch`): what automatic mode did before batching, for `bench auto-cost
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
def notes_in_python() -> Iterator[None]:
    """Batched detection's notes made and replayed by its Python functions inside the block
    (`otel_train.detect.batch`), not by `_batch.c`: for `bench auto-cost --per-call`, which
    times both. Calls waiting run first, and at the end."""
    from otel_train.detect import batch

    batch.settle()
    was = batch.b.c
    batch.point(False)
    try:
        yield
    finally:
        batch.settle()
        batch.point(was)


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
    For `bench auto-cost --parts`, which times the notes apart from their replay; a block of
    whole steps leaves the state as it found it. Calls waiting run first."""
    from otel_train.detect import batch

    batch.settle()
    was_c, was_python = batch._batch, batch._replay
    batch._batch = _DroppingReplay  # type: ignore[assignment]
    batch._replay = _DroppingReplay.replay  # type: ignore[assignment]
    try:
        yield
    finally:
        batch.settle()
        batch._batch, batch._replay = was_c, was_python


class _DroppingReplay:
    @staticmethod
    def replay(notes: Any, i: int, end: int, r: Any) -> int:
        return end  # every note taken, none run


@contextlib.contextmanager
def entry_points_stubbed() -> Iterator[None]:
    """Automatic mode's hooks and patched functions as installed, but the entry points they call
    (`forward_begin`, `backward_run`, `fetch`, ...) replaced by stubs that only run the user's
    function: the hooks' own cost, with nothing noted or recorded. For `bench auto-cost
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


@contextlib.contextmanager
def spans_disabled() -> Iterator[None]:
    """`otel_train.span(...)` makes the disabled no-op inside the block, as it does under
    `OTEL_SDK_DISABLED`, with nothing shut down (the benchmark's `region_ns_disabled`)."""
    from otel_train.record import span

    was = span.disabled()
    span.set_disabled(True)
    try:
        yield
    finally:
        span.set_disabled(was)


def held(worker: Any) -> Any:
    """A context manager that keeps `worker` (`otel_train.export.worker.Worker`) from draining
    while the block runs: records wait in the buffer. `otel-train bench overhead` times the hot
    path alone with it. (The worker's drain lock: a drain waits for the block to end.)"""
    return worker.busy


class SyncCounter:
    """Counts calls to the functions that make the host wait for the device, per thread."""

    def __init__(self) -> None:
        self.calls: Counter[tuple[str, str]] = Counter()  # (thread name, function) -> calls
        self.active = False

    def total(self, thread: str | None = None) -> int:
        return sum(n for (name, _), n in self.calls.items() if thread is None or name == thread)

    @contextlib.contextmanager
    def installed(self) -> Iterator[SyncCounter]:
        """Wrap the synchronising functions while the block runs (counting only while `active`)."""
        import torch

        targets: list[tuple[Any, str]] = [(torch.Tensor, "item")]
        if torch.cuda.is_available():
            targets += [(torch.cuda, "synchronize"), (torch.cuda.Event, "synchronize"),
                        (torch.cuda.Stream, "synchronize")]
        saved = []
        for owner, attr in targets:
            original = getattr(owner, attr)
            had_own = attr in vars(owner)
            setattr(owner, attr, self._wrap(original, f"{getattr(owner, '__name__', owner)}.{attr}"))
            saved.append((owner, attr, original, had_own))
        try:
            yield self
        finally:
            for owner, attr, original, had_own in reversed(saved):
                if had_own:
                    setattr(owner, attr, original)
                else:
                    delattr(owner, attr)

    def _wrap(self, fn: Callable[..., Any], label: str) -> Callable[..., Any]:
        counter = self
        on_tensor = label.endswith(".item")

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            # `.item()` of a CPU tensor (AdamW reads its CPU step count) does not wait for a device.
            if counter.active and not (on_tensor and args and args[0].device.type == "cpu"):
                counter.calls[(threading.current_thread().name, label)] += 1
            return fn(*args, **kwargs)

        wrapper.__name__ = getattr(fn, "__name__", "wrapper")
        return wrapper
