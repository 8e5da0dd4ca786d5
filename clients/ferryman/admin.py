"""Typed client of the services' admin and status RPCs (``WrapperService``, ``DeduperService``, ``AuditService``).

`FerrymanAdmin` keeps one channel to one service (TLS and the bearer token as ``RpcConfig``
says), gives every call a default deadline, retries only calls that are safe to repeat (the
status reads, on UNAVAILABLE, within the deadline), and raises `AdminError` subclasses that
carry the gRPC status: code, message, and the ``ErrorInfo`` reason a Ferryman server sent.

Example::

    with FerrymanAdmin("deduper-1:7460") as admin:
        status = admin.service_status()
        print(status.role, status.deduper.records_written if status.deduper else "")
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal, TypeVar

import grpc

from ferryman.config import RpcConfig
from ferryman.errors import ConfigError
from ferryman.rpc import RpcError, open_channel, rpc_error_from
from ferryman.v1 import audit_pb2, audit_pb2_grpc, control_pb2, control_pb2_grpc

T = TypeVar("T")

#: Default deadline of one call, retries included: status reads answer from memory in
#: milliseconds, so 5 s only runs out against a server that is not there or overloaded.
DEFAULT_TIMEOUT_S = 5.0

#: Waits before the retries of a safe call that found the server UNAVAILABLE (a restart, a
#: connection being set up); short, as a person is usually waiting.
_RETRY_BACKOFF_S = (0.1, 0.3, 1.0)

#: Default deadline of the audit reads (get_audit, list_audits) and of start_audit: the scheduler
#: reads the flow's audit topic from the destination cluster for each, which takes a Kafka round
#: trip or a few, longer than a status read from memory.
AUDIT_TIMEOUT_S = 30.0

#: Default deadline of follow_audit: the stream lasts as long as the audit (plus its wait for the
#: scheduler's run in progress); an hour covers an incremental audit, a longer one sets its own.
FOLLOW_TIMEOUT_S = 3600.0


class AdminError(RpcError):
    """A call of the admin client failed; ``code``, ``reason`` and ``metadata`` are the gRPC status."""


class ServiceUnavailableError(AdminError):
    """No answer: nothing listens at the address, it is unreachable, or the deadline passed."""


class AuthenticationError(AdminError):
    """The server refused the credentials (UNAUTHENTICATED): no token, or a wrong one."""


class PermissionDeniedError(AdminError):
    """The credentials are valid but may not make this call (PERMISSION_DENIED)."""


class WrongServiceError(AdminError):
    """The server does not serve this RPC (UNIMPLEMENTED): a wrapper asked for deduper status, say."""


_BY_CODE: Mapping[grpc.StatusCode, type[AdminError]] = {
    grpc.StatusCode.UNAVAILABLE: ServiceUnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: ServiceUnavailableError,
    grpc.StatusCode.UNAUTHENTICATED: AuthenticationError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.UNIMPLEMENTED: WrongServiceError,
}


def _translate(exc: grpc.RpcError) -> AdminError:
    """The `AdminError` subclass for a failed call, translated once, here."""
    error = rpc_error_from(exc)
    kind = _BY_CODE.get(error.code, AdminError)
    message = str(error.args[0]) if error.args else error.code.name
    return kind(message, error.code, error.reason, error.metadata)


@dataclass(frozen=True)
class ServiceStatus:
    """The status of a service whose role was not known in advance (`FerrymanAdmin.service_status`)."""

    role: Literal["wrapper", "deduper"]
    """Which service answered."""
    wrapper: control_pb2.GetWrapperStatusResponse | None = None
    """The wrapper's status when role is ``wrapper``."""
    deduper: control_pb2.GetDeduperStatusResponse | None = None
    """The deduper's status when role is ``deduper``."""


