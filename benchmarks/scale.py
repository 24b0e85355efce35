"""`otel-train bench scale`: what one training step costs to export at 1,024 and 10,240 ranks.

No cluster needed: each simulated rank is the real exporter path with that rank's identity
(`RunInfo` rank, world size, node), its own resource (the SDK's detectors, as a rank's
process has), one step's hot-path records (the shape below) fed to the span assembler
(`SpanAssembler.feed_raw`: fast path, rank and step sampling), encoded
as OTLP requests (`LeanEncoder.batches`) and sent by the package's OTLP/gRPC exporter to a
receiver: a local one this command starts (`receiver.py`, a separate process), or `--endpoint`.

Per setting, `OTEL_TRAIN_RANKS` or `OTEL_TRAIN_RANKS/OTEL_TRAIN_STEP_SPANS` (`sample:64/all`;
`OTEL_TRAIN_STEP_SPANS` is `auto` when not given), it reports, for the step's trace (every rank's spans of one
step share it): spans, bytes (the OTLP requests that carry it: each rank's resource and its
spans, what a backend ingests for the trace), requests, and the exporters' CPU summed over
ranks and per rank (assembly, encoding and the export call, and of that the building: assembly
and encoding; a process's one-time set-up is not counted). A real rank exports every flush
interval (2 s), several steps a request, so its export call costs less a step than here. Limits it is judged against: Tempo refuses a trace over 5 MB by default
(`max_bytes_per_trace`), Jaeger's UI slows past a few thousand spans a trace.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from otel_train import semconv

TEMPO_TRACE_LIMIT = 5_000_000
JAEGER_COMFORT_SPANS = 3_000
RANKS_PER_NODE = 8


@dataclass
class Shape:
    """One rank's step: `micro_batches` x (data, forward, backward), one optimizer update and
    `collectives` collectives (gradient buckets), plus the `train.step` span."""

    micro_batches: int = 2
    collectives: int = 8

    @property
    def spans(self) -> int:
        return 1 + 3 * self.micro_batches + 1 + self.collectives


@dataclass
class Result:
    ranks: int
    setting: str
    spans_per_trace: int
    bytes_per_trace: int
    requests: int
    cpu_s: float  # summed over ranks
    cpu_us_per_rank: float
    build_us_per_rank: float  # of which span assembly and encoding (the rest: the export call)
    received: int | None  # spans the local receiver counted (None with --endpoint)
    ranks_with_phases: int

    @property
    def within_limits(self) -> bool:
        return self.bytes_per_trace <= TEMPO_TRACE_LIMIT and self.spans_per_trace <= JAEGER_COMFORT_SPANS


def step_records(shape: Shape, step: int) -> list[Any]:
    """The hot-path tuples of one step of `shape`, recorded by a private recorder."""
    from otel_train.record import recorder as _recorder
    from otel_train.record.clock import SystemClock

    recorder = _recorder.Recorder(shape.spans * 4, SystemClock())
    previous = _recorder.active()
    _recorder.install(recorder)
    try:
        with _recorder.Step(step, None):
            for mb in range(shape.micro_batches):
                for name in (semconv.SPAN_DATA, semconv.SPAN_FORWARD, semconv.SPAN_BACKWARD):
                    with _recorder.Region(name, **{semconv.TRAIN_MICRO_BATCH: mb}):
                        pass
            with _recorder.Region(semconv.SPAN_OPTIMIZER):
                pass
            for _ in range(shape.collectives):
                with _recorder.Region(semconv.SPAN_COLLECTIVE, **{semconv.COMM_OP: "all_reduce",
                                                                  semconv.COMM_BYTES: 25 << 20}):
                    pass
    finally:
        _recorder.install(previous)
    return list(recorder.buf)


def run_id(world: int, setting: str) -> str:
    """The simulated run's id: its world size and setting, in the characters a run id allows."""
    return f"bench-scale-{world}-" + re.sub(r"[^A-Za-z0-9._-]", "_", setting)


