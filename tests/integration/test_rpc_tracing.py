"""gRPC tracing between a real client and server on loopback: the CLIENT span and the SERVER span under it."""

from __future__ import annotations

from ferryman.config import RpcConfig
from ferryman.rpc import build_server, default_server_interceptors, open_channel
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind


def test_client_span_is_the_parent_of_the_server_span() -> None:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    rpc = RpcConfig()
    server = build_server(
        listen_address="127.0.0.1:0",
        rpc=rpc,
        register=[],
        service_names=[],
        interceptors=default_server_interceptors(rpc, tracer_provider=provider),
    )
    server.start()
    try:
        with open_channel(f"127.0.0.1:{server.port}", rpc, tracer_provider=provider) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(  # type: ignore[attr-defined]  # the stubs declare no methods
                health_pb2.HealthCheckRequest(service=""), timeout=10
            )
        assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING  # servers start NOT_SERVING
    finally:
        server.stop(1.0)
    finished = spans.get_finished_spans()
    client = [s for s in finished if s.kind is SpanKind.CLIENT]
    srv = [s for s in finished if s.kind is SpanKind.SERVER]
    assert len(client) == 1 and len(srv) == 1, finished
    assert client[0].name == srv[0].name == "grpc.health.v1.Health/Check"
    assert srv[0].parent is not None and srv[0].parent.span_id == client[0].context.span_id
    assert srv[0].context.trace_id == client[0].context.trace_id
    assert client[0].attributes is not None and client[0].attributes["rpc.grpc.status_code"] == 0


def test_without_a_provider_the_channel_makes_no_span() -> None:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    rpc = RpcConfig()
    server = build_server(listen_address="127.0.0.1:0", rpc=rpc, register=[], service_names=[])
    server.start()
    try:
        with open_channel(f"127.0.0.1:{server.port}", rpc) as channel:
            health_pb2_grpc.HealthStub(channel).Check(  # type: ignore[attr-defined]  # the stubs declare no methods
                health_pb2.HealthCheckRequest(service=""), timeout=10
            )
    finally:
        server.stop(1.0)
    assert spans.get_finished_spans() == ()
