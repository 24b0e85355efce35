"""`otel-train bench overhead --device-path`: the accelerator code path's cost, on a CPU.

Most machines have no GPU, and on a CPU device timing records nothing (host time is device
time), so the CPU benchmarks never run the code a GPU run takes. This one does: a *proxy
device* stands in for CUDA behind the same event API (`record`, `query`, `elapsed_time`), and
each call costs what CUDA's does (a busy wait of the constants below, printed with the
figures), so device timing takes exactly its accelerator path (event pool, recording from
the hot path, the worker's resolution) on a loop that is launch-bound the way the GPU loop of
issue 51 is: many small ops a step, so per-call costs show.

The loop: the issue's loop scaled to a CPU (a 12-layer 64-wide MLP, batch 64, a `DataLoader`,
`.to(device, non_blocking=True)`, AdamW, `loss.item()` every 10 steps; ~1-2 ms a step with one
intra-op thread). Variants, each in a fresh process (as a user starts one), run in rounds, in
interleaved order: `plain` (no otel_train), `auto_host` (automatic instrumentation, host path:
what a CPU run takes), `auto_device` (the same, the proxy device timed), `explicit_host` and
`explicit_device` (explicit `otel_train.step` / `span` around the phases). Export goes to files
through the exporter process, the default path.

Figures (`name: value` lines), per variant:
- `step_us_<variant>`: median over rounds of the µs a step (wall clock: noisy on a busy host);
  `added_us_<variant>`: the same minus the round's plain one (median of the paired deltas).
- `python_calls_per_step_<variant>`: Python function calls a step on the training thread
  (`sys.setprofile`, which sees that thread only); the proxy device's own methods are not
  counted (they stand in for C calls). Independent of load: the figure to guard.
- `python_calls_added_<variant>`: the same minus the plain loop's.
- `c_calls_per_step_<variant>`: the same for calls of C functions.
- `train_cpu_us_per_step_<variant>`: CPU of the training thread a step (`time.thread_time_ns`),
  which waiting for a core on a loaded host does not inflate.
- `worker_cpu_us_per_step_<variant>`: CPU of the worker thread a step (in the training
  process: what it runs holds the GIL the training thread needs).
- `records_per_step_<variant>`, `queries_per_step_<variant>`, `elapsed_per_step_<variant>`:
  the proxy's event calls a step (device variants).

The constants are estimates, not measurements on a GPU: cudaEventRecord is about 1-3 µs of host
time, cudaEventQuery and cudaEventElapsedTime well under 1-2 µs, creating an event with timing
about 1 µs (NVIDIA's and PyTorch's published figures; no per-call timing was recorded on the
H200 run of 2026-11-27). `tests/gpu_checks.sh` measures them on a GPU (`event_call_costs`);
replace them here when it has.
"""

from __future__ import annotations

import gc
import json
import os
import random
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import Any

#: ns of host time each proxy call costs (the estimates of the module docstring).
RECORD_NS = 2000
QUERY_NS = 500
ELAPSED_NS = 1000
CREATE_NS = 1000
#: ns after its `record()` that a proxy event completes: the device keeps pace with a
#: launch-bound host a little behind it.
LAG_NS = 500_000

VARIANTS = ("plain", "auto_host", "auto_device", "explicit_host", "explicit_device")
#: On a GPU, the real loop: plain, automatic (device timing on), automatic with
#: `OTEL_TRAIN_DEVICE_TIMING=off`, explicit spans (device timing on), hand-written SDK spans.
CUDA_VARIANTS = ("plain", "auto", "auto_off", "explicit", "sdk")
_WARMUP, _COUNTED = 60, 64  # counted over two of detection's batches of notes (32 steps each)


def _spin(ns: int) -> None:
    end = time.perf_counter_ns() + ns
    while time.perf_counter_ns() < end:
        pass


