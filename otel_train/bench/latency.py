"""Forward and forward+backward latency of a model on synthetic batches.

`measure_latency(module, batches, warmup=, iters=)` runs, for each phase (`forward`, then
`forward_backward`), `warmup` untimed batches and then `iters` timed ones, and returns the
result as a JSON-ready dict (docs/bench-latency.md has its schema). `otel-train bench latency`
(`latency_cli`) and the Lightning `TrainingLatencyCallback` (`latency_lightning`) both use it.

How a batch is timed: on a device with timing events (CUDA, XPU, MPS), an event is recorded on
the current stream before the forward and another after the forward (or the backward); the
events are read once, after every phase has been queued, so the benchmark adds exactly one
synchronisation, at its end, and batches are queued back to back as in training. Latency is
then device time between the two events. On the CPU it is host `perf_counter` time: the timed
span's own start and end while otel_train records (so trace, table and metric agree).

The model is left as it was found: its train/eval flags, its gradients (set aside, then put
back: a gradient being accumulated survives), its buffers (BatchNorm statistics are restored)
and the torch RNG state (CPU and the device's), so training continues exactly as it would have
without the benchmark. No optimizer is touched. Where automatic detection runs, the benchmark
is a sibling of the steps, unseen by it (`otel_train.detect.integrations.outside_training`).

Spans (through `otel_train.span`, so they go wherever the run's traces go; names in `semconv`):

- `bench.latency`: the whole benchmark (`bench.warmup`, `bench.iters`, `bench.samples`,
  `bench.tokens`, `bench.timer`, `device.type`, and the caller's: `bench.model`, `bench.after_step`);
- `bench.warmup`: one phase's warm-up batches (`bench.phase`);
- `bench.forward` / `bench.forward_backward`: one timed batch, device-timed where a device is
  (`bench.iteration`, `bench.samples`, `bench.tokens`, `device.type`).

`bench.latency` ends with a `bench.result` event holding each phase's mean / std / p50 / p90 (s).
During training it is a sibling of the steps, like a checkpoint: it joins the trace of the step
it follows, tags that step `bench`, and its time counts in no step. The exporter derives the
`bench.*` metrics from the timed spans (`export.metrics`, docs/bench-latency.md).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

import otel_train
from otel_train import semconv
from otel_train.bench.synthetic import SyntheticBatches
from otel_train.detect.integrations import outside_training
from otel_train.record.device import torch_events

__all__ = ["measure_latency", "summarize", "PHASES", "SCHEMA"]

SCHEMA = "otel_train.bench.latency/1"
FORWARD, FORWARD_BACKWARD = "forward", "forward_backward"
PHASES = (FORWARD, FORWARD_BACKWARD)

# --- names on the wire (semconv; docs/bench-latency.md) -----------------------------------
SPAN_RUN = semconv.SPAN_BENCH_LATENCY
SPAN_WARMUP = semconv.SPAN_BENCH_WARMUP
SPAN_PHASE = {FORWARD: semconv.SPAN_BENCH_FORWARD, FORWARD_BACKWARD: semconv.SPAN_BENCH_FORWARD_BACKWARD}
EVENT_RESULT = semconv.EVENT_BENCH_RESULT
ATTR_PHASE = semconv.BENCH_PHASE
ATTR_ITERATION = semconv.BENCH_ITERATION
ATTR_SAMPLES = semconv.BENCH_SAMPLES
ATTR_TOKENS = semconv.BENCH_TOKENS
ATTR_WARMUP = semconv.BENCH_WARMUP
ATTR_ITERS = semconv.BENCH_ITERS
ATTR_TIMER = semconv.BENCH_TIMER
ATTR_MODEL = semconv.BENCH_MODEL

TIMER_HOST = "host_perf_counter"
TIMER_EVENTS = "device_events"

ForwardFn = Callable[[torch.nn.Module, Any], Any]


# --- timers: a mark before and after each batch, read after the loop ----------------------
class HostTimer:
    """Host wall time (`perf_counter_ns`): where there are no device events (CPU). `span_times`:
    a timed span's own start and end stand for the marks while otel_train records (its clock)."""

    kind = TIMER_HOST

    def __init__(self, clock: Callable[[], int] = time.perf_counter_ns, span_times: bool = False) -> None:
        self._clock = clock
        self.span_times = span_times

    def mark(self) -> int:
        return self._clock()

    def seconds(self, pairs: Sequence[tuple[Any, Any]]) -> list[float]:
        return [(end - start) / 1e9 for start, end in pairs]


class EventTimer:
    """Device time between timing events recorded on the current stream."""

    kind = TIMER_EVENTS

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory = factory

    def mark(self) -> Any:
        event = self._factory()
        event.record()
        return event

    def seconds(self, pairs: Sequence[tuple[Any, Any]]) -> list[float]:
        if pairs:
            # CPU-GPU sync point: the benchmark's only one, after everything it times was queued.
            pairs[-1][1].synchronize()
        return [start.elapsed_time(end) / 1e3 for start, end in pairs]  # elapsed_time is in ms


