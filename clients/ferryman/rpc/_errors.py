"""gRPC errors: Ferryman errors to rich statuses (server side) and back (client side)."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import NoReturn

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from ferryman.errors import (
    AlreadyExistsError,
    BusyError,
    ConfigError,
    ConflictError,
    EnvelopeError,
    FencedError,
    FerrymanError,
    FlowNotStoredYetError,
    InvalidRequestError,
    KafkaOperationError,
    NotFoundError,
    PreconditionError,
    SourceDataLostError,
    TopicShapeError,
)

_log = logging.getLogger(__name__)

#: ``ErrorInfo.domain`` of every error a Ferryman server reports.
ERROR_DOMAIN = "ferryman"

#: Longest status message sent. The message travels in the ``grpc-message``
#: header and again inside ``grpc-status-details-bin``; an exception carrying a
#: whole record dump must not push the trailers past gRPC's 8 KiB metadata limit.
_MAX_MESSAGE_CHARS = 1024


class IncompatiblePeerError(FerrymanError):
    """The peer speaks another major version of the control protocol, or serves another flow."""


class RpcBindError(FerrymanError):
    """A gRPC server could not listen on its address (in use, not local, malformed)."""


class RpcError(FerrymanError):
    """A gRPC call failed: the status, translated once at the client boundary by `rpc_error_from`.

    Attributes:
        code: The gRPC status code.
        reason: ``ErrorInfo.reason`` sent by a Ferryman server (for example
            ``FENCED_ERROR``), or ``""`` when the status carried none.
        metadata: ``ErrorInfo.metadata`` sent with the reason (empty if none).
    """

    def __init__(
        self, message: str, code: grpc.StatusCode, reason: str = "", metadata: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.metadata: Mapping[str, str] = dict(metadata or {})

    def __str__(self) -> str:
        reason = f" [{self.reason}]" if self.reason else ""
        return f"{self.code.name}: {super().__str__()}{reason}"


#: Most specific first: the first matching class decides.
_CODES: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (IncompatiblePeerError, grpc.StatusCode.FAILED_PRECONDITION),
    (ConfigError, grpc.StatusCode.INVALID_ARGUMENT),
    (InvalidRequestError, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFoundError, grpc.StatusCode.NOT_FOUND),
    (PreconditionError, grpc.StatusCode.FAILED_PRECONDITION),
    (AlreadyExistsError, grpc.StatusCode.ALREADY_EXISTS),
    (ConflictError, grpc.StatusCode.ABORTED),
    (EnvelopeError, grpc.StatusCode.INVALID_ARGUMENT),
    (TopicShapeError, grpc.StatusCode.FAILED_PRECONDITION),
    (FencedError, grpc.StatusCode.ABORTED),
    (SourceDataLostError, grpc.StatusCode.DATA_LOSS),
    (KafkaOperationError, grpc.StatusCode.UNAVAILABLE),
    (FlowNotStoredYetError, grpc.StatusCode.UNAVAILABLE),
)

_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def status_code_for(exc: BaseException) -> grpc.StatusCode:
    """The status code a handler's exception is reported with.

    Ferryman errors map to precise codes; anything else (including a
    `RpcError` from a downstream call, whose code describes another hop) is
    ``INTERNAL``. Never ``UNKNOWN``.
    """
    for cls, code in _CODES:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.INTERNAL


def error_reason(exc: BaseException) -> str:
    """``ErrorInfo.reason`` for exc: its class name in UPPER_SNAKE (``FencedError`` -> ``FENCED_ERROR``)."""
    return _CAMEL_BOUNDARY.sub("_", type(exc).__name__).upper()


def _error_metadata(exc: BaseException) -> dict[str, str]:
    metadata = {"exception": f"{type(exc).__module__}.{type(exc).__qualname__}"}
    if isinstance(exc, BusyError):
        metadata.update(exc.details)
    if isinstance(exc, KafkaOperationError):
        metadata["operation"] = exc.what
    elif isinstance(exc, (InvalidRequestError, PreconditionError)) and exc.field:
        metadata["field"] = exc.field
    elif isinstance(exc, RpcError):
        metadata["peer_code"] = exc.code.name
        if exc.reason:
            metadata["peer_reason"] = exc.reason
    return metadata


def to_status(exc: BaseException) -> status_pb2.Status:
    """The ``google.rpc.Status`` reported for exc, with one ``ErrorInfo`` detail.

    The message is ``str(exc)`` (never a traceback), cut to a bounded length.
    """
    message = str(exc) or type(exc).__name__
    if len(message) > _MAX_MESSAGE_CHARS:
        message = message[: _MAX_MESSAGE_CHARS - 3] + "..."
    detail = any_pb2.Any()
    detail.Pack(
        error_details_pb2.ErrorInfo(reason=error_reason(exc), domain=ERROR_DOMAIN, metadata=_error_metadata(exc))
    )
    return status_pb2.Status(code=status_code_for(exc).value[0], message=message, details=[detail])


def abort_with(context: grpc.ServicerContext, exc: BaseException) -> NoReturn:
    """End the call with the rich status of exc; raises, as ``context.abort`` does."""
    context.abort_with_status(rpc_status.to_status(to_status(exc)))


def rpc_error_from(exc: grpc.RpcError) -> RpcError:
    """Translate a client-side ``grpc.RpcError`` into `RpcError`, once, at the boundary.

    Reads the rich status (``grpc-status-details-bin``) when the server sent
    one, taking the reason of its ``ErrorInfo``.
    """
    if not isinstance(exc, grpc.Call):
        # Errors raised before a call exists (e.g. grpc.FutureTimeoutError) carry no status.
        return RpcError(str(exc) or type(exc).__name__, grpc.StatusCode.UNKNOWN)
    code = exc.code()
    message = exc.details() or code.name
    reason = ""
    metadata: dict[str, str] = {}
    try:
        status = rpc_status.from_call(exc)
    except ValueError:  # trailers disagree with the status line: ignore the details
        _log.debug("inconsistent rich status from the server", exc_info=True)
        status = None
    if status is not None:
        for detail in status.details:
            info = error_details_pb2.ErrorInfo()
            if detail.Unpack(info):
                reason = info.reason
                metadata = dict(info.metadata)
                break
    return RpcError(message, code, reason, metadata)
