"""The package internals the latency benchmark reaches, in one place.

Everything here is private machinery of other parts of the package (detection, device
events, the run's configuration and sinks); the benchmark reaches it only through these
functions, so when those modules move this is the one file to follow them.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any


_aside = 0  # depth of `outside_training` blocks (detection's `paused()` is not reentrant)


@contextlib.contextmanager
def outside_training() -> Iterator[None]:
    """Run the block as a sibling of training steps, unseen by automatic detection.

    Where detection is installed (`import otel_train.auto`, `OtelCallback`): a step whose update
    is complete ends now, as before a checkpoint; the block runs with every hook and patch
    removed, so its forwards and backwards are not phases of a step; the next step then starts
    at the end of the block, so the benchmark's time lands in no step. Nested blocks are one.
    """
    global _aside
    detect = sys.modules.get("otel_train._detect")
    if _aside or detect is None or not detect.installed():
        _aside += 1
        try:
            yield
        finally:
            _aside -= 1
        return
    from otel_train import _recorder
    rec = _recorder.active()
    if rec is not None:
        detect._close_if_complete(rec, detect._s, rec.now())
    _aside += 1
    try:
        with detect.paused():
            yield
    finally:
        _aside -= 1
        state = detect._s
        if rec is not None and _recorder.active() is rec and state.step is None:
            end = rec.now()
            if state.boundary is None or state.boundary < end:
                state.boundary = end


def event_factory(device: Any) -> Callable[[], Any] | None:
    """A factory of timing events on `device` (a torch.device), or None where it has none (cpu)."""
    from otel_train import _device
    found = _device.torch_events(device.type, device.index)
    return None if found is None else found[0]


def seconds_buckets() -> Sequence[float]:
    """The package's histogram bounds in seconds (the same as `train.phase.duration`'s)."""
    from otel_train import _metrics
    return tuple(_metrics.SECONDS_BUCKETS)


def run_meter_provider(scope_file: str) -> tuple[Any, str] | None:
    """An OpenTelemetry SDK MeterProvider exporting where this run's metrics go, and a description
    of where that is; None when otel_train is not running or its metrics exporter is `none`.

    With the embedded default (files), it writes `<run dir>/<scope_file>-rank<R>.jsonl`, beside
    and not into the run's `metrics-rank<R>.jsonl`: that file belongs to the exporter process,
    and two writers could interleave a long line.
    """
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource

    from otel_train import _runtime, _sinks
    state = _runtime.state()
    if state is None or state.closed or state.run is None:
        return None
    cfg, run = state.cfg, state.run
    kind = _sinks.effective_exporter(cfg.metrics_exporter, cfg.metrics_endpoint or cfg.endpoint)
    exporter: Any
    if kind == "file":
        path = _sinks.run_dir(cfg, run) / f"{scope_file}-rank{run.rank}.jsonl"
        exporter, where = _sinks.FileMetricExporter(path), str(path)
    else:
        exporter = _sinks.build_metric_exporter(cfg, run)
        if exporter is None:
            return None
        where = kind if kind == "console" else f"{cfg.metrics_endpoint or cfg.endpoint or 'the default'} (OTLP)"
    # Exported once, at shutdown: the interval only has to be longer than the benchmark.
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    resource = Resource(_runtime.build_resource(cfg, run))
    return MeterProvider(resource=resource, metric_readers=[reader]), where


def shutdown_timeout_s() -> float:
    from otel_train import _runtime
    state = _runtime.state()
    return 5.0 if state is None else float(state.cfg.shutdown_timeout_s)
