"""Switches for the product's benchmarks (`otel-train bench overhead`, `bench device`) and the
tests that check them: they change how the package runs inside a block. Not the API, and
nothing outside `otel_train.bench` calls them.

- `paused_detection()`: installed automatic detection out of the way inside a block.
- `held(worker)`: keep the worker from draining inside a block.
- `spans_disabled()`: `otel_train.span` makes the disabled no-op inside a block.
- `SyncCounter`: counts every call that makes the host wait for the device, per thread.

The research switches (batched detection's calls run another way) are in the repository's
`benchmarks/switches.py`, which is not installed. Imports nothing heavy until used.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any


def paused_detection() -> contextlib.AbstractContextManager[None]:
    """Installed detection out of the way inside the block: every hook and patch removed, then put
    back as they were (the step machine keeps its state, discovery its roots; a step left open
    spans the block). For the overhead benchmark, whose plain steps alternate one by one with
    automatic ones: reinstalling for each would restart discovery every time. Not reentrant.
    (`otel_train.detect.aside.paused`, which `outside_training` also uses.)"""
    from otel_train.detect.aside import paused
    return paused()


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
