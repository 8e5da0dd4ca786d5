"""gRPC errors: Ferryman errors to status codes (server side) and back (client side)."""

from __future__ import annotations

import logging
import re

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from ferryman.errors import (
    ConfigError,
    EnvelopeError,
    FencedError,
    FerrymanError,
    KafkaOperationError,
    SourceDataLostError,
    TopicShapeError,
)

_log = logging.getLogger(__name__)

#: ErrorInfo.domain of every error Ferryman reports.
ERROR_DOMAIN = "ferryman"


class IncompatiblePeerError(FerrymanError):
    """The peer speaks another major version of the protocol, or serves another flow."""


class RpcError(FerrymanError):
    """A gRPC call failed; the status code and the server's ErrorInfo reason, translated once."""

    def __init__(self, message: str, code: grpc.StatusCode, reason: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason

    def __str__(self) -> str:
        base = super().__str__()
        return f"{self.code.name}: {base}" + (f" [{self.reason}]" if self.reason else "")


class RpcBindError(FerrymanError):
    """A gRPC server could not listen on its address."""


#: Most specific first.
_CODES: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (IncompatiblePeerError, grpc.StatusCode.FAILED_PRECONDITION),
    (ConfigError, grpc.StatusCode.INVALID_ARGUMENT),
    (EnvelopeError, grpc.StatusCode.INVALID_ARGUMENT),
    (TopicShapeError, grpc.StatusCode.FAILED_PRECONDITION),
    (FencedError, grpc.StatusCode.ABORTED),
    (SourceDataLostError, grpc.StatusCode.DATA_LOSS),
    (KafkaOperationError, grpc.StatusCode.UNAVAILABLE),
    (RpcError, grpc.StatusCode.UNAVAILABLE),
)


def status_code_for(exc: BaseException) -> grpc.StatusCode:
    """The status code an exception maps to (INTERNAL for anything unexpected)."""
    for cls, code in _CODES:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.INTERNAL


def reason_of(exc: BaseException) -> str:
    """UPPER_SNAKE form of the exception class name (ErrorInfo.reason)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(exc).__name__).upper()


def to_status(exc: BaseException) -> status_pb2.Status:
    """A rich google.rpc.Status for exc, with an ErrorInfo detail."""
    code = status_code_for(exc)
    info = error_details_pb2.ErrorInfo(
        reason=reason_of(exc), domain=ERROR_DOMAIN, metadata={"exception": type(exc).__name__}
    )
    detail = any_pb2.Any()
    detail.Pack(info)
    return status_pb2.Status(
        code=getattr(code_pb2, code.name), message=str(exc) or type(exc).__name__, details=[detail]
    )


def abort_with(context: grpc.ServicerContext, exc: BaseException) -> None:
    """Abort the call with the rich status of exc (raises, as context.abort does)."""
    if status_code_for(exc) is grpc.StatusCode.INTERNAL:
        _log.error("unexpected error in a gRPC handler", exc_info=exc)
    context.abort_with_status(rpc_status.to_status(to_status(exc)))


def rpc_error_from(exc: grpc.RpcError) -> RpcError:
    """Translate a client-side grpc.RpcError into RpcError (once, at the boundary)."""
    code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
    details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
    reason = ""
    if isinstance(exc, grpc.Call):
        try:
            status = rpc_status.from_call(exc)
        except ValueError:
            status = None
        if status is not None:
            for d in status.details:
                info = error_details_pb2.ErrorInfo()
                if d.Is(info.DESCRIPTOR) and d.Unpack(info):
                    reason = info.reason
    return RpcError(details or code.name, code, reason)