class ProxyDevice:
    """A device whose events cost what CUDA's do, in real time: an event completes `lag_ns`
    after it was recorded. `calls` counts each method's calls."""

    def __init__(self, lag_ns: int = LAG_NS) -> None:
        self.lag_ns = lag_ns
        self.calls: Counter[str] = Counter()

    def event(self) -> ProxyEvent:
        self.calls["create"] += 1
        _spin(CREATE_NS)
        return ProxyEvent(self)


class ProxyEvent:
    __slots__ = ("device", "at")

    def __init__(self, device: ProxyDevice) -> None:
        self.device = device
        self.at: int | None = None

    def record(self, stream: Any = None) -> None:
        self.device.calls["record"] += 1
        _spin(RECORD_NS)
        self.at = time.perf_counter_ns() + self.device.lag_ns

    def query(self) -> bool:
        self.device.calls["query"] += 1
        _spin(QUERY_NS)
        return self.at is not None and time.perf_counter_ns() >= self.at

    def elapsed_time(self, end: ProxyEvent) -> float:
        self.device.calls["elapsed_time"] += 1
        _spin(ELAPSED_NS)
        if self.at is None or end.at is None or time.perf_counter_ns() < max(self.at, end.at):
            raise RuntimeError("proxy device: elapsed_time of an event not yet complete (a sync on CUDA)")
        ms = (end.at - self.at) / 1e6
        return struct.unpack("f", struct.pack("f", ms))[0]  # cudaEventElapsedTime: float32 ms


_PROXY_FILE = __file__


# --- the loop (in the child process) ----------------------------------------------------
_LOOP = """
def step(self):
    try:
        x, y = next(self.it)
    except StopIteration:
        self.it = iter(self.loader)
        x, y = next(self.it)
    x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
    loss = self.loss(self.model(x), y)
    loss.backward()
    self.opt.step()
    self.opt.zero_grad(set_to_none=True)
    self.n += 1
    if self.n % 10 == 0:
        self.last = loss.item()
"""


class ProxyLoop:
    """The launch-bound loop; `step()` plain (as a user's script), `explicit()` with spans,
    `sdk(tracer)` with hand-written OpenTelemetry SDK spans. On "cuda", the issue's loop itself
    (512 wide, pinned batches), else its CPU proxy (64 wide)."""

    def __init__(self, device: str = "cpu") -> None:
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset

        torch.manual_seed(0)
        width = 512 if device == "cuda" else 64
        layers: list[Any] = []
        for _ in range(12):
            layers += [nn.Linear(width, width), nn.ReLU()]
        self.model = nn.Sequential(*layers, nn.Linear(width, 10)).to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.loss = nn.CrossEntropyLoss()
        self.loader = DataLoader(TensorDataset(torch.randn(4096, width), torch.randint(0, 10, (4096,))),
                                 batch_size=64, shuffle=True, pin_memory=device == "cuda")
        self.it = iter(self.loader)
        self.device = device
        self.n = 0
        self.last = 0.0

    def explicit(self) -> None:
        import otel_train
        self._spanned(otel_train.span, otel_train.step)

    def sdk(self, tracer: Any) -> None:
        from otel_train import semconv

        def span(name: str) -> Any:
            return tracer.start_as_current_span(name)
        self._spanned(span, lambda: span(semconv.SPAN_STEP))

    def _spanned(self, span: Any, step: Any) -> None:
        from otel_train import semconv

        with step():
            with span(semconv.SPAN_DATA):
                try:
                    x, y = next(self.it)
                except StopIteration:
                    self.it = iter(self.loader)
                    x, y = next(self.it)
                x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            with span(semconv.SPAN_FORWARD):
                loss = self.loss(self.model(x), y)
            with span(semconv.SPAN_BACKWARD):
                loss.backward()
            with span(semconv.SPAN_OPTIMIZER):
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)
        self.n += 1
        if self.n % 10 == 0:
            self.last = loss.item()