def timer_for(device: torch.device) -> HostTimer | EventTimer:
    found = torch_events(device.type, device.index)
    return HostTimer(span_times=True) if found is None else EventTimer(found[0])


# --- statistics ----------------------------------------------------------------------------
def _quantile(ordered: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default `linear` method)."""
    pos = q * (len(ordered) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def summarize(latencies_s: Sequence[float]) -> dict[str, float]:
    """Mean, population standard deviation, p50, p90, min and max of `latencies_s` (seconds)."""
    if not latencies_s:
        raise ValueError("no latencies to summarize")
    ordered = sorted(latencies_s)
    n = len(ordered)
    mean = math.fsum(ordered) / n
    std = math.sqrt(math.fsum((x - mean) ** 2 for x in ordered) / n)
    return {"mean": mean, "std": std, "p50": _quantile(ordered, 0.5), "p90": _quantile(ordered, 0.9),
            "min": ordered[0], "max": ordered[-1]}


def _phase_result(latencies_s: list[float], samples: int, tokens: int | None) -> dict[str, Any]:
    stats = summarize(latencies_s)
    mean = stats["mean"]
    # Throughput of the mean latency (total work / total time), not a mean of per-batch rates,
    # which a few fast batches would inflate.
    return {"latency_s": stats,
            "samples_per_s": samples / mean if mean > 0 else None,
            "tokens_per_s": tokens / mean if tokens is not None and mean > 0 else None,
            "latencies_s": latencies_s}


# --- what a batch is fed to and what backward runs from ------------------------------------
def call_with(module: torch.nn.Module, batch: Any) -> Any:
    """`module(batch)` for a tensor, `module(**batch)` for a dict, `module(*batch)` for a tuple/list."""
    if isinstance(batch, Mapping):
        return module(**batch)
    if isinstance(batch, (tuple, list)):
        return module(*batch)
    return module(batch)


def scalar_loss(output: Any) -> torch.Tensor:
    """What backward runs from: the output's `loss` where it has one (a dict or a model output
    object), else the mean of the first floating tensor in it that requires grad."""
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        return loss if loss.dim() == 0 else loss.mean()
    found = _first_grad_tensor(output)
    if found is None:
        raise ValueError(f"the model's output ({type(output).__name__}) holds no floating tensor that requires "
                         "grad: nothing to run backward from")
    return found.mean()


def _first_grad_tensor(tree: Any) -> torch.Tensor | None:
    if isinstance(tree, torch.Tensor):
        return tree if tree.requires_grad and tree.is_floating_point() else None
    if isinstance(tree, Mapping):
        values: Any = tree.values()
    elif isinstance(tree, (tuple, list)):
        values = tree
    elif hasattr(tree, "to_tuple"):  # a transformers ModelOutput that is not a Mapping
        values = tree.to_tuple()
    else:
        return None
    for value in values:
        found = _first_grad_tensor(value)
        if found is not None:
            return found
    return None


# --- leaving the model as it was found -------------------------------------------------------
@contextlib.contextmanager
def model_untouched(module: torch.nn.Module, device: torch.device) -> Iterator[None]:
    """Inside: the module in train mode with no gradients; after: its modes, gradients, buffers and
    the CPU and `device` RNG states exactly as before."""
    modes = [(m, m.training) for m in module.modules()]
    params = [p for p in module.parameters() if p.requires_grad]
    grads = [p.grad for p in params]
    with torch.no_grad():
        buffers = [(b, b.detach().clone()) for b in module.buffers()]
    devices = [device.index if device.index is not None else _current_index(device)] \
        if device.type not in ("cpu", "meta") else []
    with torch.random.fork_rng(devices=devices, device_type=device.type if devices else "cuda"):
        try:
            for p in params:
                p.grad = None
            module.train()
            yield
        finally:
            for p, grad in zip(params, grads):
                p.grad = grad
            with torch.no_grad():
                for buffer, saved in buffers:
                    buffer.copy_(saved)
            for m, training in modes:
                m.training = training


def _current_index(device: torch.device) -> int:
    backend = getattr(torch, device.type, None)
    current = getattr(backend, "current_device", None)
    return int(current()) if current is not None else 0


# --- the benchmark -------------------------------------------------------------------------------
def measure_latency(module: torch.nn.Module, batches: SyntheticBatches, *, warmup: int = 10, iters: int = 50,
                    device: torch.device | None = None, forward_fn: ForwardFn | None = None,
                    timer: HostTimer | EventTimer | None = None,
                    context: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
                    sync: Callable[[str], None] | None = None,
                    span_attrs: Mapping[str, Any] | None = None,
                    extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Time `iters` batches of each phase after `warmup` untimed ones; the result as a dict.

    `forward_fn(module, batch)` runs the forward (default `call_with`); backward runs from
    `scalar_loss` of what it returns. `context()` is entered around each forward (a framework's
    autocast). `sync("start")` and `sync("end")` are called inside `bench.latency`, before the
    first batch and after the last has been read, `sync("end")` even when the benchmark fails
    (where ranks wait for each other, so the waiting is the benchmark's time and no step's).
    `span_attrs` go on the `bench.latency` span, `extra` into the result as is."""
    if warmup < 0 or iters < 1:
        raise ValueError(f"warmup must be >= 0 and iters >= 1 (got warmup={warmup}, iters={iters})")
    if not any(p.requires_grad for p in module.parameters()):
        raise ValueError("the model has no parameter that requires grad: forward+backward cannot be timed")
    device = device or _module_device(module)
    timer = timer or timer_for(device)
    run = _Run(module, batches, forward_fn or call_with, context or contextlib.nullcontext, timer, device)
    run_attrs = {ATTR_WARMUP: warmup, ATTR_ITERS: iters, ATTR_TIMER: timer.kind,
                 semconv.DEVICE_TYPE: device.type, **run.size_attrs, **(span_attrs or {})}
    started = time.time()
    with outside_training(), model_untouched(module, device), _on(device), torch.enable_grad(), \
            otel_train.span(SPAN_RUN, device_time=False, **run_attrs):
        if sync is not None:
            sync("start")
        try:
            marks = {phase: run.phase(phase, warmup, iters) for phase in PHASES}
            # Read together, the last event last: one synchronisation for the whole benchmark.
            seconds = iter(timer.seconds([pair for pairs in marks.values() for pair in pairs]))
            phases = {phase: _phase_result([next(seconds) for _ in pairs], batches.batch_size, batches.tokens)
                      for phase, pairs in marks.items()}
        finally:
            if sync is not None:
                sync("end")
        otel_train.event(EVENT_RESULT, **{f"{phase}.latency_s.{k}": result["latency_s"][k]
                                          for phase, result in phases.items() for k in ("mean", "std", "p50", "p90")})
    return {
        "schema": SCHEMA,
        "created_unix_s": started,
        "device": str(device),
        "device_name": _device_name(device),
        "timer": timer.kind,
        "dtype": _param_dtype(module),
        "torch": torch.__version__,
        "batch": {"batch_size": batches.batch_size, "seq_len": batches.seq_len, "tokens": batches.tokens,
                  "inputs": batches.inputs},
        "warmup": warmup,
        "iters": iters,
        "phases": phases,
        **(extra or {}),
    }


