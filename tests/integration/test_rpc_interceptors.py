"""ferryman.rpc interceptors on real servers: auth, error mapping, tracing; unary and bidi streams."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence

import grpc
import pytest
from ferryman.admin import FerrymanAdmin, ServiceUnavailableError
from ferryman.config import RpcConfig, SecretStr
from ferryman.errors import (
    ConfigError,
    CorruptEnvelopeError,
    FencedError,
    FerrymanError,
    KafkaOperationError,
    SourceDataLostError,
    TopicShapeError,
)
from ferryman.rpc import ERROR_DOMAIN, IncompatiblePeerError, open_channel, rpc_error_from
from ferryman.v1 import control_pb2_grpc
from google.rpc import error_details_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from grpc_status import rpc_status
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from tests.helpers.grpc_clients import CALL_TIMEOUT_S, DEDUPER_SERVICE, NOT_SERVING
from tests.integration.test_rpc_server import (
    Requests,
    health_of,
    hello,
    progress,
    running_server,
    status_call,
)

pytestmark = pytest.mark.integration

TOKEN = "s3cret-token"


def _secret(token: str | None) -> SecretStr | None:
    """token as RpcConfig stores it (the config turns a str into the same SecretStr)."""
    return None if token is None else SecretStr(token)


def _connect(channel: grpc.Channel, requests: Requests) -> Iterator[object]:
    call: Iterator[object] = control_pb2_grpc.ControlServiceStub(channel).Connect(
        iter(requests), timeout=CALL_TIMEOUT_S
    )
    return call


# -- auth --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("client_token", "accepted"),
    [(TOKEN, True), (None, False), ("wrong", False), (TOKEN + "x", False)],
    ids=["right", "missing", "wrong", "longer"],
)
def test_token_auth_on_unary_calls(client_token: str | None, accepted: bool) -> None:
    with (
        running_server(RpcConfig(auth_token=SecretStr(TOKEN))) as (server, servicer),
        open_channel(f"127.0.0.1:{server.port}", RpcConfig(auth_token=_secret(client_token))) as channel,
    ):
        if accepted:
            assert status_call(channel).flow == "test-flow"
            assert servicer.calls == 1
        else:
            with pytest.raises(grpc.RpcError) as info:
                status_call(channel)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert servicer.calls == 0  # the handler never ran


@pytest.mark.parametrize(("client_token", "accepted"), [(TOKEN, True), (None, False), ("wrong", False)])
def test_token_auth_on_bidi_streams(client_token: str | None, accepted: bool) -> None:
    with (
        running_server(RpcConfig(auth_token=SecretStr(TOKEN))) as (server, servicer),
        open_channel(f"127.0.0.1:{server.port}", RpcConfig(auth_token=_secret(client_token))) as channel,
    ):
        requests = Requests(hello(), progress(7))
        requests.close()
        responses = _connect(channel, requests)
        if accepted:
            got = list(responses)
            assert [r.WhichOneof("kind") for r in got] == ["welcome", "watermarks"]  # type: ignore[attr-defined]
        else:
            with pytest.raises(grpc.RpcError) as info:
                next(responses)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert servicer.calls == 0


def test_health_and_reflection_stay_open_without_a_token() -> None:
    with (
        running_server(RpcConfig(auth_token=SecretStr(TOKEN))) as (server, _),
        open_channel(f"127.0.0.1:{server.port}", RpcConfig()) as channel,
    ):
        assert health_of(channel, DEDUPER_SERVICE) == NOT_SERVING
        assert DEDUPER_SERVICE in ProtoReflectionDescriptorDatabase(channel).get_services()


# -- error mapping -----------------------------------------------------------------------------------------------


ERROR_CASES: Sequence[tuple[BaseException, grpc.StatusCode, str]] = [
    (ConfigError("bad flow"), grpc.StatusCode.INVALID_ARGUMENT, "CONFIG_ERROR"),
    (CorruptEnvelopeError("crc mismatch"), grpc.StatusCode.INVALID_ARGUMENT, "CORRUPT_ENVELOPE_ERROR"),
    (TopicShapeError("3 partitions, expected 6"), grpc.StatusCode.FAILED_PRECONDITION, "TOPIC_SHAPE_ERROR"),
    (IncompatiblePeerError("protocol 2.0 vs 1.0"), grpc.StatusCode.FAILED_PRECONDITION, "INCOMPATIBLE_PEER_ERROR"),
    (FencedError("another deduper took over"), grpc.StatusCode.ABORTED, "FENCED_ERROR"),
    (SourceDataLostError("offsets 10..20 deleted"), grpc.StatusCode.DATA_LOSS, "SOURCE_DATA_LOST_ERROR"),
    (KafkaOperationError("commit", RuntimeError("broker down")), grpc.StatusCode.UNAVAILABLE, "KAFKA_OPERATION_ERROR"),
    (FerrymanError("plain root error"), grpc.StatusCode.INTERNAL, "FERRYMAN_ERROR"),
    (ValueError("unexpected value"), grpc.StatusCode.INTERNAL, "VALUE_ERROR"),
]


def _error_info(exc: grpc.RpcError) -> error_details_pb2.ErrorInfo:
    status = rpc_status.from_call(exc)  # type: ignore[arg-type]
    assert status is not None, "no rich status details"
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    return info


@pytest.mark.parametrize(("error", "code", "reason"), ERROR_CASES, ids=lambda v: type(v).__name__)
def test_handler_errors_map_to_precise_codes_with_error_info(
    error: BaseException, code: grpc.StatusCode, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    with running_server() as (server, servicer), open_channel(f"127.0.0.1:{server.port}", RpcConfig()) as channel:
        servicer.fail_with = error
        with caplog.at_level(logging.WARNING, logger="ferryman.rpc"), pytest.raises(grpc.RpcError) as info:
            status_call(channel)
    assert info.value.code() == code
    details = info.value.details()
    assert details is not None
    assert str(error) in details
    assert "Traceback" not in details
    detail = _error_info(info.value)
    assert (detail.reason, detail.domain) == (reason, ERROR_DOMAIN)
    assert detail.metadata["exception"].endswith(type(error).__name__)
    err = rpc_error_from(info.value)
    assert (err.code, err.reason) == (code, reason)
    if code is grpc.StatusCode.INTERNAL:  # unexpected: the traceback is logged on the server
        assert any(r.exc_info and r.exc_info[1] is error for r in caplog.records)


def test_kafka_operation_error_names_the_operation() -> None:
    with running_server() as (server, servicer), open_channel(f"127.0.0.1:{server.port}", RpcConfig()) as channel:
        servicer.fail_with = KafkaOperationError("commit_transaction", RuntimeError("timed out"))
        with pytest.raises(grpc.RpcError) as info:
            status_call(channel)
    assert rpc_error_from(info.value).metadata["operation"] == "commit_transaction"


def test_handler_abort_passes_through_untouched() -> None:
    with running_server() as (server, servicer), open_channel(f"127.0.0.1:{server.port}", RpcConfig()) as channel:
        servicer.abort_code = grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as info:
            status_call(channel)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert info.value.details() == "the handler aborted"
    err = rpc_error_from(info.value)
    assert (err.code, err.reason) == (grpc.StatusCode.NOT_FOUND, "")


@pytest.mark.parametrize(
    ("error", "code", "reason"),
    [
        (FencedError("fenced mid-stream"), grpc.StatusCode.ABORTED, "FENCED_ERROR"),
        (IncompatiblePeerError("flow mismatch"), grpc.StatusCode.FAILED_PRECONDITION, "INCOMPATIBLE_PEER_ERROR"),
        (ValueError("bug mid-stream"), grpc.StatusCode.INTERNAL, "VALUE_ERROR"),
    ],
    ids=lambda v: type(v).__name__,
)
def test_errors_raised_mid_stream_map_too(error: BaseException, code: grpc.StatusCode, reason: str) -> None:
    with running_server() as (server, servicer), open_channel(f"127.0.0.1:{server.port}", RpcConfig()) as channel:
        servicer.stream_fail_with = error
        requests = Requests(hello())
        responses = _connect(channel, requests)
        assert next(responses).HasField("welcome")  # type: ignore[attr-defined]
        requests.send(progress())
        with pytest.raises(grpc.RpcError) as info:
            next(responses)
        requests.close()
    assert info.value.code() == code
    details = info.value.details()
    assert details is not None
    assert str(error) in details
    err = rpc_error_from(info.value)
    assert (err.code, err.reason) == (code, reason)
    assert servicer.stream_ended.is_set()


# -- tracing -----------------------------------------------------------------------------------------------------


class _SpanLog(InMemorySpanExporter):
    """In-memory exporter that can be waited on (spans of cancelled calls end on gRPC's own thread)."""

    def __init__(self) -> None:
        super().__init__()
        self._changed = threading.Condition()

    def export(self, spans: Sequence[ReadableSpan]) -> object:  # type: ignore[override]
        result = super().export(spans)
        with self._changed:
            self._changed.notify_all()
        return result

    def server_spans(self) -> list[ReadableSpan]:
        return [s for s in self.get_finished_spans() if s.kind is SpanKind.SERVER]

    def wait_for(self, predicate: Callable[[list[ReadableSpan]], bool]) -> list[ReadableSpan]:
        with self._changed:
            assert self._changed.wait_for(lambda: predicate(self.server_spans()), CALL_TIMEOUT_S)
        return self.server_spans()


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, _SpanLog]]:
    provider = TracerProvider()  # private: nothing global is touched
    exporter = _SpanLog()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def test_unary_call_gets_a_server_span_parented_on_the_callers_traceparent(
    spans: tuple[TracerProvider, _SpanLog],
) -> None:
    provider, log = spans
    with (
        running_server(tracer_provider=provider) as (server, _),
        open_channel(f"127.0.0.1:{server.port}", RpcConfig()) as channel,
        provider.get_tracer("test").start_as_current_span("caller", kind=SpanKind.CLIENT) as caller,
    ):
        response = status_call(channel)
    (span,) = log.server_spans()
    assert span.name == "ferryman.v1.DeduperService/GetDeduperStatus"
    assert span.parent is not None
    assert span.parent.span_id == caller.get_span_context().span_id
    assert span.context.trace_id == caller.get_span_context().trace_id
    assert dict(span.attributes or {}) == {
        "rpc.system": "grpc",
        "rpc.service": "ferryman.v1.DeduperService",
        "rpc.method": "GetDeduperStatus",
        "rpc.grpc.status_code": grpc.StatusCode.OK.value[0],
    }
    assert response.deduper_id == f"{span.context.span_id:016x}"  # current inside the handler
    assert span.status.status_code is StatusCode.UNSET


