"""ferryman.rpc servers on loopback: health, drain, reflection, binding, lifecycle.

Also home of the small test servicer and server helper the other
``test_rpc_*`` modules share.
"""

from __future__ import annotations

import queue
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypedDict, Unpack

import grpc
import pytest
from ferryman.config import RpcConfig, TlsConfig
from ferryman.errors import ConfigError
from ferryman.rpc import RpcBindError, RpcServer, build_server, default_server_interceptors, open_channel
from ferryman.v1 import control_pb2, control_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from opentelemetry import trace
from opentelemetry.trace import TracerProvider

from tests.helpers.grpc_clients import (
    CALL_TIMEOUT_S,
    CONTROL_SERVICE,
    DEDUPER_SERVICE,
    HEALTH_SERVICE,
    NOT_SERVING,
    SERVING,
)

pytestmark = pytest.mark.integration

SERVICE_NAMES = (DEDUPER_SERVICE, CONTROL_SERVICE)


class TestServicer(control_pb2_grpc.DeduperServiceServicer, control_pb2_grpc.ControlServiceServicer):
    """DeduperService (unary) and ControlService.Connect (bidi generator) with switchable failures."""

    __test__ = False

    def __init__(self) -> None:
        self.fail_with: BaseException | None = None
        """Raised by GetDeduperStatus."""
        self.abort_code: grpc.StatusCode | None = None
        """GetDeduperStatus aborts with it (before fail_with)."""
        self.stream_fail_with: BaseException | None = None
        """Raised by Connect on the first Progress after the Welcome (mid-stream)."""
        self.hold: threading.Event | None = None
        """Connect blocks on it right after the Welcome (a handler busy elsewhere, not reading)."""
        self.holding = threading.Event()
        """Set when Connect starts waiting on hold."""
        self.calls = 0
        self.stream_ended = threading.Event()
        """Set when a Connect handler finishes, however it finishes."""

    def GetDeduperStatus(  # noqa: N802
        self, request: control_pb2.GetDeduperStatusRequest, context: grpc.ServicerContext
    ) -> control_pb2.GetDeduperStatusResponse:
        self.calls += 1
        if self.abort_code is not None:
            context.abort(self.abort_code, "the handler aborted")
        if self.fail_with is not None:
            raise self.fail_with
        # The id of the span current inside the handler: tests compare it with the SERVER span.
        span_id = trace.get_current_span().get_span_context().span_id
        return control_pb2.GetDeduperStatusResponse(deduper_id=f"{span_id:016x}", flow="test-flow")

    def TranslateOffsets(  # noqa: N802
        self, request: control_pb2.TranslateOffsetsRequest, context: grpc.ServicerContext
    ) -> control_pb2.TranslateOffsetsResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not part of these tests")

    def TranslateGroupOffsets(  # noqa: N802
        self, request: control_pb2.TranslateGroupOffsetsRequest, context: grpc.ServicerContext
    ) -> control_pb2.TranslateGroupOffsetsResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not part of these tests")

    def CommitGroupOffsets(  # noqa: N802
        self, request: control_pb2.CommitGroupOffsetsRequest, context: grpc.ServicerContext
    ) -> control_pb2.CommitGroupOffsetsResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not part of these tests")

    def Connect(  # noqa: N802
        self, request_iterator: Iterator[control_pb2.ConnectRequest], context: grpc.ServicerContext
    ) -> Iterator[control_pb2.ConnectResponse]:
        self.calls += 1
        try:
            for request in request_iterator:
                kind = request.WhichOneof("kind")
                if kind == "hello":
                    yield control_pb2.ConnectResponse(
                        welcome=control_pb2.Welcome(deduper_id="test-deduper", flows=[request.hello.flow])
                    )
                    if self.hold is not None:
                        self.holding.set()
                        self.hold.wait(CALL_TIMEOUT_S)
                elif kind == "progress":
                    if self.stream_fail_with is not None:
                        raise self.stream_fail_with
                    yield control_pb2.ConnectResponse(
                        watermarks=control_pb2.Watermarks(
                            partitions=[
                                control_pb2.PartitionWatermark(
                                    topic=p.topic, partition=p.partition, watermark=p.last_wrapped_offset
                                )
                                for p in request.progress.partitions
                            ]
                        )
                    )
        finally:
            self.stream_ended.set()


def make_server(
    rpc: RpcConfig,
    servicer: TestServicer,
    *,
    tracer_provider: TracerProvider | None = None,
    listen_address: str = "127.0.0.1:0",
) -> RpcServer:
    """A built (not started) server with the test servicer and the default interceptors."""
    return build_server(
        listen_address=listen_address,
        rpc=rpc,
        register=[
            lambda s: control_pb2_grpc.add_DeduperServiceServicer_to_server(servicer, s),
            lambda s: control_pb2_grpc.add_ControlServiceServicer_to_server(servicer, s),
        ],
        service_names=SERVICE_NAMES,
        interceptors=default_server_interceptors(rpc, tracer_provider=tracer_provider),
    )


