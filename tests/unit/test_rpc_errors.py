"""ferryman.rpc error translation, without a network: status codes, ErrorInfo, client-side parsing."""

from __future__ import annotations

import grpc
import pytest
from ferryman.errors import (
    AlreadyExistsError,
    ConfigError,
    ConflictError,
    CorruptEnvelopeError,
    EnvelopeError,
    FencedError,
    FerrymanError,
    FlowCycleError,
    FlowExistsError,
    FlowFieldError,
    FlowNotFoundError,
    FlowNotLiveError,
    FlowNotStoredYetError,
    FlowStoreBusyError,
    InvalidRequestError,
    KafkaOperationError,
    NotFoundError,
    PreconditionError,
    SourceDataLostError,
    StaleEtagError,
    TopicShapeError,
)
from ferryman.rpc import (
    ERROR_DOMAIN,
    IncompatiblePeerError,
    RpcBindError,
    RpcError,
    error_reason,
    rpc_error_from,
    status_code_for,
    to_status,
)
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ConfigError("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (EnvelopeError("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (CorruptEnvelopeError("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (TopicShapeError("x"), grpc.StatusCode.FAILED_PRECONDITION),
        (IncompatiblePeerError("x"), grpc.StatusCode.FAILED_PRECONDITION),
        (FencedError("x"), grpc.StatusCode.ABORTED),
        (SourceDataLostError("x"), grpc.StatusCode.DATA_LOSS),
        (KafkaOperationError("flush", RuntimeError("x")), grpc.StatusCode.UNAVAILABLE),
        (InvalidRequestError("f", "x"), grpc.StatusCode.INVALID_ARGUMENT),
        (NotFoundError("x"), grpc.StatusCode.NOT_FOUND),
        (PreconditionError("x"), grpc.StatusCode.FAILED_PRECONDITION),
        (AlreadyExistsError("x"), grpc.StatusCode.ALREADY_EXISTS),
        (ConflictError("x"), grpc.StatusCode.ABORTED),
        (FlowFieldError("f", "x"), grpc.StatusCode.INVALID_ARGUMENT),
        (FlowNotFoundError("x"), grpc.StatusCode.NOT_FOUND),
        (FlowExistsError("x"), grpc.StatusCode.ALREADY_EXISTS),
        (StaleEtagError("x"), grpc.StatusCode.ABORTED),
        (FlowStoreBusyError("x"), grpc.StatusCode.ABORTED),
        (FlowNotStoredYetError("x"), grpc.StatusCode.UNAVAILABLE),
        (FlowNotLiveError("f", "x"), grpc.StatusCode.FAILED_PRECONDITION),
        (FlowCycleError("x"), grpc.StatusCode.FAILED_PRECONDITION),
        (FerrymanError("x"), grpc.StatusCode.INTERNAL),
        (RpcBindError("x"), grpc.StatusCode.INTERNAL),
        (RpcError("downstream", grpc.StatusCode.INVALID_ARGUMENT), grpc.StatusCode.INTERNAL),
        (ValueError("x"), grpc.StatusCode.INTERNAL),
        (KeyError("x"), grpc.StatusCode.INTERNAL),
    ],
    ids=lambda v: type(v).__name__,
)
def test_status_codes(error: BaseException, code: grpc.StatusCode) -> None:
    assert status_code_for(error) is code
    assert status_code_for(error) is not grpc.StatusCode.UNKNOWN


@pytest.mark.parametrize(
    ("cls_name", "reason"),
    [
        ("FencedError", "FENCED_ERROR"),
        ("SourceDataLostError", "SOURCE_DATA_LOST_ERROR"),
        ("RpcError", "RPC_ERROR"),
        ("TLSHandshakeError", "TLS_HANDSHAKE_ERROR"),
        ("Http2Error", "HTTP2_ERROR"),
        ("ValueError", "VALUE_ERROR"),
    ],
)
def test_error_reason_is_upper_snake_class_name(cls_name: str, reason: str) -> None:
    error = type(cls_name, (Exception,), {})()
    assert error_reason(error) == reason


@pytest.mark.parametrize(
    ("error", "field"),
    [
        (InvalidRequestError("partition", "must be >= 0"), "partition"),
        (FlowFieldError("naming.renames", "x"), "naming.renames"),
        (FlowNotLiveError("exactly_once", "x"), "exactly_once"),
        (PreconditionError("x", field="topics"), "topics"),
        (FlowCycleError("a -> b -> a"), None),
        (NotFoundError("x"), None),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_the_field_travels_in_the_error_info_once(error: FerrymanError, field: str | None) -> None:
    info = error_details_pb2.ErrorInfo()
    assert to_status(error).details[0].Unpack(info)
    assert info.metadata.get("field") == field
    if field:
        assert str(error).startswith(f"{field}: ") and str(error).count(field) == 1


def test_to_status_carries_code_message_and_error_info() -> None:
    status = to_status(KafkaOperationError("commit_transaction", RuntimeError("coordinator not available")))
    assert status.code == grpc.StatusCode.UNAVAILABLE.value[0]
    assert status.message == "commit_transaction: coordinator not available"
    (detail,) = status.details
    info = error_details_pb2.ErrorInfo()
    assert detail.Unpack(info)
    assert info.reason == "KAFKA_OPERATION_ERROR"
    assert info.domain == ERROR_DOMAIN
    assert dict(info.metadata) == {
        "exception": "ferryman.errors.KafkaOperationError",
        "operation": "commit_transaction",
    }


def test_to_status_bounds_the_message_and_never_sends_an_empty_one() -> None:
    assert len(to_status(ValueError("x" * 100_000)).message) <= 1024
    assert to_status(ValueError()).message == "ValueError"


class _FakeCall(grpc.RpcError, grpc.Call):
    """What a failed call raises on the client: an RpcError that is also a Call."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing: tuple[tuple[str, str | bytes], ...] = ()):
        self._code, self._details, self._trailing = code, details, trailing

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    # grpc-stubs type RpcError.trailing_metadata and Call.trailing_metadata differently; a real call returns this.
    def trailing_metadata(self) -> tuple[tuple[str, str | bytes], ...]:  # type: ignore[override]
        return self._trailing

    def initial_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return ()

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float | None:  # type: ignore[override]  # None without a deadline; the stub says float
        return None

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: object) -> bool:
        return False


def _call_for(error: BaseException) -> _FakeCall:
    status = rpc_status.to_status(to_status(error))
    return _FakeCall(status.code, status.details, status.trailing_metadata)


def test_rpc_error_from_reads_the_rich_status() -> None:
    err = rpc_error_from(_call_for(FencedError("epoch 7 < 8")))
    assert isinstance(err, FerrymanError)
    assert (err.code, err.reason) == (grpc.StatusCode.ABORTED, "FENCED_ERROR")
    assert err.metadata["exception"] == "ferryman.errors.FencedError"
    assert str(err) == "ABORTED: epoch 7 < 8 [FENCED_ERROR]"


def test_rpc_error_from_plain_status() -> None:
    err = rpc_error_from(_FakeCall(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses"))
    assert (err.code, err.reason, dict(err.metadata)) == (grpc.StatusCode.UNAVAILABLE, "", {})
    assert str(err) == "UNAVAILABLE: failed to connect to all addresses"


def test_rpc_error_from_ignores_details_that_contradict_the_status_line() -> None:
    status = rpc_status.to_status(to_status(FencedError("x")))
    err = rpc_error_from(_FakeCall(grpc.StatusCode.UNAVAILABLE, "other", status.trailing_metadata))
    assert (err.code, err.reason) == (grpc.StatusCode.UNAVAILABLE, "")


def test_rpc_error_from_skips_details_that_are_not_error_info() -> None:
    other = status_pb2.Status(code=grpc.StatusCode.INTERNAL.value[0], message="m")
    detail = other.details.add()
    detail.Pack(error_details_pb2.DebugInfo(detail="d"))
    status = rpc_status.to_status(other)
    err = rpc_error_from(_FakeCall(status.code, status.details, status.trailing_metadata))
    assert (err.code, err.reason) == (grpc.StatusCode.INTERNAL, "")


def test_rpc_error_from_an_error_without_a_call() -> None:
    err = rpc_error_from(grpc.RpcError("no call"))
    assert err.code is grpc.StatusCode.UNKNOWN
