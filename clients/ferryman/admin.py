"""Typed client of the admin and status RPCs (Wrapper-, Deduper-, Flow- and AuditService).

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
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

import grpc
from google.protobuf import field_mask_pb2
from opentelemetry.trace import TracerProvider

from ferryman.config import RpcConfig
from ferryman.errors import ConfigError
from ferryman.rpc import RpcError, open_channel, rpc_error_from
from ferryman.v1 import audit_pb2, audit_pb2_grpc, control_pb2, control_pb2_grpc, flows_pb2, flows_pb2_grpc

T = TypeVar("T")

#: Default deadline of one call, retries included: status reads answer from memory in
#: milliseconds, so 5 s only runs out against a server that is not there or overloaded.
DEFAULT_TIMEOUT_S = 5.0

#: Default deadline of a FlowService call: each one reads the flow store to its end, and a write
#: also fences the other writers and commits a transaction (0.3-2 s here, more on a busy cluster).
FLOW_TIMEOUT_S = 30.0

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


class TlsHandshakeError(ServiceUnavailableError):
    """The TLS handshake failed: an untrusted server certificate, a name mismatch, TLS to a plaintext port."""


class AuthenticationError(AdminError):
    """The server refused the credentials (UNAUTHENTICATED): no token, or a wrong one."""


class PermissionDeniedError(AdminError):
    """The credentials are valid but may not make this call (PERMISSION_DENIED)."""


class ResourceNotFoundError(AdminError):
    """What the call names does not exist, or a source position is not replicated yet (NOT_FOUND)."""


class RequestRejectedError(AdminError):
    """The server refused the request as it stands; the subclasses below name the kind of refusal."""


class WrongServiceError(AdminError):
    """The server does not serve this RPC (UNIMPLEMENTED): a wrapper asked for deduper status, say."""


class InvalidArgumentError(RequestRejectedError):
    """The server refused a value (INVALID_ARGUMENT); ``metadata["field"]`` names the field when it is one."""


class PreconditionError(RequestRejectedError):
    """Refused in the current state (FAILED_PRECONDITION, OUT_OF_RANGE): a feature off, not live-changeable, a cycle.

    ``metadata["field"]`` names the field when the refusal is about one.
    """


class AlreadyExistsError(RequestRejectedError):
    """What the call would create exists already, a flow of that name say (ALREADY_EXISTS)."""


class ConflictError(RequestRejectedError):
    """A concurrent change won (ABORTED): a stale etag, or other writers of the flow store. Read again and retry."""


_BY_CODE: Mapping[grpc.StatusCode, type[AdminError]] = {
    grpc.StatusCode.UNAVAILABLE: ServiceUnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: ServiceUnavailableError,
    grpc.StatusCode.UNAUTHENTICATED: AuthenticationError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.UNIMPLEMENTED: WrongServiceError,
    grpc.StatusCode.NOT_FOUND: ResourceNotFoundError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.FAILED_PRECONDITION: PreconditionError,
    grpc.StatusCode.OUT_OF_RANGE: PreconditionError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.ABORTED: ConflictError,
}

#: How gRPC words a failed TLS handshake in an UNAVAILABLE status (client side).
_HANDSHAKE_MARKERS = ("handshake failed", "ssl_error", "certificate_verify_failed")


def _translate(exc: grpc.RpcError) -> AdminError:
    """The `AdminError` subclass for a failed call, translated once, here."""
    error = rpc_error_from(exc)
    kind = _BY_CODE.get(error.code, AdminError)
    message = str(error.args[0]) if error.args else error.code.name
    if kind is ServiceUnavailableError and any(m in message.lower() for m in _HANDSHAKE_MARKERS):
        kind = TlsHandshakeError
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

    def __init__(
        self,
        address: str,
        rpc: RpcConfig | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        """Open a channel to address (``host:port``); connecting happens on the first call.

        Args:
            address: the service's gRPC address.
            rpc: TLS and token settings (plaintext, no token by default).
            timeout_s: default deadline of each call, retries included.
            tracer_provider: where CLIENT spans of the calls go (e.g. ``Tracing.provider``); None: no spans.
        """
        self.address = address
        self._timeout_s = timeout_s
        self._channel = open_channel(address, rpc or RpcConfig(), tracer_provider=tracer_provider)
        self._wrapper = control_pb2_grpc.WrapperServiceStub(self._channel)
        self._deduper = control_pb2_grpc.DeduperServiceStub(self._channel)
        self._flows = flows_pb2_grpc.FlowServiceStub(self._channel)
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

    def translate_offsets(
        self, topic: str, partition: int, offset: int, *, timeout_s: float | None = None
    ) -> control_pb2.TranslateOffsetsResponse:
        """``DeduperService.TranslateOffsets``: where the record at a source position was written.

        Raises:
            ResourceNotFoundError: the position is not replicated yet, or has no offset mapping.
            InvalidArgumentError: a field out of range (``metadata["field"]``).
            PreconditionError: the flow writes no offset map.
            AdminError: another subclass naming the failure (`WrongServiceError` from a wrapper).
        """
        request = control_pb2.TranslateOffsetsRequest(topic=topic, partition=partition, offset=offset)
        return self._safe_call(lambda t: self._deduper.TranslateOffsets(request, timeout=t), timeout_s)

    def group_offsets(self, group: str, *, timeout_s: float | None = None) -> control_pb2.GetGroupOffsetsResponse:
        """``WrapperService.GetGroupOffsets``: a consumer group's committed offsets of the flow's source topics.

        Raises:
            InvalidArgumentError: no group named.
            AdminError: another subclass naming the failure (`WrongServiceError` from a deduper).
        """
        request = control_pb2.GetGroupOffsetsRequest(group=group)
        return self._safe_call(lambda t: self._wrapper.GetGroupOffsets(request, timeout=t), timeout_s)

    def translate_group_offsets(
        self, group: str, source_offsets: Sequence[control_pb2.GroupOffset], *, timeout_s: float | None = None
    ) -> control_pb2.TranslateGroupOffsetsResponse:
        """``DeduperService.TranslateGroupOffsets``: where the group resumes at the destination.

        source_offsets: the group's committed source offsets (`group_offsets`).

        Raises:
            InvalidArgumentError: a field out of range (``metadata["field"]``).
            PreconditionError: the flow writes no offset map.
            AdminError: another subclass naming the failure (`WrongServiceError` from a wrapper).
        """
        request = control_pb2.TranslateGroupOffsetsRequest(group=group, source_offsets=source_offsets)
        return self._safe_call(lambda t: self._deduper.TranslateGroupOffsets(request, timeout=t), timeout_s)

    def commit_group_offsets(
        self, group: str, source_offsets: Sequence[control_pb2.GroupOffset], *, timeout_s: float | None = None
    ) -> control_pb2.CommitGroupOffsetsResponse:
        """``DeduperService.CommitGroupOffsets``: translate, and commit for the group at the destination.

        Raises:
            InvalidArgumentError: a field out of range (``metadata["field"]``).
            PreconditionError: the flow writes no offset map, the group has members at the destination, or a
                partition is not replicated yet (nothing is committed then).
            AdminError: another subclass naming the failure (`WrongServiceError` from a wrapper).
        """
        request = control_pb2.CommitGroupOffsetsRequest(group=group, source_offsets=source_offsets)
        return self._safe_call(lambda t: self._deduper.CommitGroupOffsets(request, timeout=t), timeout_s)

    def service_status(self, *, timeout_s: float | None = None) -> ServiceStatus:
        """The status of whichever service listens at the address.

        Raises:
            AdminError: neither status call succeeded.
        """
        try:
            return ServiceStatus(role="deduper", deduper=self.deduper_status(timeout_s=timeout_s))
        except WrongServiceError:
            return ServiceStatus(role="wrapper", wrapper=self.wrapper_status(timeout_s=timeout_s))

    # ------------------------------------------------------------------ flows (FlowService, on dedupers)
    def list_flows(self, *, timeout_s: float | None = None) -> list[flows_pb2.Flow]:
        """``FlowService.ListFlows``: every flow stored in the deduper's destination cluster, by name.

        Raises:
            AdminError: a subclass naming the failure (`WrongServiceError` from a wrapper).
        """
        request = flows_pb2.ListFlowsRequest()
        return list(
            self._safe_call(lambda t: self._flows.ListFlows(request, timeout=t), self._flow_timeout(timeout_s)).flows
        )

    def get_flow(self, name: str, *, timeout_s: float | None = None) -> flows_pb2.Flow:
        """``FlowService.GetFlow``.

        Raises:
            ResourceNotFoundError: no flow of that name.
        """
        request = flows_pb2.GetFlowRequest(name=name)
        return self._safe_call(lambda t: self._flows.GetFlow(request, timeout=t), self._flow_timeout(timeout_s)).flow

    def create_flow(self, flow: flows_pb2.Flow, *, timeout_s: float | None = None) -> flows_pb2.Flow:
        """``FlowService.CreateFlow`` (never retried: a lost answer could hide a success).

        Raises:
            AlreadyExistsError: the name is taken.
            InvalidArgumentError: a value is refused (``metadata["field"]``).
            PreconditionError: the flow would close a replication cycle.
        """
        request = flows_pb2.CreateFlowRequest(flow=flow)
        return self._call(lambda t: self._flows.CreateFlow(request, timeout=t), self._flow_timeout(timeout_s)).flow

    def update_flow(
        self,
        flow: flows_pb2.Flow,
        paths: list[str] | None = None,
        *,
        etag: str = "",
        timeout_s: float | None = None,
    ) -> flows_pb2.Flow:
        """``FlowService.UpdateFlow``: the fields at paths taken from flow (all for None), if etag is current.

        Raises:
            ResourceNotFoundError: no such flow.
            ConflictError: etag is stale.
            InvalidArgumentError: a value or an immutable field is refused.
            PreconditionError: a field that cannot change live, or a cycle.
        """
        request = flows_pb2.UpdateFlowRequest(
            flow=flow, update_mask=field_mask_pb2.FieldMask(paths=paths or []), etag=etag
        )
        return self._call(lambda t: self._flows.UpdateFlow(request, timeout=t), self._flow_timeout(timeout_s)).flow

    def delete_flow(self, name: str, *, etag: str = "", timeout_s: float | None = None) -> None:
        """``FlowService.DeleteFlow`` (not retried: a repeat would answer NOT_FOUND).

        Raises:
            ResourceNotFoundError: no such flow.
            ConflictError: etag is stale.
        """
        request = flows_pb2.DeleteFlowRequest(name=name, etag=etag)
        self._call(lambda t: self._flows.DeleteFlow(request, timeout=t), self._flow_timeout(timeout_s))

    def pause_flow(self, name: str, *, timeout_s: float | None = None) -> flows_pb2.Flow:
        """``FlowService.PauseFlow`` (idempotent, so retried on UNAVAILABLE).

        Raises:
            ResourceNotFoundError: no such flow.
        """
        request = flows_pb2.PauseFlowRequest(name=name)
        return self._safe_call(lambda t: self._flows.PauseFlow(request, timeout=t), self._flow_timeout(timeout_s)).flow

    def resume_flow(self, name: str, *, timeout_s: float | None = None) -> flows_pb2.Flow:
        """``FlowService.ResumeFlow`` (idempotent, so retried on UNAVAILABLE).

        Raises:
            ResourceNotFoundError: no such flow.
        """
        request = flows_pb2.ResumeFlowRequest(name=name)
        return self._safe_call(lambda t: self._flows.ResumeFlow(request, timeout=t), self._flow_timeout(timeout_s)).flow

    def _flow_timeout(self, timeout_s: float | None) -> float:
        return timeout_s if timeout_s is not None else max(self._timeout_s, FLOW_TIMEOUT_S)

    def _call(self, call: Callable[[float], T], timeout_s: float | None) -> T:
        """call(deadline) once: for calls that must not be repeated blindly."""
        try:
            return call(self._timeout_s if timeout_s is None else timeout_s)
        except grpc.RpcError as exc:
            raise _translate(exc) from None

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
        return self._call(lambda t: self._audit.StartAudit(request, timeout=t).run, timeout)

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
                error = _translate(exc)
                # A Ferryman server that answers UNAVAILABLE with a reason has waited for what it lacks (its
                # cluster, within this deadline) already: only a server not answering at all is asked again.
                if error.code != grpc.StatusCode.UNAVAILABLE or error.reason or attempt >= len(_RETRY_BACKOFF_S):
                    raise error from None
                backoff_s = _RETRY_BACKOFF_S[attempt]
                if time.monotonic() + backoff_s >= deadline:
                    raise error from None
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