def test_call_without_traceparent_gets_a_root_server_span(spans: tuple[TracerProvider, _SpanLog]) -> None:
    provider, log = spans
    with (
        running_server(tracer_provider=provider) as (server, _),
        open_channel(f"127.0.0.1:{server.port}", RpcConfig()) as channel,
    ):
        status_call(channel)
    (span,) = log.server_spans()
    assert span.parent is None


def test_stream_span_ends_when_the_stream_ends(spans: tuple[TracerProvider, _SpanLog]) -> None:
    provider, log = spans
    with (
        running_server(tracer_provider=provider) as (server, _),
        open_channel(f"127.0.0.1:{server.port}", RpcConfig()) as channel,
        provider.get_tracer("test").start_as_current_span("caller") as caller,
    ):
        requests = Requests(hello())
        responses = _connect(channel, requests)
        assert next(responses).HasField("welcome")  # type: ignore[attr-defined]
        requests.send(progress())
        assert next(responses).HasField("watermarks")  # type: ignore[attr-defined]
        assert log.server_spans() == []  # still open
        requests.close()
        assert list(responses) == []
    (span,) = log.server_spans()
    assert span.name == "ferryman.v1.ControlService/Connect"
    assert span.parent is not None
    assert span.parent.span_id == caller.get_span_context().span_id
    assert span.attributes is not None
    assert span.attributes["rpc.grpc.status_code"] == 0


