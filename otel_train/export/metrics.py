"""Metrics derived from the same records as the spans (docs/trace-shape.md, "Metrics").

The span assembler calls `TrainMetrics.observe(span name, duration, attributes)` for every
record, sampled out or not, so metrics always see every step.

Aggregation is our own, not the SDK's instruments: an SDK `Histogram.record` with an attribute
costs about 7 µs here (a measurement object, attribute hashing, a lock per call), a third of
the exporter's whole per-span budget; a bucket increment costs 0.2 µs. What is aggregated is
handed out as the SDK's own `MetricsData` to standard `MetricReader`s — a
`PeriodicExportingMetricReader` around the OTLP or file exporter, plus any reader the user
passes — so exporters, temporality preferences (cumulative or delta, per reader) and the OTLP
encoding are the SDK's. We register with each reader the way the SDK's `MeterProvider` does
(`MetricReader._set_collect_callback`): this package is the readers' provider.
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import reduce
from operator import add
from typing import Any

from opentelemetry.sdk.metrics.export import (AggregationTemporality, Gauge, Histogram, HistogramDataPoint,
                                              Metric, MetricExporter, MetricReader, MetricsData,
                                              NumberDataPoint, PeriodicExportingMetricReader, ResourceMetrics,
                                              ScopeMetrics, Sum)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_train import _compat, semconv
from otel_train.analyze.goodput import PRODUCTIVE
from otel_train.analyze.slow import RULE_TEXT
from otel_train.export.console import ConsoleSummary
from otel_train.export.goodput import RunAccount
from otel_train.export.mfu import Mfu
from otel_train.export.pipeline_metrics import PipelineMetrics

_log = logging.getLogger("otel_train")

#: Bucket bounds in seconds: sub-millisecond phases up to minute-long checkpoints.
SECONDS_BUCKETS: Sequence[float] = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

#: The latency benchmark's timed spans, and the `bench.phase` each one is.
_BENCH_PHASES = {semconv.SPAN_BENCH_FORWARD: "forward", semconv.SPAN_BENCH_FORWARD_BACKWARD: "forward_backward"}

#: Spans whose device time is the device's busy time in a step (collectives run inside them or
#: overlap them: not added again).
_BUSY_SPANS = frozenset({semconv.SPAN_FORWARD, semconv.SPAN_BACKWARD, semconv.SPAN_OPTIMIZER})

_CUMULATIVE = AggregationTemporality.CUMULATIVE
_DELTA = AggregationTemporality.DELTA


class _Window:
    """One reader's view of one histogram series since its start (cumulative) or last collect (delta)."""

    __slots__ = ("counts", "count", "total", "low", "high", "start_ns")

    def __init__(self, buckets: int, start_ns: int) -> None:
        self.counts = [0] * buckets
        self.count = 0
        self.total = 0.0
        self.low = float("inf")
        self.high = float("-inf")
        self.start_ns = start_ns

    def add(self, index: int, value: float) -> None:
        self.counts[index] += 1
        self.count += 1
        self.total += value
        if value < self.low:
            self.low = value
        if value > self.high:
            self.high = value

    def add_all(self, buckets: Mapping[int, int], values: Sequence[float]) -> None:
        """`add` for each of `values` (non-empty), in order: `buckets` counts them per bucket index."""
        counts = self.counts
        for index, count in buckets.items():
            counts[index] += count
        self.count += len(values)
        self.total = reduce(add, values, self.total)  # summed one by one, as `add` does
        low, high = min(values), max(values)
        if low < self.low:
            self.low = low
        if high > self.high:
            self.high = high


