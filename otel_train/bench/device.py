"""`otel-train bench device`: what device timing costs a training loop, and whether it is right.

Trains one model three times for the same number of steps: plain, instrumented (explicit
`otel_train.step()` / `span()` around forward, backward and optimizer, device timing on) and
automatic (the plain step, written as a user's script, under automatic detection as
`import otel_train.auto` installs it), and counts every synchronising call in each
(`torch.cuda.synchronize`, `torch.cuda.Event.synchronize`, `torch.cuda.Stream.synchronize`,
`torch.Tensor.item`, on any thread). On CUDA the model is big enough to be GPU-bound, and two
more, profiled runs compare the device durations otel_train reports with the kernel time
`torch.profiler` measures over the same steps. Without CUDA a small CPU model runs (device
timing then adds nothing: host time is device time).

Keys of the result:
- `syncs_plain`, `syncs_instrumented`, `syncs_automatic`: synchronising calls during the loop
  (target: equal, i.e. device timing adds none); the automatic one counts its discovery steps too.
- `step_ms_plain`, `step_ms_instrumented`, `step_ms_automatic`: wall time per step, the loop's
  own final sync included (automatic: after its discovery steps).
- `phase_spans_instrumented`, `phase_spans_automatic`: forward, backward and optimizer spans
  emitted (three a step; automatic: its discovery steps too).
- `device_vs_profiler_pct` (CUDA only): |sum of device.duration_s of the phase spans - kernel time
  in the profiler| / kernel time, in percent. `automatic_device_vs_profiler_pct`: the same for
  the automatic run, whose loss is computed after the forward returns, outside every phase (a
  few elementwise kernels: a fraction of a per cent of this step's kernel time).
- `device_timed_spans`, `automatic_device_timed_spans` (CUDA only): phase spans that carried
  device time in the profiled runs.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

from otel_train import semconv
from otel_train.bench.harness import as_script
from otel_train.bench.switches import SyncCounter

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


#: The plain step, which automatic mode also runs: compiled as a user's script (`as_script`), as
#: detection reads a script's call sites and skips frames of otel_train's own modules.
_PLAIN = """
def plain_step(model, opt, x, y):
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
"""
#: Automatic mode's first steps: discovery, then the settle onto the root module.
_DISCOVERY_STEPS = 6


@functools.cache
def plain_step(torch: Any) -> Callable[[Any, Any, Any, Any], None]:
    return as_script(_PLAIN, "bench_device_step", torch=torch)["plain_step"]


def _loop(torch: Any, model: Any, opt: Any, x: Any, y: Any, steps: int, mode: str,
          counter: SyncCounter | None) -> float:
    """Run `steps` steps (`mode`: plain, instrumented or automatic, whose detection must be
    installed); returns wall ms per step (the final device sync included, not counted)."""
    def sync() -> None:
        if x.is_cuda:
            torch.cuda.synchronize()  # CPU-GPU sync point: the bench's own, outside the count

    step = plain_step(torch)
    if mode == "automatic":  # discovery, then the settle onto the root: counted, not timed
        if counter is not None:
            counter.active = True
        for _ in range(_DISCOVERY_STEPS):
            step(model, opt, x, y)
        if counter is not None:
            counter.active = False
    sync()
    if counter is not None:
        counter.active = True
    t0 = time.perf_counter()
    if mode == "instrumented":
        train_instrumented(torch, model, opt, x, y, steps)
    else:
        for _ in range(steps):
            step(model, opt, x, y)
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


@contextlib.contextmanager
def _session(mode: str, exporter: Any, counter: SyncCounter | None) -> Iterator[None]:
    """otel_train started for `mode` (automatic: detection installed too), stopped after the
    block, with the worker's last resolution and the final flush counted."""
    import otel_train
    from otel_train import detect

    _init(exporter)
    if mode == "automatic":
        detect.install()
    try:
        yield
    finally:
        if counter is not None:
            counter.active = True
        if mode == "automatic":
            detect.uninstall()
        otel_train.shutdown(10.0)
        if counter is not None:
            counter.active = False


def run_device_bench(steps: int) -> dict[str, float]:
    """Plain vs instrumented vs automatic loops: synchronisations and step time; on CUDA, device
    vs profiler."""
    import torch
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from otel_train.detect import native

    modes = ("instrumented", "automatic") if native.MISSING is None else ("instrumented",)
    if native.MISSING is not None:  # no automatic row, said once: the explicit rows still run
        native.say_off()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, opt, x, y = _build(torch, device)
    _loop(torch, model, opt, x, y, 10, "plain", None)  # warm-up: allocator, cuBLAS handles, kernels
    counter = SyncCounter()
    result: dict[str, float] = {}
    with counter.installed():
        result["step_ms_plain"] = _loop(torch, model, opt, x, y, steps, "plain", counter)
        result["syncs_plain"] = float(counter.total())
        for mode in modes:
            counter.calls.clear()
            exporter = InMemorySpanExporter()
            with _session(mode, exporter, counter):
                result[f"step_ms_{mode}"] = _loop(torch, model, opt, x, y, steps, mode, counter)
            result[f"syncs_{mode}"] = float(counter.total())
            result[f"phase_spans_{mode}"] = float(sum(s.name in _PHASES for s in exporter.get_finished_spans()))
    if device == "cuda":
        for mode in modes:
            prefix = "automatic_" if mode == "automatic" else ""
            compared = _compare_with_profiler(torch, model, opt, x, y, min(steps, 20), mode)
            result.update({prefix + name: value for name, value in compared.items()})
    return result


def _compare_with_profiler(torch: Any, model: Any, opt: Any, x: Any, y: Any, steps: int,
                           mode: str) -> dict[str, float]:
    """Device durations of the phase spans vs the kernel time the profiler saw, same steps."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from torch.profiler import ProfilerActivity, profile

    exporter = InMemorySpanExporter()
    with _session(mode, exporter, None):
        if mode == "automatic":
            _loop(torch, model, opt, x, y, _DISCOVERY_STEPS, "plain", None)  # discovery, unprofiled
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            _loop(torch, model, opt, x, y, steps, "plain" if mode == "automatic" else mode, None)
    kernel_s = sum(e.self_device_time_total for e in prof.key_averages()) / 1e6  # us -> s
    spans = [s for s in exporter.get_finished_spans() if s.name in _PHASES]
    profiled = set(sorted({s.attributes.get(semconv.TRAIN_STEP, -1) for s in spans})[-steps:])
    spans = [s for s in spans if s.attributes.get(semconv.TRAIN_STEP, -1) in profiled]
    device_s = sum(float(s.attributes.get(semconv.DEVICE_DURATION_S, 0.0)) for s in spans)
    timed = sum(1 for s in spans if semconv.DEVICE_DURATION_S in s.attributes)
    pct = abs(device_s - kernel_s) / kernel_s * 100 if kernel_s > 0 else float("nan")
    return {"device_vs_profiler_pct": pct, "device_timed_spans": float(timed),
            "device_s_total": device_s, "profiler_kernel_s_total": kernel_s}
