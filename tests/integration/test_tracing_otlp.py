"""Record spans and gRPC-call spans over OTLP (gRPC and HTTP) to real receivers on loopback.

A service's `Tracing` (``start_tracing`` with ``exporter: otlp-grpc`` / ``otlp-http``)
sends record spans as requests it encodes itself and SDK spans through the same
exporter class; the receivers parse what arrives with the generated OTLP classes.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
import pytest
from ferryman.config import TracingConfig
from ferryman.tracing import OK, RecordSpan, SpanShape, new_span_id, new_trace_id, start_tracing
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from opentelemetry.trace import SpanKind

Requests = list[trace_service_pb2.ExportTraceServiceRequest]


class _GrpcReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, got: Requests) -> None:
        self.got = got

    def Export(  # noqa: N802 (the generated method name)
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self.got.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture
def grpc_receiver() -> Iterator[tuple[str, Requests]]:
    got: Requests = []
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_GrpcReceiver(got), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"http://127.0.0.1:{port}", got
    server.stop(None)


@pytest.fixture
def http_receiver() -> Iterator[tuple[str, Requests]]:
    got: Requests = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            assert self.path == "/v1/traces" and self.headers["Content-Type"] == "application/x-protobuf"
            got.append(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            """Quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", got
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("exporter", ["otlp-grpc", "otlp-http"])
def test_record_spans_and_sdk_spans_reach_an_otlp_receiver(
    exporter: str, grpc_receiver: tuple[str, Requests], http_receiver: tuple[str, Requests]
) -> None:
    endpoint, got = grpc_receiver if exporter == "otlp-grpc" else http_receiver
    config = TracingConfig(
        enabled=True,
        exporter=exporter,  # type: ignore[arg-type]  # one of the two Literal values
        endpoint=endpoint,
        sampler="always_on",
        service_name="svc",
    )
    tracing = start_tracing(config, "default")
    assert tracing is not None
    shape = SpanShape("orders process", SpanKind.CONSUMER, {"messaging.system": "kafka"})
    spans = [
        RecordSpan(shape, new_trace_id(), new_span_id(), "", 1_000 + i, attributes=(("messaging.kafka.offset", i),))
        for i in range(3)
    ]
    for span in spans:
        span.status = OK
        tracing.records.end(span)
    tracing.tracer.start_span("rpc call", kind=SpanKind.CLIENT).end()  # an SDK span, same exporter class
    tracing.shutdown()  # flushes both pipelines

    sent = {
        s.name: s
        for request in got
        for resource_spans in request.resource_spans
        if {a.key: a.value.string_value for a in resource_spans.resource.attributes}["service.name"] == "svc"
        for scope_spans in resource_spans.scope_spans
        for s in scope_spans.spans
    }
    assert set(sent) == {"orders process", "rpc call"}
    record_spans = [s for request in got for r in request.resource_spans for ss in r.scope_spans for s in ss.spans]
    processed = [s for s in record_spans if s.name == "orders process"]
    assert sorted(s.span_id.hex() for s in processed) == sorted(s.span_id for s in spans)
    first = next(s for s in processed if s.span_id.hex() == spans[0].span_id)
    assert first.trace_id.hex() == spans[0].trace_id and first.kind == Span.SPAN_KIND_CONSUMER
    assert first.status.code == 1 and first.end_time_unix_nano >= first.start_time_unix_nano
    assert {a.key: a.value for a in first.attributes}["messaging.kafka.offset"].int_value == 0
