"""`otel-train bench device`: what device timing costs a training loop, and whether it is right.

Trains one model twice for the same number of steps, plain and instrumented (explicit
`otel_train.step()` / `span()` around forward, backward and optimizer, device timing on), and
counts every synchronising call in both (`torch.cuda.synchronize`, `torch.cuda.Event.synchronize`,
`torch.cuda.Stream.synchronize`, `torch.Tensor.item`, on any thread). On CUDA the model is big
enough to be GPU-bound, and a third, profiled run compares the device durations otel_train
reports with the kernel time `torch.profiler` measures over the same steps. Without CUDA a
small CPU model runs (device timing then adds nothing: host time is device time).

Keys of the result:
- `syncs_plain`, `syncs_instrumented`: synchronising calls during the timed loop (target: equal,
  i.e. device timing adds none).
- `step_ms_plain`, `step_ms_instrumented`: wall time per step, the loop's own final sync included.
- `device_vs_profiler_pct` (CUDA only): |sum of device.duration_s of the phase spans - kernel time
  in the profiler| / kernel time, in percent.
- `device_timed_spans` (CUDA only): phase spans that carried device time in the profiled run.
"""

from __future__ import annotations

import time
from typing import Any

from otel_train import semconv
from otel_train.testing import SyncCounter

_PHASES = (semconv.SPAN_FORWARD, semconv.SPAN_BACKWARD, semconv.SPAN_OPTIMIZER)


def _build(torch: Any, device: str) -> tuple[Any, Any, Any, Any]:
    if device == "cuda":
        width, depth, batch = 4096, 4, 8192  # ~3 TFLOP per step: the GPU, not the host, is the limit
    else:
        width, depth, batch = 256, 3, 64
    gen = torch.Generator().manual_seed(0)
    layers: list[Any] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch, width, generator=gen).to(device)
    y = torch.randn(batch, width, generator=gen).to(device)
    return model, opt, x, y


def train_instrumented(torch: Any, model: Any, opt: Any, x: Any, y: Any, steps: int) -> None:
    """`steps` steps with explicit step and phase spans (the GPU tests train the same way)."""
    import otel_train

    for _ in range(steps):
        with otel_train.step():
            with otel_train.span(semconv.SPAN_FORWARD):
                loss = torch.nn.functional.mse_loss(model(x), y)
            with otel_train.span(semconv.SPAN_BACKWARD):
                loss.backward()
            with otel_train.span(semconv.SPAN_OPTIMIZER):
                opt.step()
                opt.zero_grad(set_to_none=True)


def _loop(torch: Any, model: Any, opt: Any, x: Any, y: Any, steps: int, instrument: bool,
          counter: SyncCounter | None) -> float:
    """Run `steps` steps; returns wall ms per step (the final device sync included, not counted)."""
    def sync() -> None:
        if x.is_cuda:
            torch.cuda.synchronize()  # CPU-GPU sync point: the bench's own, outside the count

    sync()
    if counter is not None:
        counter.active = True
    t0 = time.perf_counter()
    if instrument:
        train_instrumented(torch, model, opt, x, y, steps)
    else:
        for _ in range(steps):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    if counter is not None:
        counter.active = False
    sync()
    return (time.perf_counter() - t0) * 1e3 / steps


def _init(exporter: Any) -> None:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    import otel_train

    otel_train.init(span_processors=[SimpleSpanProcessor(exporter)], export_mode="thread",
                    traces_exporter="none", metrics_exporter="none", device_timing="auto",
                    flush_interval_ms=50, run_id="bench-device")


def run_device_bench(steps: int) -> dict[str, float]:
    """Plain vs instrumented loop: synchronisations and step time; on CUDA, device vs profiler."""
    import torch
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import otel_train

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, opt, x, y = _build(torch, device)
    _loop(torch, model, opt, x, y, 10, False, None)  # warm-up: allocator, cuBLAS handles, kernels
    counter = SyncCounter()
    result: dict[str, float] = {}
    with counter.installed():
        result["step_ms_plain"] = _loop(torch, model, opt, x, y, steps, False, counter)
        result["syncs_plain"] = float(counter.total())
        counter.calls.clear()
        _init(InMemorySpanExporter())
        try:
            result["step_ms_instrumented"] = _loop(torch, model, opt, x, y, steps, True, counter)
            counter.active = True  # the worker's resolution and the final flush count too
        finally:
            otel_train.shutdown(10.0)
            counter.active = False
        result["syncs_instrumented"] = float(counter.total())
    if device == "cuda":
        result.update(_compare_with_profiler(torch, model, opt, x, y, min(steps, 20)))
    return result


def _compare_with_profiler(torch: Any, model: Any, opt: Any, x: Any, y: Any, steps: int) -> dict[str, float]:
    """Device durations of the phase spans vs the kernel time the profiler saw, same steps."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from torch.profiler import ProfilerActivity, profile

    import otel_train

    exporter = InMemorySpanExporter()
    _init(exporter)
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            _loop(torch, model, opt, x, y, steps, True, None)
    finally:
        otel_train.shutdown(10.0)
    kernel_s = sum(e.self_device_time_total for e in prof.key_averages()) / 1e6  # us -> s
    spans = [s for s in exporter.get_finished_spans() if s.name in _PHASES]
    device_s = sum(float(s.attributes.get(semconv.DEVICE_DURATION_S, 0.0)) for s in spans)
    timed = sum(1 for s in spans if semconv.DEVICE_DURATION_S in s.attributes)
    pct = abs(device_s - kernel_s) / kernel_s * 100 if kernel_s > 0 else float("nan")
    return {"device_vs_profiler_pct": pct, "device_timed_spans": float(timed),
            "device_s_total": device_s, "profiler_kernel_s_total": kernel_s}
