"""otel_train initialised in-process for a test: a fake clock, an in-memory exporter, metric readers."""

from __future__ import annotations


class Harness:
    """otel_train initialised in-process with a fake clock and an in-memory exporter."""

    def __init__(self, **overrides: object) -> None:
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        import otel_train
        from otel_train.record.clock import FakeClock

        class KeepingReader(InMemoryMetricReader):
            """Keeps what it held at shutdown, so tests can read metrics after `finish()`."""

            final = None

            def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
                self.final = self.get_metrics_data()
                super().shutdown(timeout_millis=timeout_millis, **kwargs)

        self.exporter = InMemorySpanExporter()
        self.metrics = KeepingReader()
        self.clock = FakeClock()
        settings: dict[str, object] = dict(run_id="test-run", traces_exporter="none", metrics_exporter="none",
                                           flush_interval_ms=10**9)
        settings.update(overrides)
        self.run = otel_train.init(span_processors=[SimpleSpanProcessor(self.exporter)],
                                   metric_readers=[self.metrics], clock=self.clock, **settings)

    def finish(self) -> list:
        """Shut down (flushing everything) and return the finished spans in emission order."""
        import otel_train

        otel_train.shutdown(5.0)
        return list(self.exporter.get_finished_spans())

    def metric_points(self, name: str) -> list:
        """Data points of metric `name` as collected at shutdown (call after `finish()`)."""
        data = self.metrics.final
        points = []
        for rm in data.resource_metrics if data else ():
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name == name:
                        points.extend(metric.data.data_points)
        return points


def by_name(spans: list, name: str) -> list:
    return [s for s in spans if s.name == name]