class _Histogram:
    """Explicit-bucket histogram; a value equal to a bound counts in the bucket that bound closes."""

    def __init__(self, name: str, description: str, readers: int, start_ns: int) -> None:
        self.name = name
        self.description = description
        self.bounds = tuple(SECONDS_BUCKETS)
        self.readers = readers
        self.start_ns = start_ns
        self.series: dict[Any, tuple[dict[str, Any], list[_Window]]] = {}

    def record(self, value: float, key: Any = None, attrs: Mapping[str, Any] | None = None) -> None:
        index = bisect.bisect_left(self.bounds, value)
        for window in self.windows(key, attrs):
            window.add(index, value)

    def windows(self, key: Any = None, attrs: Mapping[str, Any] | None = None) -> list[_Window]:
        """One series' windows, one per reader (the list is kept; a delta collect replaces its items)."""
        entry = self.series.get(key)
        if entry is None:
            entry = self.series[key] = (dict(attrs or {}), [_Window(len(self.bounds) + 1, self.start_ns)
                                                            for _ in range(self.readers)])
        return entry[1]

    def collect(self, reader: int, delta: bool, now_ns: int) -> Metric | None:
        points = []
        for attrs, windows in self.series.values():
            window = windows[reader]
            if not window.count:
                continue
            points.append(HistogramDataPoint(attributes=attrs, start_time_unix_nano=window.start_ns,
                                             time_unix_nano=now_ns, count=window.count, sum=window.total,
                                             bucket_counts=list(window.counts), explicit_bounds=self.bounds,
                                             min=window.low, max=window.high))
            if delta:
                windows[reader] = _Window(len(self.bounds) + 1, now_ns)
        if not points:
            return None
        temporality = _DELTA if delta else _CUMULATIVE
        return Metric(self.name, self.description, "s", Histogram(points, temporality))


class _LastValue:
    """A gauge: the last value per attribute set (the same for every temporality)."""

    def __init__(self, name: str, unit: str, description: str) -> None:
        self.name, self.unit, self.description = name, unit, description
        self.values: dict[Any, tuple[dict[str, Any], float, int]] = {}

    def set(self, value: float, now_ns: int, key: Any = None, attrs: Mapping[str, Any] | None = None) -> None:
        self.values[key] = (dict(attrs or {}), value, now_ns)

    def collect(self, now_ns: int) -> Metric | None:
        if not self.values:
            return None
        points = [NumberDataPoint(attributes=attrs, start_time_unix_nano=at, time_unix_nano=now_ns, value=value)
                  for attrs, value, at in self.values.values()]
        return Metric(self.name, self.description, self.unit, Gauge(points))


class _Counter:
    """A monotonic sum per attribute set; delta readers get what grew since their last collect."""

    def __init__(self, name: str, unit: str, description: str, readers: int, start_ns: int) -> None:
        self.name, self.unit, self.description = name, unit, description
        self.start_ns = start_ns
        self.totals: dict[Any, tuple[dict[str, Any], int]] = {}
        self.reported: list[dict[Any, tuple[int, int]]] = [{} for _ in range(readers)]

    def set_total(self, total: int, key: Any, attrs: Mapping[str, Any]) -> None:
        self.totals[key] = (dict(attrs), total)

    def collect(self, reader: int, delta: bool, now_ns: int) -> Metric | None:
        points = []
        seen = self.reported[reader]
        for key, (attrs, total) in self.totals.items():
            if delta:
                before, since = seen.get(key, (0, self.start_ns))
                if total == before:
                    continue
                seen[key] = (total, now_ns)
                points.append(NumberDataPoint(attrs, since, now_ns, total - before))
            else:
                points.append(NumberDataPoint(attrs, self.start_ns, now_ns, total))
        if not points:
            return None
        return Metric(self.name, self.description, self.unit, Sum(points, _DELTA if delta else _CUMULATIVE, True))


def _temporality(reader: MetricReader, kind: str) -> AggregationTemporality:
    """The reader's preference for an instrument kind (`Histogram`, `Counter`), as the SDK keeps it."""
    preferences = _compat.reader_temporalities(reader)
    for cls, temporality in preferences.items():
        if cls.__name__.lstrip("_") == kind:
            return temporality
    return _CUMULATIVE


def _periodic_reader(exporter: Any, interval_ms: int) -> PeriodicExportingMetricReader:
    """The SDK's periodic reader; where no thread can start (Python 3.12+ at interpreter exit: the
    fallback a shutdown makes when the exporter process never came up), one without its ticker
    thread, whose last collection `TrainMetrics.shutdown`'s force_flush exports."""
    try:
        return PeriodicExportingMetricReader(exporter, export_interval_millis=interval_ms)
    except RuntimeError as err:
        if "thread" not in str(err):
            raise
        return PeriodicExportingMetricReader(exporter, export_interval_millis=math.inf)


