"""What the benchmarks share: the live receiver, init per export mode, output lines, a step
written as a user's script."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any


class Receiver:
    """The live OTLP receiver (`receiver`) in its own process, standing in for a collector."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "otel_train.bench.receiver"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline())  # type: ignore[union-attr]
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def spans(self) -> int:
        self.proc.stdin.write("count\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        return int(self.proc.stdout.readline())  # type: ignore[union-attr]

    def close(self) -> None:
        self.proc.stdin.close()  # type: ignore[union-attr]
        self.proc.wait(timeout=10)


def as_script(source: str, name: str, **names: Any) -> dict[str, Any]:
    """`source` run as the code of a user's script named `name` (its globals: `names`): the
    functions it defines. Automatic detection reads a script's call sites (where `zero_grad()`
    stands against the update: `detect/sites.py`) and skips frames of otel_train's own modules,
    so a step written in a module of ours would take a path no user's does."""
    namespace: dict[str, Any] = {"__name__": name, **names}
    exec(compile(source, f"<otel-train bench: {name}>", "exec"), namespace)  # noqa: S102 - our own constants
    return namespace


def print_figure(name: str, value: float | int | str) -> None:
    if isinstance(value, float):
        value = f"{value:.3f}" if abs(value) < 1000 else f"{value:.0f}"
    print(f"{name}: {value}", flush=True)


def print_ci(name: str, ci: tuple[float, float]) -> None:
    print_figure(f"{name}_ci95_lo", ci[0])
    print_figure(f"{name}_ci95_hi", ci[1])


def sdk_tracer(endpoint: str) -> tuple[Any, Any]:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "otel-train-bench-sdk"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True)))
    return provider, provider.get_tracer("bench")


def init_mode(receiver: Receiver, mode: str, **overrides: Any) -> None:
    """`otel_train.init` for one export mode of the benchmark (process, idle or thread),
    exporting to `receiver` over gRPC; `overrides` on top."""
    import otel_train

    otel_train.init(endpoint=receiver.endpoint, protocol="grpc",
                    export_mode="thread" if mode == "thread" else "process",
                    exporter_priority="idle" if mode == "idle" else "low",
                    run_id=f"bench-{os.getpid()}-{mode}", metric_interval_ms=60000, **overrides)


def print_steps(label: str, res: dict[str, Any]) -> None:
    """`bench_steps`' figures, each name ending in `label`."""
    print_figure(f"step_ms_plain{label}", res["plain"])
    print_figure(f"step_ms_instrumented{label}", res["instrumented"])
    print_figure(f"step_overhead_pct{label}", res["overhead_pct"])
    print_ci(f"step_overhead_pct{label}", res["overhead_ci95_pct"])
    print_figure(f"step_noise_pct{label}", res["noise_pct"])
    print_figure(f"worker_cpu_us_per_step{label}", res["worker_cpu_us_per_step"])
    print_figure(f"exporter_cpu_us_per_step{label}", res["exporter_cpu_us_per_step"])
    print_figure(f"catch_up_steps{label}", res["catch_up_steps"])
    if "auto" in res:
        print_figure(f"step_ms_auto{label}", res["auto"])
        print_figure(f"step_overhead_pct_auto{label}", res["auto_overhead_pct"])
        print_ci(f"step_overhead_pct_auto{label}", res["auto_ci95_pct"])
    if "sdk" in res:
        print_figure(f"step_ms_sdk{label}", res["sdk"])
        print_figure(f"step_overhead_pct_sdk{label}", res["sdk_overhead_pct"])
    if "hot_path_overhead_pct" in res:
        print_figure(f"step_overhead_pct{label}_hot_path", res["hot_path_overhead_pct"])
        print_ci(f"step_overhead_pct{label}_hot_path", res["hot_path_ci95_pct"])
    if "hot_path_python_overhead_pct" in res:
        print_figure(f"step_overhead_pct{label}_hot_path_python", res["hot_path_python_overhead_pct"])
        print_ci(f"step_overhead_pct{label}_hot_path_python", res["hot_path_python_ci95_pct"])
