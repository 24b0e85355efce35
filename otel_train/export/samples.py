"""What the worker reads in the training process for the metrics, once a drain, off the training thread.

The exporter process never imports torch, so what only torch knows reaches it as a reading
(`wire.schema.sample_wire`) the worker sends with a drain:

- `device.memory.allocated`, `device.memory.reserved`, `device.memory.peak` (bytes): the caching
  allocator's counters for the model's device (`torch.cuda.memory_stats`, and its `xpu` twin;
  MPS: `current_allocated_memory` / `driver_allocated_memory`, no peak). These are host-side
  counters: `memory_stats` copies them under the allocator's mutex (`getDeviceStats`), with no
  device call and no synchronisation; building its dict of ~100 entries costs tens of µs, which
  is why it runs here, on the worker thread, once a drain, and not at every step on the training
  thread. The peak is the allocator's own (since the process started or the user last called
  `reset_peak_memory_stats`): resetting it each step would change what the user's own
  `max_memory_allocated()` says.
- `_device.name`, once: the exporter looks its peak FLOP/s up (`peak_flops`) for `train.mfu`.
- `_model.parameters`: the trainable parameters of the largest model automatic detection found
  (its roots), for `train.mfu`'s 6·N·tokens when the user gave no FLOPs.

On the CPU, or before any accelerator holds memory, there is no memory reading. Every read is
guarded: a failure stops that reading for good and never reaches training.
"""

from __future__ import annotations

import logging
import os
import sys
import weakref
from collections.abc import Callable
from typing import Any

from otel_train import semconv

_log = logging.getLogger("otel_train")

DEVICE_NAME = semconv.WIRE_SAMPLE_DEVICE_NAME
MODEL_PARAMETERS = semconv.WIRE_SAMPLE_PARAMETERS
ALLOCATED, RESERVED, PEAK = (semconv.METRIC_MEMORY_ALLOCATED, semconv.METRIC_MEMORY_RESERVED,
                             semconv.METRIC_MEMORY_PEAK)
#: `memory_stats` keys of the three counters.
_STATS = {ALLOCATED: "allocated_bytes.all.current", RESERVED: "reserved_bytes.all.current",
          PEAK: "allocated_bytes.all.peak"}


class Sampler:
    """Called by the worker once a drain: the readings to send (a dict), or None.

    `models()` gives the modules detection found; `backend(device_type)` the torch module of a
    device type (`torch.cuda`, `torch.xpu`, `torch.mps`); `timed_device()` the accelerator device
    timing chose, for a run without detection. Tests pass fakes."""

    def __init__(self, models: Callable[[], list[Any]] | None = None,
                 backend: Callable[[str], Any] | None = None,
                 timed_device: Callable[[], tuple[str, int | None] | None] | None = None) -> None:
        self.models = models or _detected_models
        self.backend = backend or _torch_backend
        self.timed_device = timed_device or _timed_device
        self.name_sent = False
        self.failed: set[str] = set()  # readings that raised once: never tried again
        self.params: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self.params_sent: int | None = None

    def __call__(self) -> dict[str, Any] | None:
        out: dict[str, Any] = {}
        model = self._guarded("parameters", self._largest_model)
        device = self._guarded("device", lambda: _device_of(model)) if model is not None else None
        if device is None:
            device = self._guarded("timed device", self.timed_device)
        if device is not None:
            self._memory(device, out)
        if model is not None and self.params.get(model) != self.params_sent:
            out[MODEL_PARAMETERS] = self.params_sent = self.params[model]
        return out or None

    def _largest_model(self) -> Any:
        """The detected model with the most trainable parameters (each counted once)."""
        largest, most = None, -1
        for model in self.models():
            count = self.params.get(model)
            if count is None:
                count = self.params[model] = sum(p.numel() for p in model.parameters() if p.requires_grad)
            if count > most:
                largest, most = model, count
        return largest if most > 0 else None

    def _memory(self, device: tuple[str, int | None], out: dict[str, Any]) -> None:
        kind, index = device
        backend = self._guarded("backend", lambda: self.backend(kind))
        if backend is None:
            return
        if kind == "mps":
            values = self._guarded("memory", lambda: {ALLOCATED: int(backend.current_allocated_memory()),
                                                      RESERVED: int(backend.driver_allocated_memory())})
        else:
            stats = self._guarded("memory", lambda: backend.memory_stats(index))
            values = {name: int(stats[key]) for name, key in _STATS.items() if key in stats} if stats else None
        if values:
            out.update(values)
        if not self.name_sent and kind != "mps":
            name = self._guarded("name", lambda: backend.get_device_name(index))
            if name:
                out[DEVICE_NAME] = str(name)
                self.name_sent = True

    def _guarded(self, what: str, read: Callable[[], Any]) -> Any:
        if what in self.failed:
            return None
        try:
            return read()
        except Exception as err:  # noqa: BLE001 - never let the worker die, never retry a broken read
            self.failed.add(what)
            _log.debug("otel_train: reading %s for the metrics failed (%s); not read again.", what, err)
            return None


def _device_of(model: Any) -> tuple[str, int | None] | None:
    """Where the model's parameters live; None on the CPU. (Never the worker thread's current
    device: that is thread-local, not the model's.)"""
    for param in model.parameters():
        device = param.device
        return None if device.type in ("cpu", "meta") else (device.type, device.index)
    return None


def _torch_backend(device_type: str) -> Any:
    torch = sys.modules.get("torch")
    return None if torch is None else getattr(torch, device_type, None)


def _timed_device() -> tuple[str, int | None] | None:
    """The accelerator device timing chose (this rank's `LOCAL_RANK` its index), or None."""
    device_mod = sys.modules.get("otel_train.record.device")
    timing = device_mod.active() if device_mod is not None else None
    kind = getattr(timing, "device_type", None)
    if kind is None or kind == "cpu":
        return None
    return kind, int(os.environ.get("LOCAL_RANK", "0") or 0)


def _detected_models() -> list[Any]:
    """The modules automatic detection found (its roots; every module seen while discovering)."""
    roots_mod = sys.modules.get("otel_train.detect.roots")
    if roots_mod is None:
        return []
    roots = roots_mod.roots
    for _ in range(3):
        try:  # the training thread may change these sets meanwhile: try again
            return [m for m in [*roots.hooked.keys(), *roots.seen] if hasattr(m, "parameters")]
        except RuntimeError:
            continue
    return []
