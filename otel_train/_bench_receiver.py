"""A minimal live OTLP gRPC receiver for `otel-train bench`: accepts and counts, nothing more.

Run as `python -m otel_train._bench_receiver`; prints its port on the first line of stdout
and the span count on every later line it is asked for (one line on stdin -> one count).
"""

from __future__ import annotations

import sys
import threading
from concurrent import futures

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from otel_train._exporter_process import lower_priority


class _Traces(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans = 0
        self._lock = threading.Lock()

    def Export(self, request, context):  # noqa: N802 - gRPC method name
        count = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        with self._lock:
            self.spans += count
        return trace_service_pb2.ExportTraceServiceResponse()


class _Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
    def Export(self, request, context):  # noqa: N802
        return metrics_service_pb2.ExportMetricsServiceResponse()


def main() -> int:
    # The receiver stands in for a collector on another machine: its own parsing is not what
    # otel_train costs the loop, so it only runs on CPU time the benchmark leaves idle.
    lower_priority("idle")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    traces = _Traces()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(traces, server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_Metrics(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    for _ in sys.stdin:
        print(traces.spans, flush=True)
    server.stop(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