def simulate(world: int, setting: str, shape: Shape, exporter: Any, step: int = 1) -> Result:
    """One step of `world` ranks under `setting` (`RANKS[/STEP_SPANS]`) through the exporter path."""
    from opentelemetry.sdk.resources import Resource

    from otel_train._config import Config
    from otel_train._distributed import RunInfo
    from otel_train import _resource
    from otel_train.export.attributes import AttributeCleaner
    from otel_train.export.metrics import TrainMetrics
    from otel_train.export.otlp import LeanEncoder
    from otel_train.export.pipeline import _MAX_REQUEST_BYTES
    from otel_train.export.spans import SpanAssembler
    from otel_train.record.clock import SystemClock, wall_offset
    from otel_train.wire.ids import new_salt

    ranks, _, step_spans = setting.partition("/")
    cfg = Config.resolve({"ranks": ranks, "step_spans": step_spans or "auto", "run_id": run_id(world, setting)}, {})
    records = step_records(shape, step)
    offset = wall_offset(SystemClock())
    spans = size = requests = with_phases = 0
    cpu = build = 0
    for rank in range(world):
        run = RunInfo(cfg.run_id or "", rank=rank, local_rank=rank % RANKS_PER_NODE, world_size=world,
                      node_rank=rank // RANKS_PER_NODE)
        attributes = _resource.build(cfg, run)
        resource = Resource(attributes)
        encoder = LeanEncoder(attributes, semconv.SCOPE_NAME, "bench")
        out: list[Any] = []
        assembler = SpanAssembler(run, new_salt(), resource, AttributeCleaner(cfg.attribute_value_limit), out.extend,
                                  cfg.step_sample, TrainMetrics(resource, None, 60_000), "bench", encoder,
                                  ranks=cfg.ranks, step_spans=cfg.step_spans)
        t0 = time.process_time_ns()
        assembler.feed_raw(records, offset)
        assembler.flush()
        batches = encoder.batches(out, cfg.export_batch_size, _MAX_REQUEST_BYTES)
        t1 = time.process_time_ns()
        for batch in batches:
            exporter.send(batch.payload, 10.0)
        t2 = time.process_time_ns()
        cpu += t2 - t0
        build += t1 - t0
        spans += len(out)
        size += sum(len(b.payload) for b in batches)
        requests += len(batches)
        with_phases += len(out) > 1
    return Result(world, setting, spans, size, requests, cpu / 1e9, cpu / 1e3 / world, build / 1e3 / world, None,
                  with_phases)


def _exporter(endpoint: str) -> Any:
    """The package's OTLP/gRPC transport to `endpoint` (`export/transport.py`)."""
    from otel_train._config import Config
    from otel_train._distributed import RunInfo
    from otel_train.export.destination import resolve
    from otel_train.export.exporters import build_transport

    traces, _ = resolve(Config.resolve({"endpoint": endpoint, "protocol": "grpc"}, {}), RunInfo("bench"))
    return build_transport(traces)


def run_scale(ranks: Sequence[int], settings: Sequence[str], shape: Shape, endpoint: str | None = None,
              as_json: bool = False) -> list[Result]:
    """Every (ranks, setting) pair, printed as a table (or JSON lines)."""
    from otel_train.bench.harness import Receiver

    receiver = Receiver() if endpoint is None else None
    exporter = _exporter(endpoint or receiver.endpoint)  # type: ignore[union-attr]
    results = []
    if not as_json:
        print(f"one step through the exporter path (span assembly, OTLP encoding, gRPC export) to "
              f"{endpoint or 'a local receiver'}; each rank's step: 1 train.step + {shape.micro_batches} micro-batches "
              f"x (data, forward, backward) + optimizer + {shape.collectives} collectives = {shape.spans} spans")
        print(f"{'ranks':>6}  {'RANKS/STEP_SPANS':<16} {'spans/trace':>11} {'bytes/trace':>11} {'requests':>8} "
              f"{'CPU, all ranks':>14} {'CPU/rank':>9} {'(building)':>10}  within Tempo 5 MB and ~3k spans")
    try:
        for world in ranks:
            for setting in settings:
                before = receiver.spans() if receiver is not None else 0
                result = simulate(world, setting, shape, exporter)
                if receiver is not None:
                    result.received = receiver.spans() - before
                results.append(result)
                if as_json:
                    print(json.dumps({**asdict(result), "within_limits": result.within_limits}), flush=True)
                else:
                    print(f"{world:>6}  {setting:<16} {result.spans_per_trace:>11,} {_mb(result.bytes_per_trace):>11} "
                          f"{result.requests:>8,} {result.cpu_s:>12.2f} s {result.cpu_us_per_rank:>6.0f} us "
                          f"{result.build_us_per_rank:>7.0f} us  "
                          f"{'yes' if result.within_limits else 'no'}", flush=True)
    finally:
        exporter.close()
        if receiver is not None:
            receiver.close()
    return results


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"


def main(argv: list[str] | None = None) -> int:
    """`python -m benchmarks.scale [--ranks N,N] [--settings S,S] [--json]`."""
    import argparse

    from otel_train.wire.sampling import STEP_SPANS, parse_ranks

    scale = argparse.ArgumentParser(prog="python -m benchmarks.scale",
                                    description="one step's spans at 1k and 10k simulated ranks, with rank sampling")
    scale.add_argument("--ranks", default="1024,10240",
                       help="comma-separated simulated world sizes (default 1024,10240)")
    scale.add_argument("--settings", default="all,first-per-node,sample:16,sample:64,sample:64/all",
                       help="comma-separated settings to compare, each OTEL_TRAIN_RANKS or "
                            "OTEL_TRAIN_RANKS/OTEL_TRAIN_STEP_SPANS (default all,first-per-node,sample:16,"
                            "sample:64,sample:64/all; first-per-node assumes 8 ranks a node)")
    scale.add_argument("--micro-batches", type=int, default=2, help="micro-batches a step (default 2)")
    scale.add_argument("--collectives", type=int, default=8, help="collectives a step (default 8)")
    scale.add_argument("--endpoint", default=None,
                       help="an OTLP/gRPC receiver to send to (default: a local one this command starts)")
    scale.add_argument("--json", action="store_true", help="one JSON object per line")
    args = scale.parse_args(argv)
    try:
        ranks = [int(x) for x in args.ranks.split(",")]
        settings = []
        for item in args.settings.split(","):
            choice, slash, spans = item.partition("/")
            if slash and spans not in STEP_SPANS:
                raise ValueError(f"OTEL_TRAIN_STEP_SPANS is one of {', '.join(STEP_SPANS)}")
            settings.append(parse_ranks(choice) + slash + spans)
    except ValueError as err:
        scale.error(f"--ranks takes positive integers, --settings OTEL_TRAIN_RANKS[/OTEL_TRAIN_STEP_SPANS] "
                    f"values ({err})")
    if min(ranks) < 1 or args.micro_batches < 0 or args.collectives < 0:
        scale.error("--ranks must be positive, --micro-batches and --collectives at least 0")
    run_scale(ranks, settings, Shape(args.micro_batches, args.collectives), args.endpoint, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