@pytest.mark.parametrize(
    ("error", "code", "span_status"),
    [
        (FencedError("fenced"), grpc.StatusCode.ABORTED, StatusCode.UNSET),  # the caller's problem
        (ValueError("bug"), grpc.StatusCode.INTERNAL, StatusCode.ERROR),  # ours
    ],
    ids=["fenced", "bug"],
)
def test_span_records_the_code_the_client_gets(
    spans: tuple[TracerProvider, _SpanLog], error: BaseException, code: grpc.StatusCode, span_status: StatusCode
) -> None:
    provider, log = spans
    with (
        running_server(tracer_provider=provider) as (server, servicer),
        open_channel(f"127.0.0.1:{server.port}", RpcConfig()) as channel,
    ):
        servicer.stream_fail_with = error
        requests = Requests(hello(), progress())
        with pytest.raises(grpc.RpcError) as info:
            list(_connect(channel, requests))
        requests.close()
    assert info.value.code() == code
    (span,) = log.server_spans()
    assert span.attributes is not None
    assert span.attributes["rpc.grpc.status_code"] == code.value[0]
    assert span.status.status_code is span_status
    assert [e.name for e in span.events] == ["exception"]


def test_span_of_a_stream_cancelled_while_the_handler_is_busy_ends_at_once(
    spans: tuple[TracerProvider, _SpanLog],
) -> None:
    """gRPC never tells a busy handler; the span ends from the call's termination callback."""
    provider, log = spans
    with (
        running_server(tracer_provider=provider) as (server, servicer),
        open_channel(f"127.0.0.1:{server.port}", RpcConfig()) as channel,
    ):
        servicer.hold = threading.Event()
        requests = Requests(hello())
        responses = _connect(channel, requests)
        assert next(responses).HasField("welcome")  # type: ignore[attr-defined]
        assert servicer.holding.wait(CALL_TIMEOUT_S)
        responses.cancel()  # type: ignore[attr-defined]
        (span,) = log.wait_for(lambda found: len(found) == 1)
        assert not servicer.stream_ended.is_set()  # the handler is still busy
        servicer.hold.set()
        assert servicer.stream_ended.wait(CALL_TIMEOUT_S)
        requests.close()
    assert span.attributes is not None
    assert span.attributes["rpc.grpc.status_code"] == grpc.StatusCode.CANCELLED.value[0]
    assert len(log.server_spans()) == 1  # ended once