def _count_calls(step: Any, steps: int) -> tuple[int, int]:
    """(Python calls, C calls) `steps` steps make on this thread, the proxy's own left out."""
    counts = {"call": 0, "c_call": 0}

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event in counts and frame.f_code.co_filename != _PROXY_FILE:
            counts[event] += 1

    # A garbage collection inside the window would add our `gc.callbacks` pause hooks (and any
    # finalizers) to one variant's count and not the other's: collect first, then count without.
    gc.collect()
    gc.disable()
    sys.setprofile(profile)
    try:
        for _ in range(steps):
            step()
    finally:
        sys.setprofile(None)
        gc.enable()
    return counts["call"], counts["c_call"]


def child(variant: str, steps: int, out_dir: str, cuda: bool = False, endpoint: str | None = None,
          warmup: int = _WARMUP) -> dict[str, float]:
    """One variant's figures, in this (fresh) process. `cuda`: the real loop on the GPU (variants
    `CUDA_VARIANTS`); `endpoint`: export over OTLP gRPC to it, else to files in `out_dir`."""
    import torch

    from otel_train.bench.harness import as_script

    torch.set_num_threads(1)
    loop = ProxyLoop("cuda" if cuda else "cpu")
    step_fn = as_script(_LOOP, "bench_device_path_loop")["step"]
    plain = lambda: step_fn(loop)  # noqa: E731
    run: Any = plain
    worker = proxy = provider = None
    if variant == "sdk":
        from otel_train.bench.harness import sdk_tracer
        provider, tracer = sdk_tracer(endpoint)
        run = lambda: loop.sdk(tracer)  # noqa: E731
    elif variant != "plain":
        import otel_train
        from otel_train import _runtime
        from otel_train.record import device as _device

        where: dict[str, Any] = {"endpoint": endpoint, "protocol": "grpc"} if endpoint else {"output_dir": out_dir}
        otel_train.init(run_id=f"device-path-{variant}-{os.getpid()}", metric_interval_ms=60000,
                        device_timing="off" if variant == "auto_off" else "auto", **where)
        if variant.endswith("_device"):
            proxy = ProxyDevice()
            _device.active().use(proxy.event, "cuda")  # type: ignore[union-attr]
        if variant.startswith("auto"):
            from otel_train.instrumentation import TorchTrainingInstrumentor
            TorchTrainingInstrumentor().instrument()
        worker = _runtime.state().worker  # type: ignore[union-attr]
        if variant.startswith("explicit"):
            run = loop.explicit
    for _ in range(warmup):
        run()
    if cuda:
        torch.cuda.synchronize()  # the bench's own sync, outside the timed steps
    if worker is not None:
        worker.drain()  # the warm-up's records are not the window's work
    calls0 = Counter(proxy.calls) if proxy is not None else Counter()
    cpu0 = worker.cpu_ns() if worker is not None else 0
    t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
    for _ in range(steps):
        run()
    if cuda:
        torch.cuda.synchronize()  # the bench's own sync: the steps' device work is in their time
    elapsed, train_cpu = time.perf_counter_ns() - t0, time.thread_time_ns() - c0
    result = {"step_us": elapsed / steps / 1e3, "train_cpu_us_per_step": train_cpu / steps / 1e3}
    if worker is not None:
        # What the worker has not drained yet is drained here (its CPU counted as the worker's),
        # so the figure does not depend on where the window fell between drains.
        d0 = time.thread_time_ns()
        worker.drain()
        rest = time.thread_time_ns() - d0
        result["worker_cpu_us_per_step"] = (worker.cpu_ns() - cpu0 + rest) / steps / 1e3
    if proxy is not None:
        for name in ("record", "query", "elapsed_time"):
            result[f"{name}_per_step"] = (proxy.calls[name] - calls0[name]) / steps
    if worker is not None:
        # Counted as a long run has it: the event pool warm (more events made than the count
        # takes), every event back, none made while counting.
        for _ in range(2 * _COUNTED):
            run()
        time.sleep(0.01)  # the last events complete (proxy: LAG_NS)
        worker.drain()
    py, c = _count_calls(run, _COUNTED)
    result["python_calls_per_step"] = py / _COUNTED
    result["c_calls_per_step"] = c / _COUNTED
    if provider is not None:
        provider.shutdown()
    elif variant != "plain":
        import otel_train
        otel_train.shutdown()
    return result


