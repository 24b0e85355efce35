"""A fake asynchronous accelerator for device-timing tests: one stream, scripted, no sleeping.

The host clock is a `FakeClock`. `launch(ns)` enqueues work the way a kernel launch does:
it returns at once and the stream runs the work after whatever is already queued. An event
recorded on the stream completes when the stream reaches it. Nothing moves by itself: the
test advances the clock, or the simulated training code synchronises (`wait_until`, `drain`:
what `loss.item()` or a device-to-host copy does in a real loop).

It also keeps a caching allocator's counters (`alloc`, `free`, `cache`), read the way
`torch.cuda.memory_stats(index)` and `get_device_name(index)` are, so it can stand in for the
`torch.cuda` module where the worker reads device memory (`otel_train.export.samples`).

Every call on every event is logged with the calling thread, and every synchronising call
(`synchronize()`, or `elapsed_time` before both events completed, which would block on a real
device) is counted in `syncs`, so a test can assert the training thread only ever called
`record()` and nothing ever synchronised.
"""

from __future__ import annotations

import struct
import threading
from collections import Counter, deque
from collections.abc import Callable

from otel_train.record.clock import FakeClock

MS = 1_000_000
NEVER = float("inf")


def _f32(value: float) -> float:
    # cudaEventElapsedTime returns a float32 of milliseconds.
    return struct.unpack("f", struct.pack("f", value))[0]


class FakeDevice:
    def __init__(self, clock: FakeClock, launch_latency_ns: int = 0, queue_limit: int | None = None) -> None:
        self.clock = clock
        self.latency = launch_latency_ns
        #: Launches and event records the stream holds at most; one more blocks the host until the
        #: oldest completes (CUDA's launch queue: ~1,024 entries).
        self.queue_limit = queue_limit
        self.queued: deque[float] = deque()  # completion times of what the stream holds, in order
        self.busy_until: float = clock.now_ns
        self.hung = False
        self.syncs: list[tuple[str, str]] = []  # (thread name, what)
        self.calls: Counter[tuple[int, str]] = Counter()  # (thread ident, method) -> count
        self.created = 0
        self.errors = False
        self.name = "NVIDIA H100 80GB HBM3"
        self.allocated = self.reserved = self.peak = 0

    # -- what the simulated training code does --------------------------------------------
    def launch(self, ns: int) -> float:
        """Enqueue `ns` of device work now (after waiting for room in a full queue); returns when
        (host clock) it will be done."""
        self.admit()
        start = max(self.clock.now_ns + self.latency, self.busy_until)
        self.busy_until = NEVER if self.hung else start + ns
        self.queued.append(self.busy_until)
        return self.busy_until

    def admit(self) -> None:
        """Room for one more entry on the stream: with a full queue the host blocks (the clock
        moves) until the oldest entry completes."""
        queued = self.queued
        while queued and queued[0] <= self.clock.now_ns:
            queued.popleft()
        while self.queue_limit is not None and len(queued) >= self.queue_limit:
            self.wait_until(queued.popleft())

    def run_on(self, ns_per_call: int) -> Callable[[float], None]:
        """A `time.sleep` under which the host clock moves on `ns_per_call` a call: the device
        works through its queue while the code under test waits in real time (shutdown)."""
        def sleep(seconds: float) -> None:
            self.clock.advance(ns_per_call)
        return sleep

    def wait_until(self, t: float) -> None:
        """The training code blocks until host time `t` (its own sync: `.item()`, a D2H copy)."""
        assert t != NEVER, "the scenario waits on a hung device"
        self.clock.now_ns = max(self.clock.now_ns, int(t))

    def drain(self) -> None:
        self.wait_until(self.busy_until)

    def hang(self) -> None:
        """Every event recorded from now on never completes (a hung kernel)."""
        self.hung = True
        self.busy_until = NEVER

    # -- the caching allocator's counters (host-side: reading them never synchronises) -----
    def alloc(self, nbytes: int) -> None:
        self.allocated += nbytes
        self.peak = max(self.peak, self.allocated)
        self.reserved = max(self.reserved, self.allocated)

    def free(self, nbytes: int) -> None:
        self.allocated -= nbytes  # the allocator keeps the memory reserved, as torch's does

    def memory_stats(self, index: int | None = None) -> dict[str, int]:
        self._log("memory_stats")
        return {"allocated_bytes.all.current": self.allocated, "reserved_bytes.all.current": self.reserved,
                "allocated_bytes.all.peak": self.peak, "active.all.current": 3}

    def get_device_name(self, index: int | None = None) -> str:
        self._log("get_device_name")
        return self.name

    # -- the event factory handed to device timing ----------------------------------------
    def event(self) -> FakeEvent:
        self.created += 1
        return FakeEvent(self)

    def calls_on(self, thread_ident: int) -> dict[str, int]:
        return {method: n for (ident, method), n in self.calls.items() if ident == thread_ident}

    def _log(self, method: str) -> None:
        self.calls[(threading.get_ident(), method)] += 1


class FakeEvent:
    def __init__(self, device: FakeDevice) -> None:
        self.device = device
        self.done_at: float | None = None

    def record(self) -> None:
        dev = self.device
        dev._log("record")
        dev.admit()  # a full queue blocks cudaEventRecord as it blocks a launch
        self.done_at = max(dev.clock.now_ns + dev.latency, dev.busy_until)
        dev.busy_until = self.done_at
        dev.queued.append(self.done_at)

    def query(self) -> bool:
        dev = self.device
        dev._log("query")
        if dev.errors:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return self.done_at is not None and dev.clock.now_ns >= self.done_at

    def elapsed_time(self, end: FakeEvent) -> float:
        dev = self.device
        dev._log("elapsed_time")
        now = dev.clock.now_ns
        if self.done_at is None or end.done_at is None or now < self.done_at or now < end.done_at:
            dev.syncs.append((threading.current_thread().name, "elapsed_time before completion"))
            raise RuntimeError("CUDA error: device not ready")
        return _f32((end.done_at - self.done_at) / MS)

    def synchronize(self) -> None:
        dev = self.device
        dev._log("synchronize")
        dev.syncs.append((threading.current_thread().name, "Event.synchronize"))
        if self.done_at is not None:
            dev.wait_until(self.done_at)
