"""A real OTLP/gRPC receiver for the tests: opentelemetry-proto's Trace and Metrics services on port 0.

It keeps every request, and can misbehave on demand (`mode`): "ok" accepts, "unavailable" answers
UNAVAILABLE, "sleep" holds each call past the exporters' deadline, "hang" holds every call until
`resume()` (a collector stopped with SIGSTOP, then continued: the held calls are then answered).
"""

from __future__ import annotations

import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


class _Traces(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self.receiver = receiver

    def Export(self, request: Any, context: Any) -> Any:
        receiver = self.receiver
        mode = receiver.mode
        if mode == "unavailable":
            receiver.refused += 1
            context.abort(grpc.StatusCode.UNAVAILABLE, "collector overloaded")
        if mode == "sleep":
            receiver.slept += 1
            time.sleep(receiver.sleep_s)
        if mode == "hang":
            receiver.held += 1
            receiver.hung.set()
            receiver.resumed.wait()
        with receiver.lock:
            receiver.requests.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()


class _Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self.receiver = receiver

    def Export(self, request: Any, context: Any) -> Any:
        self.receiver.metric_requests.append(request)
        return metrics_service_pb2.ExportMetricsServiceResponse()


@dataclass
class OtlpReceiver:
    """The receiver; `start()` binds 127.0.0.1:0."""

    mode: str = "ok"
    sleep_s: float = 3.0
    requests: list[Any] = field(default_factory=list)
    metric_requests: list[Any] = field(default_factory=list)
    refused: int = 0
    slept: int = 0
    held: int = 0
    port: int = 0
    server: Any = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    hung: threading.Event = field(default_factory=threading.Event)  # some call is being held
    resumed: threading.Event = field(default_factory=threading.Event)

    def start(self) -> OtlpReceiver:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Traces(self), self.server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_Metrics(self), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        return self

    def hang(self) -> None:
        """Hold every Export call from now on until `resume()`."""
        self.resumed.clear()
        self.hung.clear()
        self.mode = "hang"

    def resume(self) -> None:
        """Answer the held calls and accept again."""
        self.mode = "ok"
        self.resumed.set()

    def stop(self) -> None:
        self.resumed.set()
        self.server.stop(0)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spans(self) -> list[tuple[dict[str, Any], Any]]:
        """(resource attributes, span) of everything received."""
        with self.lock:
            requests = list(self.requests)
        out = []
        for request in requests:
            for resource_spans in request.resource_spans:
                resource = {a.key: value(a.value) for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    out += [(resource, span) for span in scope_spans.spans]
        return out


def value(any_value: Any) -> Any:
    """The Python value of an OTLP AnyValue (arrays as lists)."""
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind)


def attrs(span: Any) -> dict[str, Any]:
    """A span's (or event's, or link's) attributes as a dict."""
    return {a.key: value(a.value) for a in span.attributes}