class TrainMetrics:
    """The package's instruments, fed from span records, collected by standard metric readers."""

    def __init__(self, resource: Resource, exporter: MetricExporter | None, interval_ms: int,
                 extra_readers: Sequence[MetricReader] = (), version: str = "",
                 time_ns: Callable[[], int] = time.time_ns, account: RunAccount | None = None,
                 mfu: Mfu | None = None, console_every: int = 0) -> None:
        self.resource = resource
        self.scope = InstrumentationScope(semconv.SCOPE_NAME, version)
        self._time_ns = time_ns
        #: Held while aggregating; reentrant, so a caller may hold it across a batch of records.
        self.lock = threading.RLock()
        # Cumulative points start at otel_train.init (the account's start), not when this process
        # built them: `diagnose` reads the run's start from them, and its goodput window must be
        # the closing line's.
        start = account.start_ns if account is not None else time_ns()
        readers = list(extra_readers)
        count = len(readers) + (exporter is not None)

        def seconds(name: str, description: str) -> _Histogram:
            return _Histogram(name, description, count, start)

        self.step_duration = seconds(semconv.METRIC_STEP_DURATION, "Step time between step boundaries")
        self.phase_duration = seconds(semconv.METRIC_PHASE_DURATION, "Host duration of a step phase")
        self.device_duration = seconds(semconv.METRIC_DEVICE_DURATION, "Device duration of a step phase")
        self.gc_pause = seconds(semconv.METRIC_GC_PAUSE, "Python garbage-collection pause")
        self.infer_batch = seconds(semconv.METRIC_INFER_BATCH_DURATION, "One inference generate call")
        self.dispatch_wait = seconds(semconv.METRIC_DISPATCH_WAIT, "Trainer waiting for samples")
        self.bench_latency = seconds(semconv.METRIC_BENCH_LATENCY, "Latency of one synthetic batch "
                                                                   "(otel-train bench latency)")
        self._histograms = (self.step_duration, self.phase_duration, self.device_duration, self.gc_pause,
                            self.infer_batch, self.dispatch_wait, self.bench_latency)
        self._by_span = {semconv.SPAN_GC: self.gc_pause, semconv.SPAN_INFER_GENERATE: self.infer_batch,
                         semconv.SPAN_DISPATCH_WAIT: self.dispatch_wait}
        self._phases = frozenset(semconv.PHASE_SPANS)
        self.tokens_per_s = _LastValue(semconv.METRIC_THROUGHPUT_TOKENS, "{token}/s", "Tokens per second of step time")
        self.samples_per_s = _LastValue(semconv.METRIC_THROUGHPUT_SAMPLES, "{sample}/s",
                                        "Samples per second of step time")
        self.bench_tokens = _LastValue(semconv.METRIC_BENCH_TOKENS, "{token}/s",
                                       "Benchmark tokens per batch / mean latency")
        self.bench_samples = _LastValue(semconv.METRIC_BENCH_SAMPLES, "{sample}/s",
                                        "Benchmark samples per batch / mean latency")
        self._bench_sums: dict[tuple[str, str], list[float]] = {}  # (phase, device) -> latency, samples, tokens
        #: The run's goodput and slow steps (`goodput.RunAccount`), read at each collection.
        self.account = account
        self.goodput = _LastValue(semconv.METRIC_GOODPUT, "1", "Productive share of the wall time since init")
        self.goodput_time = _LastValue(semconv.METRIC_GOODPUT_TIME, "s",
                                       "Wall time since init by goodput category (they add up to it)")
        self.slow_steps = _Counter(semconv.METRIC_SLOW_STEPS, "{step}",
                                   f"Steps {RULE_TEXT} (tagged slow)", count, start)
        #: Model FLOPs utilisation (`mfu.Mfu`: FLOPs per step, parameters, the device's peak).
        self.mfu = mfu or Mfu()
        self.mfu_ratio = _LastValue(semconv.METRIC_MFU, "1", "FLOPs of the step / step time / peak FLOP/s")
        self.memory = [_LastValue(name, "By", description) for name, description in (
            (semconv.METRIC_MEMORY_ALLOCATED, "Device memory held by tensors (the caching allocator's count)"),
            (semconv.METRIC_MEMORY_RESERVED, "Device memory the caching allocator holds"),
            (semconv.METRIC_MEMORY_PEAK, "Most device memory ever held by tensors (the allocator's peak)"))]
        self._memory = {gauge.name: gauge for gauge in self.memory}
        self.device_busy_s = 0.0  # device time of forward, backward and optimizer spans (console)
        self.console = ConsoleSummary(console_every, self._console_totals) if console_every > 0 else None
        self.dropped = _Counter(semconv.METRIC_SPANS_DROPPED, "{span}", "Records otel_train had to drop",
                                count, start)
        #: infer.capacity, train.capacity, pipeline.throughput, pipeline.pool.size (`pipeline_metrics`).
        self.pipeline = PipelineMetrics(self.lock, time_ns)
        # Registered last: a reader may collect (on its own thread) as soon as it has a callback.
        if exporter is not None:
            readers.append(_periodic_reader(exporter, interval_ms))
        self.readers = readers
        for index, reader in enumerate(readers):
            _compat.set_collect_callback(reader, self._collector(index))

    def observe_step(self, duration_s: float, attrs: Mapping[str, Any], step_n: int | None = None) -> None:
        """A step span's own time and attributes (`observe` for `train.step`); `step_n` where
        `attrs` lacks `train.step` (a lean step's wire attributes)."""
        with self.lock:
            self.step_duration.record(duration_s)
            if duration_s > 0 and (semconv.TRAIN_TOKENS in attrs or semconv.TRAIN_SAMPLES in attrs):
                for key, gauge in ((semconv.TRAIN_TOKENS, self.tokens_per_s),
                                   (semconv.TRAIN_SAMPLES, self.samples_per_s)):
                    count = attrs.get(key)
                    if isinstance(count, (int, float)) and not isinstance(count, bool):
                        gauge.set(count / duration_s, self._time_ns())
            self._observe_device(semconv.SPAN_STEP, attrs)
            self._step_done(attrs.get(semconv.TRAIN_STEP, step_n), duration_s, attrs)

    def observe_step_time(self, duration_s: float, step_n: int | None = None) -> None:
        """A step span's own time alone: `observe_step` for a step with no throughput or device attribute."""
        with self.lock:
            self.step_duration.record(duration_s)
            self._step_done(step_n, duration_s, None)

    def _step_done(self, step_n: Any, duration_s: float, attrs: Mapping[str, Any] | None) -> None:
        """What every step feeds besides its histogram: `train.mfu` and the console line (under `lock`)."""
        flops = self.mfu.flops(attrs)
        mfu = self.mfu.of(flops, duration_s)
        if mfu is not None:
            self.mfu_ratio.set(mfu, self._time_ns())
        if self.console is not None:
            tokens = attrs.get(semconv.TRAIN_TOKENS) if attrs else None
            self.console.step(step_n if isinstance(step_n, int) else None, duration_s,
                              float(tokens) if isinstance(tokens, (int, float)) else None, flops, self.mfu.peak)

    def sample(self, values: Mapping[str, Any], wall_ns: int) -> None:
        """A reading the worker took in the training process (`samples.Sampler`)."""
        with self.lock:
            for name, value in values.items():
                gauge = self._memory.get(name)
                if gauge is not None and isinstance(value, int):
                    gauge.set(float(value), wall_ns)
            name = values.get(semconv.WIRE_SAMPLE_DEVICE_NAME)
            if isinstance(name, str):
                self.mfu.device(name)
            params = values.get(semconv.WIRE_SAMPLE_PARAMETERS)
            if isinstance(params, int) and params > 0:
                self.mfu.parameters = params

    def _console_totals(self) -> tuple[float, float, int]:
        """The run's data wait (s), device busy (s) and dropped records so far (under `lock`)."""
        data = self.account.data_ns / 1e9 if self.account is not None else 0.0
        return data, self.device_busy_s, sum(total for _, total in self.dropped.totals.values())

    def observe(self, name: str, duration_s: float, attrs: Mapping[str, Any]) -> None:
        if name == semconv.SPAN_STEP:
            self.observe_step(duration_s, attrs)
            return
        with self.lock:
            if name in self._phases:
                self.phase_duration.record(duration_s, name, {semconv.METRIC_ATTR_PHASE: name})
            elif name in _BENCH_PHASES:
                self._observe_bench(_BENCH_PHASES[name], duration_s, attrs)
                return
            else:
                histogram = self._by_span.get(name)
                if histogram is not None:
                    histogram.record(duration_s)
            self._observe_device(name, attrs)

    def _observe_bench(self, phase: str, host_s: float, attrs: Mapping[str, Any]) -> None:
        """A latency benchmark's timed batch (under `lock`). Its latency is device time where the
        span has it; host time only on the CPU (on an accelerator that is dispatch time)."""
        device = attrs.get(semconv.DEVICE_TYPE, "cpu")
        latency = attrs.get(semconv.DEVICE_DURATION_S)
        if not isinstance(latency, float):
            if device != "cpu":
                return  # device timing is off: the table and JSON have the device-timed numbers
            latency = host_s
        key = (phase, str(device))
        labels = {semconv.BENCH_PHASE: phase, semconv.DEVICE_TYPE: key[1]}
        self.bench_latency.record(latency, key, labels)
        sums = self._bench_sums.setdefault(key, [0.0, 0.0, 0.0])
        sums[0] += latency
        now = self._time_ns()
        # Throughput of the mean latency (total work / total time), as the benchmark's table says.
        for index, attr, gauge in ((1, semconv.BENCH_SAMPLES, self.bench_samples),
                                   (2, semconv.BENCH_TOKENS, self.bench_tokens)):
            count = attrs.get(attr)
            if isinstance(count, int) and not isinstance(count, bool):
                sums[index] += count
                if sums[0] > 0:
                    gauge.set(sums[index] / sums[0], now, key, labels)

    def _observe_device(self, name: str, attrs: Mapping[str, Any]) -> None:
        """The span's device duration, if it has one (under `lock`)."""
        device_s = attrs.get(semconv.DEVICE_DURATION_S)
        if isinstance(device_s, float):
            if name in _BUSY_SPANS:
                self.device_busy_s += device_s
            self.device_duration.record(device_s, name, {semconv.METRIC_ATTR_PHASE: name})

    def span_windows(self, name: str) -> tuple[Sequence[float], list[_Window]]:
        """Bucket bounds and windows that `observe(name, ...)` adds a region's host duration to,
        for a caller that adds to them itself while holding `lock` (the span assembler's fast
        path); no windows for a name that has no histogram."""
        if name in self._phases:
            histogram = self.phase_duration
            return histogram.bounds, histogram.windows(name, {semconv.METRIC_ATTR_PHASE: name})
        histogram = self._by_span.get(name)
        if histogram is None:
            return (), []
        return histogram.bounds, histogram.windows()

    def set_dropped(self, totals: Mapping[str, int]) -> None:
        """The cumulative count of dropped records per reason."""
        with self.lock:
            for reason, total in totals.items():
                if total > 0:
                    self.dropped.set_total(total, reason, {semconv.METRIC_ATTR_REASON: reason})

    def collect(self, reader: int, delta_histograms: bool = False, delta_counters: bool = False) -> MetricsData:
        """Everything aggregated, as reader number `reader` sees it."""
        with self.lock:
            now = self._time_ns()
            metrics = [h.collect(reader, delta_histograms, now) for h in self._histograms]
            metrics += [g.collect(now) for g in (self.tokens_per_s, self.samples_per_s, self.bench_tokens,
                                                 self.bench_samples, self.mfu_ratio, *self.memory)]
            metrics.append(self.dropped.collect(reader, delta_counters, now))
            if self.account is not None and self.account.steps:
                self._account_metrics(now)
                metrics += [g.collect(now) for g in (self.goodput, self.goodput_time)]
                metrics.append(self.slow_steps.collect(reader, delta_counters, now))
            metrics += self.pipeline.collect(now)
        scope = ScopeMetrics(self.scope, [m for m in metrics if m is not None], "")
        return MetricsData([ResourceMetrics(self.resource, [scope], "")])

    def _account_metrics(self, now: int) -> None:
        """`train.goodput`, `train.goodput.time` and `train.steps.slow` from the account (under `lock`)."""
        account = self.account
        assert account is not None
        totals = account.snapshot()
        wall = sum(totals.values())
        self.goodput.set(totals[PRODUCTIVE] / wall if wall else 0.0, now)
        for category, ns in totals.items():
            self.goodput_time.set(ns / 1e9, now, category, {semconv.METRIC_ATTR_CATEGORY: category})
        self.slow_steps.set_total(account.slow_steps, None, {})

    def shutdown(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for reader in self.readers:
            millis = max(1, int((deadline - time.monotonic()) * 1000))
            for call in (reader.force_flush, reader.shutdown):
                try:
                    call(timeout_millis=millis)
                except Exception as err:  # noqa: BLE001 - a reader or its exporter may raise anything
                    _log.warning("otel_train: metric reader %s failed: %s", type(reader).__name__, err)

    def _collector(self, index: int) -> Callable[..., MetricsData]:
        def collect(reader: MetricReader, timeout_millis: float = 10_000, **_: Any) -> MetricsData:
            return self.collect(index, _temporality(reader, "Histogram") == _DELTA,
                                _temporality(reader, "Counter") == _DELTA)
        return collect