@contextmanager
def running_server(
    rpc: RpcConfig | None = None, *, tracer_provider: TracerProvider | None = None
) -> Iterator[tuple[RpcServer, TestServicer]]:
    """A started server on 127.0.0.1 (free port), stopped at once on exit."""
    servicer = TestServicer()
    server = make_server(rpc or RpcConfig(), servicer, tracer_provider=tracer_provider)
    server.start()
    try:
        yield server, servicer
    finally:
        server.stop(0)


class Requests:
    """Request stream of a bidi call, fed from the test thread."""

    def __init__(self, *first: control_pb2.ConnectRequest) -> None:
        self._queue: queue.Queue[control_pb2.ConnectRequest | None] = queue.Queue()
        for request in first:
            self.send(request)

    def send(self, request: control_pb2.ConnectRequest) -> None:
        self._queue.put(request)

    def close(self) -> None:
        self._queue.put(None)

    def __iter__(self) -> Iterator[control_pb2.ConnectRequest]:
        while (request := self._queue.get()) is not None:
            yield request


def hello(flow: str = "test-flow") -> control_pb2.ConnectRequest:
    return control_pb2.ConnectRequest(hello=control_pb2.Hello(wrapper_id="w1", flow=flow))


def progress(offset: int = 41) -> control_pb2.ConnectRequest:
    return control_pb2.ConnectRequest(
        progress=control_pb2.Progress(
            partitions=[control_pb2.PartitionProgress(topic="t", partition=0, last_wrapped_offset=offset)]
        )
    )


class _CallOptions(TypedDict, total=False):
    """Keyword arguments of a unary call that ``status_call`` passes on (besides its timeout)."""

    metadata: tuple[tuple[str, str | bytes], ...] | None
    credentials: grpc.CallCredentials | None
    wait_for_ready: bool | None
    compression: grpc.Compression | None


def status_call(channel: grpc.Channel, **kwargs: Unpack[_CallOptions]) -> control_pb2.GetDeduperStatusResponse:
    stub = control_pb2_grpc.DeduperServiceStub(channel)
    response: control_pb2.GetDeduperStatusResponse = stub.GetDeduperStatus(
        control_pb2.GetDeduperStatusRequest(), timeout=CALL_TIMEOUT_S, **kwargs
    )
    return response


def health_of(channel: grpc.Channel, service: str) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    # The grpc_health stubs declare no methods on HealthStub (as in tests/helpers/grpc_clients.py).
    response: health_pb2.HealthCheckResponse = stub.Check(  # type: ignore[attr-defined]
        health_pb2.HealthCheckRequest(service=service), timeout=CALL_TIMEOUT_S
    )
    return response.status


def _address(server: RpcServer) -> str:
    return f"127.0.0.1:{server.port}"


def _statuses(channel: grpc.Channel) -> dict[str, int]:
    return {name: health_of(channel, name) for name in (*SERVICE_NAMES, "")}


# -- health ------------------------------------------------------------------------------------------------------


def test_health_starts_not_serving_and_follows_set_serving() -> None:
    with running_server() as (server, _), open_channel(_address(server), RpcConfig()) as channel:
        assert _statuses(channel) == dict.fromkeys((*SERVICE_NAMES, ""), NOT_SERVING)

        server.set_serving(DEDUPER_SERVICE, True)
        assert _statuses(channel) == {DEDUPER_SERVICE: SERVING, CONTROL_SERVICE: NOT_SERVING, "": NOT_SERVING}

        server.set_serving(CONTROL_SERVICE, True)
        assert _statuses(channel) == dict.fromkeys((*SERVICE_NAMES, ""), SERVING)

        server.set_serving(CONTROL_SERVICE, False)
        assert _statuses(channel) == {DEDUPER_SERVICE: SERVING, CONTROL_SERVICE: NOT_SERVING, "": NOT_SERVING}


def test_begin_drain_reports_every_service_not_serving_for_good_but_still_serves_calls() -> None:
    with running_server() as (server, _), open_channel(_address(server), RpcConfig()) as channel:
        for name in SERVICE_NAMES:
            server.set_serving(name, True)
        assert health_of(channel, "") == SERVING

        server.begin_drain()
        server.begin_drain()  # idempotent
        assert _statuses(channel) == dict.fromkeys((*SERVICE_NAMES, ""), NOT_SERVING)

        server.set_serving(DEDUPER_SERVICE, True)  # a drain is final
        assert health_of(channel, DEDUPER_SERVICE) == NOT_SERVING
        assert status_call(channel).flow == "test-flow"  # new calls still served until stop()