# --- the runner (in the parent) ---------------------------------------------------------
def run_device_path(rounds: int = 3, steps: int = 1500, seed: int = 0, cuda: bool | None = None) -> int:
    """Every variant once a round, each in a fresh process, rounds in a random order; prints
    the figures of the module docstring. With a CUDA device (`cuda` None: when torch sees one)
    the real loop runs instead of the proxy: 1,000 steps after 300 of warm-up by default."""
    import torch

    from otel_train.bench.harness import Receiver, print_figure

    if cuda is None:
        cuda = torch.cuda.is_available()
    variants = CUDA_VARIANTS if cuda else VARIANTS
    if cuda:
        print_figure("device", torch.cuda.get_device_name())
    else:
        for name, value in (("proxy_record_us", RECORD_NS / 1e3), ("proxy_query_us", QUERY_NS / 1e3),
                            ("proxy_elapsed_time_us", ELAPSED_NS / 1e3), ("proxy_create_us", CREATE_NS / 1e3),
                            ("proxy_lag_us", LAG_NS / 1e3)):
            print_figure(name, value)
        print_figure("proxy_costs", "estimates (no per-call timing on a GPU recorded yet)")
    print_figure("rounds", rounds)
    print_figure("steps", steps)
    print_figure("load_avg_1m", os.getloadavg()[0])
    rng = random.Random(seed)
    results: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    receiver = Receiver()
    try:
        with tempfile.TemporaryDirectory(prefix="otel-train-device-path-") as out_dir:
            for _ in range(rounds):
                for variant in rng.sample(variants, len(variants)):
                    results[variant].append(_spawn(variant, steps, out_dir, cuda, receiver.endpoint))
    finally:
        receiver.close()
    plain = [r["step_us"] for r in results["plain"]]
    plain_calls = statistics.median(r["python_calls_per_step"] for r in results["plain"])
    for variant in variants:
        runs = results[variant]
        print_figure(f"step_us_{variant}", statistics.median(r["step_us"] for r in runs))
        if variant != "plain":
            added = statistics.median(r["step_us"] - p for r, p in zip(runs, plain))
            print_figure(f"added_us_{variant}", added)
            print_figure(f"added_pct_{variant}", 100 * added / statistics.median(plain))
        for key in ("python_calls_per_step", "c_calls_per_step", "train_cpu_us_per_step", "worker_cpu_us_per_step",
                    "record_per_step", "query_per_step", "elapsed_time_per_step"):
            if key in runs[0]:
                print_figure(f"{key}_{variant}", statistics.median(r[key] for r in runs))
        if variant != "plain":
            calls = statistics.median(r["python_calls_per_step"] for r in runs)
            print_figure(f"python_calls_added_{variant}", calls - plain_calls)
    return 0


def _spawn(variant: str, steps: int, out_dir: str, cuda: bool, endpoint: str) -> dict[str, float]:
    # Exporting to files on the CPU (the proxy's figures since 2026-11-28), over OTLP on a GPU
    # (the setting); the SDK variant always over OTLP.
    where = endpoint if cuda or variant == "sdk" else None
    warmup = 300 if cuda else _WARMUP
    code = ("import json, sys; from otel_train.bench.device_path import child; "
            f"print(json.dumps(child({variant!r}, {steps}, {out_dir!r}, {cuda!r}, {where!r}, {warmup})))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"device-path variant {variant} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
