"""What becomes of a latency result (`latency.measure_latency`): a table, a JSON file, metrics.

Metrics go through the OpenTelemetry metrics API, not the package's own metrics path (that
one aggregates span records by name in the exporter and knows no benchmark). The meter is
`otel_train.bench`, taken from the global MeterProvider when an SDK one is installed (the
application's own, or `opentelemetry-instrument`'s); otherwise from a provider of our own that
exports once, where this run's metrics go (the OTLP endpoint, or with the embedded default
`<run dir>/metrics-bench-rank<R>.jsonl`), with the run's resource (`ml.run.id`, `ml.rank`, ...):

| metric | kind, unit | attributes |
|---|---|---|
| `bench.latency` | histogram, s (one point per timed batch) | `bench.phase`, `device.type` |
| `bench.throughput.tokens` | gauge, {token}/s (tokens per batch / mean latency) | `bench.phase`, `device.type` |
| `bench.throughput.samples` | gauge, {sample}/s | `bench.phase`, `device.type` |
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from otel_train import semconv
from otel_train.bench import _latency_internals as _internals
from otel_train.bench.latency import ATTR_PHASE, PHASES

METER_NAME = "otel_train.bench"
METRIC_LATENCY = semconv.METRIC_BENCH_LATENCY
METRIC_TOKENS = semconv.METRIC_BENCH_TOKENS
METRIC_SAMPLES = semconv.METRIC_BENCH_SAMPLES
_LABELS = {"forward": "forward", "forward_backward": "forward+backward"}


def format_table(result: Mapping[str, Any], name: str | None = None) -> str:
    """The result as a plain-text table (milliseconds; throughput of the mean latency); `name`
    says what was measured."""
    batch = result["batch"]
    size = f"batch {batch['batch_size']}"
    if batch.get("seq_len") is not None:
        size += f" x {batch['seq_len']} tokens"
    timer = "device events" if result["timer"] == "device_events" else "host perf_counter"
    lines = [
        f"Latency{' of ' + name if name else ''} on synthetic batches ({result['device']}, {result.get('dtype')}, "
        f"{timer})",
        f"{size}; {result['warmup']} warm-up + {result['iters']} timed batches per phase",
        "",
    ]
    header = ("phase", "mean ± std (ms)", "p50 (ms)", "p90 (ms)", "tokens/s", "samples/s")
    rows = [header]
    for phase in PHASES:
        if phase not in result["phases"]:
            continue
        res = result["phases"][phase]
        lat = res["latency_s"]
        rows.append((_LABELS[phase], f"{lat['mean'] * 1e3:.3f} ± {lat['std'] * 1e3:.3f}", f"{lat['p50'] * 1e3:.3f}",
                     f"{lat['p90'] * 1e3:.3f}", _rate(res.get("tokens_per_s")), _rate(res.get("samples_per_s"))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for n, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [cell.rjust(width) for cell, width in zip(row[1:], widths[1:])]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def write_json(result: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write `result` (indented) to `path`, creating its folder; returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    tmp.replace(out)  # whole or absent: a reader never sees half a file
    return out


def record_metrics(result: Mapping[str, Any], meter_provider: Any = None) -> str:
    """Record the result's metrics; returns where they went, in words.

    `meter_provider`: record there (nothing is shut down); else as the module docstring says."""
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider

    owned = None
    where = "the MeterProvider passed in"
    if meter_provider is None:
        current = metrics.get_meter_provider()
        if isinstance(current, MeterProvider):
            meter_provider, where = current, "the global OpenTelemetry MeterProvider"
        else:
            found = _internals.run_meter_provider("metrics-bench")
            if found is None:
                return "not exported (otel_train is disabled or its metrics exporter is none)"
            owned, where = found
            meter_provider = owned
    meter = meter_provider.get_meter(METER_NAME)
    latency = meter.create_histogram(METRIC_LATENCY, unit="s", description="Latency of one synthetic batch",
                                     explicit_bucket_boundaries_advisory=list(_internals.seconds_buckets()))
    tokens = meter.create_gauge(METRIC_TOKENS, unit="{token}/s", description="Tokens per batch / mean latency")
    samples = meter.create_gauge(METRIC_SAMPLES, unit="{sample}/s", description="Samples per batch / mean latency")
    device_type = str(result["device"]).split(":")[0]
    for phase, res in result["phases"].items():
        attrs = {ATTR_PHASE: phase, semconv.DEVICE_TYPE: device_type}
        for value in res["latencies_s"]:
            latency.record(value, attrs)
        if res.get("tokens_per_s") is not None:
            tokens.set(res["tokens_per_s"], attrs)
        if res.get("samples_per_s") is not None:
            samples.set(res["samples_per_s"], attrs)
    if owned is not None:
        # The one export: at shutdown the reader collects and exports what was recorded.
        owned.shutdown(timeout_millis=max(1, int(_internals.shutdown_timeout_s() * 1000)))
    return where