class _Run:
    """One benchmark's loop: warm-up then timed batches of a phase, a span around each timed one."""

    def __init__(self, module: torch.nn.Module, batches: SyntheticBatches, forward_fn: ForwardFn,
                 context: Callable[[], contextlib.AbstractContextManager[Any]],
                 timer: HostTimer | EventTimer, device: torch.device) -> None:
        self.module, self.batches, self.forward_fn, self.context, self.timer = \
            module, batches, forward_fn, context, timer
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.size_attrs: dict[str, Any] = {ATTR_SAMPLES: batches.batch_size}
        if batches.tokens is not None:
            self.size_attrs[ATTR_TOKENS] = batches.tokens
        # On each timed span too: the exporter takes host time as latency only on the CPU.
        self.timed_attrs = {**self.size_attrs, semconv.DEVICE_TYPE: device.type}

    def phase(self, phase: str, warmup: int, iters: int) -> list[tuple[Any, Any]]:
        """The (start, end) timer marks of the phase's timed batches."""
        backward = phase == FORWARD_BACKWARD
        with otel_train.span(SPAN_WARMUP, device_time=False, **{ATTR_PHASE: phase}):
            for _ in range(warmup):
                self.once(self.batches(), backward)
                self.drop_grads()
        pairs = []
        name, mark = SPAN_PHASE[phase], self.timer.mark
        span_times = getattr(self.timer, "span_times", False)
        for i in range(iters):
            batch = self.batches()
            with otel_train.span(name, device_time=True, **{ATTR_ITERATION: i}, **self.timed_attrs) as live:
                start = mark()
                self.once(batch, backward)
                end = mark()
            if span_times and getattr(live, "rec", None) is not None:
                # The span's own times (the same clock): the table, the trace and the exported
                # `bench.latency` metric then say the same.
                start, end = live.t0, live.t1
            pairs.append((start, end))
            self.drop_grads()
        return pairs

    def once(self, batch: Any, backward: bool) -> None:
        with self.context():
            out = self.forward_fn(self.module, batch)
        if backward:
            scalar_loss(out).backward()

    def drop_grads(self) -> None:
        # As `zero_grad(set_to_none=True)` would, outside the timed region, without calling
        # anything a framework may have hooked.
        for p in self.params:
            p.grad = None


@contextlib.contextmanager
def _on(device: torch.device) -> Iterator[None]:
    """`device` is the current device of its backend inside (so events record on its stream)."""
    backend = getattr(torch, device.type, None)
    switch = getattr(backend, "device", None)
    if device.type in ("cpu", "meta", "mps") or device.index is None or switch is None:
        yield
        return
    with switch(device.index):
        yield


def _module_device(module: torch.nn.Module) -> torch.device:
    for tensor in module.parameters():
        return tensor.device
    return torch.device("cpu")


def _param_dtype(module: torch.nn.Module) -> str | None:
    for p in module.parameters():
        if p.is_floating_point():
            return str(p.dtype).removeprefix("torch.")
    return None


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        import platform
        return platform.processor() or platform.machine()
    return device.type
