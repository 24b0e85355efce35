"""Pipeline metrics: how fast inference actors can produce and the trainer can consume.

From the spans the pipeline already makes (`otel_train.inference`), over the last `WINDOW`
calls or steps, so a change in the pipeline shows within a few dozen steps:

| metric | where | value |
|---|---|---|
| `infer.capacity` | actor | samples per second of `infer.generate` time: what it could produce busy all the time |
| `train.capacity` | trainer | samples per second of step time less `pipeline.dispatch_wait`, the median over the steps: what it could consume never waiting |
| `pipeline.throughput` | trainer | samples per second of step time: what it did consume (realised) |
| `pipeline.pool.size` | trainer | the last `pipeline.pool.size` a dispatch wait carried |

(`infer.batch.duration` and the `pipeline.dispatch_wait` histogram are `metrics.TrainMetrics`'.)
Samples: `infer.samples` (else `infer.batch_size`) of a generate call; a step's are its dispatch
waits' `pipeline.samples`, else its `train.samples`. Summed over actors, `infer.capacity` is
what the pipeline can supply, summed over trainer ranks `train.capacity` what it can take;
`diagnose` prints both beside its pipeline verdict.

`train.capacity` is a median of per-step rates, not a ratio of sums: a warm-up step that waited
seconds for the actors to start, or spent them compiling, is one step of 32, not most of the
window's time (a 15-step Ray run read 29.8 samples/s against ~570 from its steady steps).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.sdk.metrics.export import Gauge, Metric, NumberDataPoint

from otel_train import semconv
from otel_train.analyze.slow import median

#: Generate calls / steps each capacity is computed over.
WINDOW = 32
#: The spans the pipeline reads (the fast path leaves them to the general path, which has their attributes).
PIPELINE_SPANS = frozenset((semconv.SPAN_INFER_GENERATE, semconv.SPAN_DISPATCH_WAIT))


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


class PipelineMetrics:
    """The gauges above, fed by the span assembler; collected with the package's other metrics."""

    def __init__(self, lock: Any = None, time_ns: Callable[[], int] | None = None) -> None:
        import time
        self.lock = lock if lock is not None else threading.RLock()
        self._time_ns = time_ns or time.time_ns
        self.active = False  # a pipeline span was seen: steps are worth accounting
        self._calls: deque[tuple[float, int]] = deque(maxlen=WINDOW)  # (generate s, samples)
        self._steps: deque[tuple[float, float, int]] = deque(maxlen=WINDOW)  # (step s, wait s, samples)
        #: Dispatch waits by the step they ran in, until that step is emitted (steps are held
        #: until the next one arrives, so the next step's waits come first): [wait s, samples].
        self._waits: dict[Any, list[Any]] = {}
        self._values: dict[str, tuple[float, int]] = {}  # metric -> (value, when)

    def span(self, name: str, duration_s: float, attrs: Mapping[str, Any], step: Any = None) -> None:
        """An `infer.generate` or `pipeline.dispatch_wait` span ended (in step `step`)."""
        with self.lock:
            self.active = True
            if name == semconv.SPAN_INFER_GENERATE:
                samples = _count(attrs.get(semconv.INFER_SAMPLES))
                if samples is None:
                    samples = _count(attrs.get(semconv.INFER_BATCH_SIZE))
                if samples is None:
                    return
                self._calls.append((duration_s, samples))
                busy = sum(d for d, _ in self._calls)
                if busy > 0:
                    self._set(semconv.METRIC_INFER_CAPACITY, sum(n for _, n in self._calls) / busy)
                return
            waits = self._waits.get(step)
            if waits is None:
                if len(self._waits) >= WINDOW:  # steps that never came (sampled out of nothing, lost)
                    del self._waits[next(iter(self._waits))]
                waits = self._waits[step] = [0.0, None]
            waits[0] += duration_s
            samples = _count(attrs.get(semconv.PIPELINE_SAMPLES))
            if samples is not None:
                waits[1] = (waits[1] or 0) + samples
            pool = attrs.get(semconv.PIPELINE_POOL_SIZE)
            if isinstance(pool, (int, float)) and not isinstance(pool, bool):
                self._set(semconv.METRIC_POOL_SIZE, float(pool))

    def step(self, step: Any, time_s: float, attrs: Mapping[str, Any] | None) -> None:
        """Trainer step `step` is emitted, with its own time."""
        with self.lock:
            wait, samples = self._waits.pop(step, (0.0, None))
            if samples is None and attrs:
                samples = _count(attrs.get(semconv.TRAIN_SAMPLES))
            if samples is None:
                return
            self._steps.append((time_s, min(wait, time_s), samples))
            total = sum(t for t, _, _ in self._steps)
            consumed = sum(n for _, _, n in self._steps)
            if total > 0:
                self._set(semconv.METRIC_PIPELINE_THROUGHPUT, consumed / total)
            rates = sorted(n / (t - w) for t, w, n in self._steps if t - w > 0)
            if rates:
                self._set(semconv.METRIC_TRAIN_CAPACITY, median(rates))

    def _set(self, name: str, value: float) -> None:
        self._values[name] = (value, self._time_ns())

    def collect(self, now_ns: int) -> list[Metric]:
        """The gauges that have a value (last value per process)."""
        with self.lock:
            values = dict(self._values)
        return [Metric(name, _DESCRIPTIONS[name], _UNITS[name],
                       Gauge([NumberDataPoint({}, at, now_ns, value)]))
                for name, (value, at) in sorted(values.items())]


_DESCRIPTIONS = {
    semconv.METRIC_INFER_CAPACITY: "Samples an inference actor produces per second of generate time",
    semconv.METRIC_TRAIN_CAPACITY: "Samples the trainer consumes per second of step time not spent waiting for them",
    semconv.METRIC_PIPELINE_THROUGHPUT: "Samples the trainer consumed per second of step time (realised)",
    semconv.METRIC_POOL_SIZE: "Samples ready in the trainer's pool at its last dispatch wait",
}
_UNITS = {semconv.METRIC_INFER_CAPACITY: "{sample}/s", semconv.METRIC_TRAIN_CAPACITY: "{sample}/s",
          semconv.METRIC_PIPELINE_THROUGHPUT: "{sample}/s", semconv.METRIC_POOL_SIZE: "{sample}"}