class FerrymanAdmin:
    """A client of one wrapper's or deduper's gRPC server; close() (or ``with``) releases its channel."""

    def __init__(self, address: str, rpc: RpcConfig | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """Open a channel to address (``host:port``); connecting happens on the first call.

        Args:
            address: the service's gRPC address.
            rpc: TLS and token settings (plaintext, no token by default).
            timeout_s: default deadline of each call, retries included.
        """
        self.address = address
        self._timeout_s = timeout_s
        self._channel = open_channel(address, rpc or RpcConfig())
        self._wrapper = control_pb2_grpc.WrapperServiceStub(self._channel)
        self._deduper = control_pb2_grpc.DeduperServiceStub(self._channel)
        self._audit = audit_pb2_grpc.AuditServiceStub(self._channel)

    def close(self) -> None:
        """Close the channel (idempotent)."""
        self._channel.close()

    def __enter__(self) -> FerrymanAdmin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wrapper_status(self, *, timeout_s: float | None = None) -> control_pb2.GetWrapperStatusResponse:
        """``WrapperService.GetWrapperStatus``: counters, pause state, control link, partition progress.

        Raises:
            AdminError: a subclass naming the failure (`WrongServiceError` from a deduper).
        """
        request = control_pb2.GetWrapperStatusRequest()
        return self._safe_call(lambda t: self._wrapper.GetWrapperStatus(request, timeout=t), timeout_s)

    def deduper_status(self, *, timeout_s: float | None = None) -> control_pb2.GetDeduperStatusResponse:
        """``DeduperService.GetDeduperStatus``: counters, watermarks and lag, connected wrappers.

        Raises:
            AdminError: a subclass naming the failure (`WrongServiceError` from a wrapper).
        """
        request = control_pb2.GetDeduperStatusRequest()
        return self._safe_call(lambda t: self._deduper.GetDeduperStatus(request, timeout=t), timeout_s)

    def service_status(self, *, timeout_s: float | None = None) -> ServiceStatus:
        """The status of whichever service listens at the address.

        Raises:
            AdminError: neither status call succeeded.
        """
        try:
            return ServiceStatus(role="deduper", deduper=self.deduper_status(timeout_s=timeout_s))
        except WrongServiceError:
            return ServiceStatus(role="wrapper", wrapper=self.wrapper_status(timeout_s=timeout_s))

    def start_audit(
        self,
        flow: str = "",
        *,
        topics: tuple[str, ...] = (),
        start_offsets: Mapping[int, int] | None = None,
        end_offsets: Mapping[int, int] | None = None,
        start_ms: int | None = None,
        end_ms: int | None = None,
        timeout_s: float | None = None,
    ) -> audit_pb2.AuditRun:
        """``AuditService.StartAudit`` at an audit scheduler: queue an audit, return the run (QUEUED or RUNNING).

        The range is as ``ferryman audit run`` takes it: source offsets (``start_offsets``/``end_offsets``),
        a time window (``start_ms``/``end_ms``), or neither (since the last verified position). Never
        retried: a start whose answer was lost may have started a run (`list_audits` shows it).

        Raises:
            AdminError: ``code`` INVALID_ARGUMENT (a bad range: the message names the field), NOT_FOUND
                (no such flow), FAILED_PRECONDITION (a started run is in progress: ``metadata["run_id"]``).
        """
        request = audit_pb2.StartAuditRequest(
            flow=flow, range=audit_range(topics, start_offsets, end_offsets, start_ms, end_ms)
        )
        timeout = AUDIT_TIMEOUT_S if timeout_s is None else timeout_s
        try:
            return self._audit.StartAudit(request, timeout=timeout).run
        except grpc.RpcError as exc:
            raise _translate(exc) from None

    def follow_audit(
        self, run_id: str, flow: str = "", *, timeout_s: float | None = None
    ) -> Iterator[audit_pb2.FollowAuditResponse]:
        """``AuditService.FollowAudit``: the run's progress events, the last one its result (``result``).

        Not retried (a broken stream raises; following again is safe).

        Raises:
            AdminError: while iterating; NOT_FOUND for an unknown flow or run.
        """
        request = audit_pb2.FollowAuditRequest(flow=flow, run_id=run_id)
        stream = self._audit.FollowAudit(request, timeout=FOLLOW_TIMEOUT_S if timeout_s is None else timeout_s)
        try:
            yield from stream
        except grpc.RpcError as exc:
            raise _translate(exc) from None
        finally:
            stream.cancel()

    def get_audit(self, run_id: str = "", flow: str = "", *, timeout_s: float | None = None) -> audit_pb2.AuditRun:
        """``AuditService.GetAudit``: one run with its per-partition results (default: the latest stored).

        Raises:
            AdminError: NOT_FOUND for an unknown flow or run.
        """
        request = audit_pb2.GetAuditRequest(flow=flow, run_id=run_id)
        return self._safe_call(
            lambda t: self._audit.GetAudit(request, timeout=t).run, AUDIT_TIMEOUT_S if timeout_s is None else timeout_s
        )

    def list_audits(
        self, flow: str = "", *, limit: int = 0, timeout_s: float | None = None
    ) -> list[audit_pb2.AuditRun]:
        """``AuditService.ListAudits``: a flow's runs, oldest first, without partitions (limit: the most recent).

        Raises:
            AdminError: NOT_FOUND for an unknown flow.
        """
        request = audit_pb2.ListAuditsRequest(flow=flow, limit=limit)
        return self._safe_call(
            lambda t: list(self._audit.ListAudits(request, timeout=t).runs),
            AUDIT_TIMEOUT_S if timeout_s is None else timeout_s,
        )

    def _safe_call(self, call: Callable[[float], T], timeout_s: float | None) -> T:
        """call(remaining deadline), repeated on UNAVAILABLE: only for calls that change nothing."""
        deadline = time.monotonic() + (self._timeout_s if timeout_s is None else timeout_s)
        attempt = 0
        while True:
            try:
                return call(max(deadline - time.monotonic(), 0.001))
            except grpc.RpcError as exc:
                code = exc.code() if isinstance(exc, grpc.Call) else None
                if code != grpc.StatusCode.UNAVAILABLE or attempt >= len(_RETRY_BACKOFF_S):
                    raise _translate(exc) from None
                backoff_s = _RETRY_BACKOFF_S[attempt]
                if time.monotonic() + backoff_s >= deadline:
                    raise _translate(exc) from None
            attempt += 1
            time.sleep(backoff_s)  # a retry's backoff, bounded by the call's deadline


def audit_range(
    topics: tuple[str, ...] = (),
    start_offsets: Mapping[int, int] | None = None,
    end_offsets: Mapping[int, int] | None = None,
    start_ms: int | None = None,
    end_ms: int | None = None,
) -> audit_pb2.AuditRange:
    """The ``AuditRange`` message of `FerrymanAdmin.start_audit`'s arguments (the server checks the values).

    Raises:
        ConfigError: both source offsets and a time window.
    """
    if (start_offsets is not None or end_offsets is not None) and (start_ms is not None or end_ms is not None):
        raise ConfigError("an audit range is source offsets or a time window, not both")
    message = audit_pb2.AuditRange(topics=list(topics))
    if start_offsets is not None or end_offsets is not None:
        message.offsets.start_offsets.update(start_offsets or {})
        message.offsets.end_offsets.update(end_offsets or {})
        message.offsets.SetInParent()
    if start_ms is not None or end_ms is not None:
        message.time_window.start_ms = start_ms or 0
        if end_ms is not None:
            message.time_window.end_ms = end_ms
        message.time_window.SetInParent()
    return message