def test_health_watch_streams_changes_through_the_interceptors() -> None:
    """Watch is a callback-style handler; interceptors must let it through untouched."""
    with running_server() as (server, _), open_channel(_address(server), RpcConfig()) as channel:
        # The grpc_health stubs declare no methods on HealthStub (as in tests/helpers/grpc_clients.py).
        watch = health_pb2_grpc.HealthStub(channel).Watch(  # type: ignore[attr-defined]
            health_pb2.HealthCheckRequest(service=DEDUPER_SERVICE), timeout=CALL_TIMEOUT_S
        )
        try:
            assert next(watch).status == NOT_SERVING
            server.set_serving(DEDUPER_SERVICE, True)
            assert next(watch).status == SERVING
            server.begin_drain()
            assert next(watch).status == NOT_SERVING
        finally:
            watch.cancel()


def test_unknown_health_service_is_not_found_and_set_serving_rejects_unknown_names() -> None:
    with running_server() as (server, _), open_channel(_address(server), RpcConfig()) as channel:
        with pytest.raises(grpc.RpcError) as info:
            health_of(channel, "ferryman.v1.NoSuchService")
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(ValueError, match="unknown service"):
            server.set_serving("ferryman.v1.NoSuchService", True)


# -- reflection --------------------------------------------------------------------------------------------------


def test_reflection_lists_services_health_and_reflection() -> None:
    with running_server() as (server, _), open_channel(_address(server), RpcConfig()) as channel:
        services = set(ProtoReflectionDescriptorDatabase(channel).get_services())
    assert services == {*SERVICE_NAMES, HEALTH_SERVICE, "grpc.reflection.v1alpha.ServerReflection"}


def test_reflection_describes_the_control_service() -> None:
    with running_server() as (server, _), open_channel(_address(server), RpcConfig()) as channel:
        db = ProtoReflectionDescriptorDatabase(channel)
        file_proto = db.FindFileContainingSymbol(CONTROL_SERVICE)
    assert file_proto.package == "ferryman.v1"
    assert "ControlService" in {s.name for s in file_proto.service}


# -- binding and lifecycle ---------------------------------------------------------------------------------------


def test_port_zero_binds_a_free_port_and_calls_work() -> None:
    with running_server() as (server, _), open_channel(_address(server), RpcConfig()) as channel:
        assert server.port > 0
        assert status_call(channel).flow == "test-flow"


def test_port_in_use_by_another_server_is_a_bind_error() -> None:
    """gRPC's default SO_REUSEPORT would let the second server share the port silently."""
    with running_server() as (server, _), pytest.raises(RpcBindError, match=str(server.port)):
        make_server(RpcConfig(), TestServicer(), listen_address=_address(server))


def test_port_in_use_by_another_process_is_a_bind_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(RpcBindError):
            make_server(RpcConfig(), TestServicer(), listen_address=f"127.0.0.1:{port}")


def test_malformed_address_is_a_bind_error() -> None:
    with pytest.raises(RpcBindError, match="nonsense"):
        make_server(RpcConfig(), TestServicer(), listen_address="nonsense:port")


def test_mutual_tls_without_tls_material_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="require_client_cert"):
        make_server(RpcConfig(tls=TlsConfig(require_client_cert=True)), TestServicer())


def test_context_manager_starts_and_stops_and_stop_is_idempotent() -> None:
    servicer = TestServicer()
    with make_server(RpcConfig(), servicer) as server, open_channel(_address(server), RpcConfig()) as channel:
        server.start()  # idempotent
        assert status_call(channel).flow == "test-flow"
    server.stop(0)  # again, after __exit__
    with open_channel(_address(server), RpcConfig()) as channel, pytest.raises(grpc.RpcError) as info:
        status_call(channel)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(RuntimeError, match="cannot be started again"):
        server.start()


def test_stop_cancels_an_open_stream_after_the_grace() -> None:
    with running_server() as (server, servicer), open_channel(_address(server), RpcConfig()) as channel:
        requests = Requests(hello())
        responses = control_pb2_grpc.ControlServiceStub(channel).Connect(iter(requests), timeout=CALL_TIMEOUT_S)
        assert next(responses).HasField("welcome")
        stoppers = [threading.Thread(target=server.stop, args=(0.1,)) for _ in range(2)]
        for stopper in stoppers:
            stopper.start()
        with pytest.raises(grpc.RpcError) as info:
            next(responses)
        for stopper in stoppers:
            stopper.join(CALL_TIMEOUT_S)
        requests.close()
    assert info.value.code() in {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}
    assert servicer.stream_ended.wait(CALL_TIMEOUT_S)