def test_span_of_a_cancelled_stream_ends_when_the_handler_was_reading(
    spans: tuple[TracerProvider, _SpanLog],
) -> None:
    """The handler may see the cancel as a clean end of the request stream: the span ends either way."""
    provider, log = spans
    with (
        running_server(tracer_provider=provider) as (server, servicer),
        open_channel(f"127.0.0.1:{server.port}", RpcConfig()) as channel,
    ):
        requests = Requests(hello())
        responses = _connect(channel, requests)
        assert next(responses).HasField("welcome")  # type: ignore[attr-defined]
        responses.cancel()  # type: ignore[attr-defined]
        (span,) = log.wait_for(lambda found: len(found) == 1)
        assert servicer.stream_ended.wait(CALL_TIMEOUT_S)
        requests.close()
    assert span.attributes is not None
    assert span.attributes["rpc.grpc.status_code"] in {grpc.StatusCode.CANCELLED.value[0], 0}


def test_unauthenticated_calls_create_no_span(spans: tuple[TracerProvider, _SpanLog]) -> None:
    provider, log = spans
    with (
        running_server(RpcConfig(auth_token=SecretStr(TOKEN)), tracer_provider=provider) as (server, _),
        open_channel(f"127.0.0.1:{server.port}", RpcConfig()) as channel,
        pytest.raises(grpc.RpcError),
    ):
        status_call(channel)
    assert log.server_spans() == []


@pytest.mark.parametrize(
    ("unavailable", "calls"),
    [
        # A Ferryman server saying what it lacks (its cluster did not answer within the call's deadline) has
        # waited already: asking again would only meet the caller's own deadline instead of that answer.
        (KafkaOperationError("reading the flow store of cluster 'dst'", RuntimeError("no answer")), 1),
        # UNAVAILABLE with no reason (a server shutting down, a connection being set up): asked again.
        (grpc.StatusCode.UNAVAILABLE, 4),
    ],
    ids=["with-a-reason", "bare"],
)
def test_the_admin_client_asks_again_only_on_an_unavailable_without_a_reason(
    unavailable: KafkaOperationError | grpc.StatusCode, calls: int
) -> None:
    with running_server() as (server, servicer), FerrymanAdmin(f"127.0.0.1:{server.port}", timeout_s=10) as admin:
        if isinstance(unavailable, grpc.StatusCode):
            servicer.abort_code = unavailable
        else:
            servicer.fail_with = unavailable
        with pytest.raises(ServiceUnavailableError) as info:
            admin.deduper_status()
    assert servicer.calls == calls
    assert bool(info.value.reason) is (calls == 1)
