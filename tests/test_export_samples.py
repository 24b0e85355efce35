"""`otel_train.export.samples`: the worker's readings, from a fake device standing in for torch.cuda."""

from __future__ import annotations

import threading

import torch
from support.fake_device import FakeDevice

from otel_train import semconv
from otel_train.export.samples import Sampler
from otel_train.record.clock import FakeClock


def test_memory_counters_the_device_name_once_and_the_parameter_count() -> None:
    device = FakeDevice(FakeClock())
    model = torch.nn.Linear(10, 5)  # 55 trainable parameters
    frozen = torch.nn.Linear(100, 100).requires_grad_(False)  # counts none
    sampler = Sampler(models=lambda: [frozen, model], backend=lambda kind: device,
                      timed_device=lambda: ("cuda", 0))
    device.alloc(3 << 20)
    device.free(1 << 20)
    first = sampler()
    assert first == {semconv.METRIC_MEMORY_ALLOCATED: 2 << 20, semconv.METRIC_MEMORY_RESERVED: 3 << 20,
                     semconv.METRIC_MEMORY_PEAK: 3 << 20, semconv.WIRE_SAMPLE_DEVICE_NAME: "NVIDIA H100 80GB HBM3",
                     semconv.WIRE_SAMPLE_PARAMETERS: 55}
    device.alloc(5 << 20)
    assert sampler() == {semconv.METRIC_MEMORY_ALLOCATED: 7 << 20, semconv.METRIC_MEMORY_RESERVED: 7 << 20,
                         semconv.METRIC_MEMORY_PEAK: 7 << 20}  # name and size only when new
    assert device.syncs == []  # counters only: nothing waited for the device


def test_on_the_cpu_there_is_no_memory_reading() -> None:
    sampler = Sampler(models=lambda: [torch.nn.Linear(2, 2)], timed_device=lambda: None)
    assert sampler() == {semconv.WIRE_SAMPLE_PARAMETERS: 6}
    assert sampler() is None  # nothing new


def test_a_broken_reading_is_dropped_for_good_and_never_raises() -> None:
    class Broken:
        calls = 0

        def memory_stats(self, index: int | None) -> dict[str, int]:
            Broken.calls += 1
            raise RuntimeError("CUDA error: driver shutting down")

        def get_device_name(self, index: int | None) -> str:
            return "NVIDIA L4"

    sampler = Sampler(models=lambda: [], backend=lambda kind: Broken(), timed_device=lambda: ("cuda", 1))
    assert sampler() == {semconv.WIRE_SAMPLE_DEVICE_NAME: "NVIDIA L4"}
    assert sampler() is None and Broken.calls == 1


def test_the_worker_reads_them_off_the_training_thread() -> None:
    """Through the real worker: the readings reach the exporter's gauges (bytes); the training
    thread never read the device's counters."""
    from support.harness import Harness

    import otel_train
    from otel_train import _runtime

    device = FakeDevice(FakeClock())
    h = Harness(flush_interval_ms=10**9)  # no drain until shutdown's, on a thread of its own
    _runtime.state().worker.sample = Sampler(models=lambda: [], backend=lambda kind: device,
                                             timed_device=lambda: ("cuda", 0))
    device.alloc(1 << 30)
    for _ in range(3):
        with otel_train.step():
            h.clock.advance(1_000_000)
    h.finish()
    assert [p.value for p in h.metric_points(semconv.METRIC_MEMORY_ALLOCATED)] == [float(1 << 30)]
    assert [p.value for p in h.metric_points(semconv.METRIC_MEMORY_PEAK)] == [float(1 << 30)]
    units = {m.name: m.unit for rm in h.metrics.final.resource_metrics for sm in rm.scope_metrics
             for m in sm.metrics}
    assert units[semconv.METRIC_MEMORY_RESERVED] == "By"
    assert device.calls_on(threading.main_thread().ident) == {}
    assert sum(n for (_, method), n in device.calls.items() if method == "memory_stats") == 1
