"""Switches for benchmarks and tests only (not the API): they change how the package runs.

- `paused_detection()`: installed automatic detection out of the way inside a block.
- `held(worker)`: keep the worker from draining inside a block.
- `spans_disabled()`: `otel_train.span` makes the disabled no-op inside a block.
- `SyncCounter`: counts every call that makes the host wait for the device, per thread.

`otel-train bench` uses them to time parts of the pipeline alone and to count synchronisations;
the test suite uses them to check exactly that. Nothing in the package itself calls them.
Imports nothing heavy until used.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any


@contextlib.contextmanager
def paused_detection() -> Iterator[None]:
    """Installed detection out of the way inside the block: every hook and patch removed, then put
    back as they were (the step machine keeps its state, discovery its roots; a step left open
    spans the block). For the overhead benchmark, whose plain steps alternate one by one with
    automatic ones: reinstalling for each would restart discovery every time. Not reentrant."""
    from otel_train.detect import gc_pauses, optimizer, state
    from otel_train.detect.patches import Patches, unpatch
    from otel_train.detect.roots import roots

    if not state.installed:
        yield
        return
    roots.detach()
    optimizer.remove_hooks()
    gc.callbacks.remove(gc_pauses.gc_callback)
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
