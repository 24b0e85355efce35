"""A minimal live OTLP gRPC receiver for `otel-train bench`: accepts and counts, nothing more.

Run as `python -m otel_train.bench.receiver`; prints its port on the first line of stdout
and the span count on every later line it is asked for (one line on stdin -> one count).

It stands in for a collector on another machine, so what it costs this machine should be as
little as it can be: it runs at nice +19, replies to each export with the bytes unparsed and
parses them only when asked for the count (outside the benchmark's timing). At idle CPU
priority (`SCHED_IDLE`) it was starved by the two busy training threads for up to two
seconds a reply, which stretched every flush the benchmark waits for.
"""

from __future__ import annotations

import os
import sys
import threading
from concurrent import futures
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

_TRACES = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
_METRICS = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"


class _Receiver(grpc.GenericRpcHandler):
    """Both OTLP export methods, on raw bytes: an empty response message is zero bytes."""

    def __init__(self) -> None:
        self.spans = 0
        self._unparsed: list[bytes] = []
        self._lock = threading.Lock()

    def service(self, handler_call_details: Any) -> Any:
        if handler_call_details.method == _TRACES:
            return grpc.unary_unary_rpc_method_handler(self._traces)
        if handler_call_details.method == _METRICS:
            return grpc.unary_unary_rpc_method_handler(lambda request, context: b"")
        return None

    def _traces(self, request: bytes, context: Any) -> bytes:
        with self._lock:
            self._unparsed.append(request)
        return b""

    def count(self) -> int:
        with self._lock:
            unparsed, self._unparsed = self._unparsed, []
        for payload in unparsed:
            message = trace_service_pb2.ExportTraceServiceRequest.FromString(payload)
            self.spans += sum(len(ss.spans) for rs in message.resource_spans for ss in rs.scope_spans)
        return self.spans


def main() -> int:
    os.nice(19)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    receiver = _Receiver()
    server.add_generic_rpc_handlers((receiver,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    for _ in sys.stdin:
        print(receiver.count(), flush=True)
    server.stop(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
