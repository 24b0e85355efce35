"""The export pipeline in isolation: CPU per span of each stage between the buffer and the wire."""

from __future__ import annotations

import time
from typing import Any

from otel_train import semconv
from otel_train.bench.workload import CLIP_SPAN, PHASE_ATTR


def _small_step_records(steps: int) -> list[Any]:
    """The hot-path tuples of `steps` small-benchmark steps (9 regions each), recorded by a
    private recorder with empty region bodies."""
    from otel_train.record import recorder as _recorder
    from otel_train.record.clock import SystemClock

    recorder = _recorder.Recorder(steps * 16, SystemClock())
    previous = _recorder.active()
    _recorder.install(recorder)
    try:
        for n in range(steps):
            with _recorder.Step(n, None):
                for mb in range(2):
                    for name in (semconv.SPAN_DATA, semconv.SPAN_FORWARD, semconv.SPAN_BACKWARD):
                        with _recorder.Region(name, **{PHASE_ATTR: mb}):
                            pass
                with _recorder.Region(semconv.SPAN_OPTIMIZER):
                    with _recorder.Region(CLIP_SPAN):
                        pass
    finally:
        _recorder.install(previous)
    return list(recorder.buf)


def bench_export_cpu(steps: int, rounds: int) -> dict[str, float]:
    """CPU per span of each stage between the buffer and the wire, measured alone (best of
    `rounds`): the worker's pickling, in the training process, and in the exporter process the
    unpickling, span assembly with metrics, and OTLP encoding, on the fast path and on the
    general path (what a record with an exception, an event or device time takes,
    and what every record took before the fast path); then the embedded default's JSON line
    (`export_json_line_us_per_span`, protobuf's `json_format`). Inside a
    real run the exporter shares cores with training and pays about twice this
    (`exporter_cpu_us_per_step*`)."""
    import gc

    from otel_train.record.clock import SystemClock, wall_offset

    records = _small_step_records(steps)
    offset = wall_offset(SystemClock())
    # As in the exporter process (`gc.freeze()` after its setup): this process's heap (models,
    # the SDK) is not what a collection triggered here would have to scan there.
    gc.collect()
    gc.freeze()
    try:
        return _export_cpu(records, offset, rounds)
    finally:
        gc.unfreeze()


def _export_cpu(records: list[Any], offset: int, rounds: int) -> dict[str, float]:
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.resources import Resource

    from otel_train._distributed import RunInfo
    from otel_train.export.attributes import AttributeCleaner
    from otel_train.export.goodput import RunAccount
    from otel_train.export.metrics import TrainMetrics
    from otel_train.export.otlp import LeanEncoder
    from otel_train.export.pipe import dumps, loads
    from otel_train.export.spans import SpanAssembler
    from otel_train.export.otlp_json import trace_request_line
    from otel_train.export.worker import _SLICE

    resource = {"service.name": "bench", "ml.run.id": "bench", "ml.rank": 0}
    cpu = time.process_time_ns
    best: dict[str, float] = {}

    def keep(name: str, ns: int, count: int) -> None:
        best[name] = min(best.get(name, float("inf")), ns / count / 1e3)

    for _ in range(rounds):
        t0 = cpu()
        payloads = [dumps(("batch", [(False, records[i:i + _SLICE])], offset, {}))
                    for i in range(0, len(records), _SLICE)]
        keep("export_pickle_us_per_span", cpu() - t0, len(records))
        for label, fast in (("fast", True), ("general", False)):
            encoder = LeanEncoder(resource, semconv.SCOPE_NAME, "bench")
            account = RunAccount(0)  # goodput and slow steps, as `ExportPipeline` runs them
            metrics = TrainMetrics(Resource(resource), None, 60_000, [InMemoryMetricReader()], account=account)
            out: list[Any] = []
            assembler = SpanAssembler(RunInfo(run_id="bench"), 1, Resource(resource), AttributeCleaner(2048),
                                      out.extend, metrics=metrics, encoder=encoder, account=account)
            assembler.fast = fast
            t0 = cpu()
            messages = [loads(payload) for payload in payloads]
            t1 = cpu()
            for message in messages:
                assembler.feed_raw(message[1][0][1], offset)
            assembler.flush()
            t2 = cpu()
            batches = encoder.batches(out, 2048, 1 << 20)
            t3 = cpu()
            keep("export_unpickle_us_per_span", t1 - t0, len(records))
            keep(f"export_assemble_us_per_span_{label}", t2 - t1, len(records))
            keep(f"export_encode_us_per_span_{label}", t3 - t2, len(records))
            keep(f"export_total_us_per_span_{label}", t3 - t0, len(records))
        # The embedded default's extra stage: the encoded requests as OTLP JSON lines.
        t0 = cpu()
        for batch in batches:
            trace_request_line(batch.payload)
        keep("export_json_line_us_per_span", cpu() - t0, len(records))
    return best


def main(argv: list[str] | None = None) -> int:
    """`python -m benchmarks.export_cpu [--steps N] [--rounds N]`: one `name: value` line a figure."""
    import argparse

    from otel_train.bench.harness import print_figure

    parser = argparse.ArgumentParser(prog="python -m benchmarks.export_cpu",
                                     description="the export pipeline's CPU per span, stage by stage, measured alone")
    parser.add_argument("--steps", type=int, default=2000, help="small-benchmark steps of records (default 2000)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, the best of which is kept (default 5)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.rounds < 1:
        parser.error("--steps and --rounds must be positive integers")
    for name, value in bench_export_cpu(args.steps, args.rounds).items():
        print_figure(name, value)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
