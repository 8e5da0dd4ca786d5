"""``AuditService``: the audit scheduler's gRPC admin API (start an audit, follow it, read results).

The scheduler process serves it (``auditor.listen_address``) with the project's server plumbing
(`ferryman.rpc.serving`: TLS, the bearer token, error mapping, tracing, health). Errors are
Ferryman errors raised here and mapped once by the error-mapping interceptor: an unknown flow or
run is NOT_FOUND (`NotFoundError`), a bad range INVALID_ARGUMENT naming the field (`ConfigError`),
a start while a started run is in progress FAILED_PRECONDITION (`BusyError`), an audit topic that
cannot be read UNAVAILABLE.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import grpc
from ferryman.client_config import base_config
from ferryman.config import RpcConfig
from ferryman.errors import ConfigError, KafkaOperationError, NotFoundError
from ferryman.naming import FlowNames
from ferryman.rpc import RpcServer, call_deadline, serving
from ferryman.v1 import audit_pb2, audit_pb2_grpc

from ferryman_auditor._convert import counts, range_from_proto, range_to_proto, run_of_report
from ferryman_auditor._errors import AuditError
from ferryman_auditor._report import AuditReport
from ferryman_auditor._runs import FAILED, FINISHED, QUEUED, RUNNING, AuditRuns, StartedRun
from ferryman_auditor._store import AuditStore

if TYPE_CHECKING:
    from ferryman.config import FlowConfig
    from ferryman.deadline import Deadline

#: Full name of the service, for health and reflection.
AUDIT_SERVICE = audit_pb2.DESCRIPTOR.services_by_name["AuditService"].full_name

#: How often a followed run's Spark task counts are sent while nothing else changes: often
#: enough for a progress bar to move, rare enough to cost nothing.
_FOLLOW_POLL_S = 0.5

_STATES = {
    QUEUED: audit_pb2.AUDIT_STATE_QUEUED,
    RUNNING: audit_pb2.AUDIT_STATE_RUNNING,
    FINISHED: audit_pb2.AUDIT_STATE_FINISHED,
    FAILED: audit_pb2.AUDIT_STATE_FAILED,
}


class AuditServicer(audit_pb2_grpc.AuditServiceServicer):
    """Serves `AuditService` for the flows of ``runs.config``; an empty flow means ``default_flow``."""

    def __init__(self, runs: AuditRuns, default_flow: str) -> None:
        self._runs = runs
        self._default_flow = default_flow

    def StartAudit(  # noqa: N802 -- gRPC's method name
        self, request: audit_pb2.StartAuditRequest, context: grpc.ServicerContext
    ) -> audit_pb2.StartAuditResponse:
        flow = self._flow(request.flow)
        run = self._runs.start(flow, range_from_proto(request.range))
        return audit_pb2.StartAuditResponse(run=_run_message(run))

    def FollowAudit(  # noqa: N802
        self, request: audit_pb2.FollowAuditRequest, context: grpc.ServicerContext
    ) -> Iterator[audit_pb2.FollowAuditResponse]:
        flow = self._flow(request.flow)
        run = self._runs.get(request.run_id) if request.run_id else None
        if run is None or run.flow != flow.name:
            yield audit_pb2.FollowAuditResponse(result=self._stored_run(flow, request.run_id, call_deadline(context)))
            return
        seen, last = -1, None
        while context.is_active():
            version = self._runs.wait_change(run, seen, _FOLLOW_POLL_S)
            if run.done:
                yield audit_pb2.FollowAuditResponse(result=_run_message(run))
                return
            progress = self._progress(run)
            if version != seen or progress != last:
                yield audit_pb2.FollowAuditResponse(progress=progress)
            seen, last = version, progress

    def GetAudit(  # noqa: N802
        self, request: audit_pb2.GetAuditRequest, context: grpc.ServicerContext
    ) -> audit_pb2.GetAuditResponse:
        flow = self._flow(request.flow)
        run = self._runs.get(request.run_id) if request.run_id else None
        if run is not None and run.flow == flow.name:
            return audit_pb2.GetAuditResponse(run=_run_message(run))
        return audit_pb2.GetAuditResponse(run=self._stored_run(flow, request.run_id, call_deadline(context)))

    def ListAudits(  # noqa: N802
        self, request: audit_pb2.ListAuditsRequest, context: grpc.ServicerContext
    ) -> audit_pb2.ListAuditsResponse:
        flow = self._flow(request.flow)
        if request.limit < 0:
            raise ConfigError(f"limit = {request.limit}: a limit is 0 (all) or more")
        stored = self._stored(flow, call_deadline(context))
        ids = {r.run_id for r in stored}
        runs = [run_of_report(r, with_partitions=False) for r in stored]
        runs += [_run_message(r, with_partitions=False) for r in self._runs.of_flow(flow.name) if r.run_id not in ids]
        return audit_pb2.ListAuditsResponse(runs=runs[-request.limit :] if request.limit else runs)

    def _flow(self, name: str) -> FlowConfig:
        wanted = name or self._default_flow
        for flow in self._runs.config.flows:
            if flow.name == wanted:
                return flow
        known = ", ".join(f.name for f in self._runs.config.flows)
        raise NotFoundError(f"flow {wanted!r} is not in the scheduler's configuration (flows: {known})")

    def _stored(self, flow: FlowConfig, deadline: Deadline) -> list[AuditReport]:
        """The flow's stored runs; KafkaOperationError (UNAVAILABLE) when its cluster does not answer in time."""
        cluster = self._runs.config.clusters[flow.target]
        store = AuditStore(
            base_config(cluster, "ferryman-auditor-api"), FlowNames.of(flow).audit_topic, self._runs.settings.timeout_s
        )
        try:
            return list(store.load(deadline).runs)
        except AuditError as exc:
            raise KafkaOperationError(f"reading the audit topic of flow {flow.name}", exc) from exc

    def _stored_run(self, flow: FlowConfig, run_id: str, deadline: Deadline) -> audit_pb2.AuditRun:
        stored = self._stored(flow, deadline)
        chosen = [r for r in stored if r.run_id == run_id] if run_id else stored[-1:]
        if not chosen:
            raise NotFoundError(
                f"flow {flow.name} has no audit {run_id}" if run_id else f"flow {flow.name} has no audit yet"
            )
        return run_of_report(chosen[0])

    def _progress(self, run: StartedRun) -> audit_pb2.AuditProgress:
        done = total = 0
        if run.state == RUNNING:
            tracker = self._runs.spark.sparkContext.statusTracker()
            stages = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
            total = sum(s.numTasks for s in stages if s is not None)
            done = sum(s.numCompletedTasks for s in stages if s is not None)
        return audit_pb2.AuditProgress(state=_STATES[run.state], step=run.step, tasks_done=done, tasks_total=total)


def _run_message(run: StartedRun, *, with_partitions: bool = True) -> audit_pb2.AuditRun:
    if run.report is not None:
        return run_of_report(run.report, with_partitions=with_partitions)
    message = audit_pb2.AuditRun(
        run_id=run.run_id,
        flow=run.flow,
        state=_STATES[run.state],
        range=range_to_proto(run.range.describe()),
        started_at_ms=run.started_at_ms,
        error=run.error,
    )
    message.totals.CopyFrom(counts({}))
    return message


@contextlib.contextmanager
def serve_audit_api(
    runs: AuditRuns, default_flow: str, *, listen_address: str, rpc: RpcConfig, shutdown_timeout_s: float = 0.0
) -> Iterator[RpcServer]:
    """Serve `AuditService` on listen_address (SERVING at once: the session is up) until the block ends.

    On leaving: health NOT_SERVING, a started run in progress gets shutdown_timeout_s to finish (its
    followers still served), then it is cancelled, then the server stops.

    Raises:
        RpcBindError: the address cannot be bound.
        ConfigError: the TLS settings are incomplete.
    """
    servicer = AuditServicer(runs, default_flow)
    with serving(
        "audit scheduler",
        listen_address=listen_address,
        rpc=rpc,
        register=[lambda server: audit_pb2_grpc.add_AuditServiceServicer_to_server(servicer, server)],
        service_names=[AUDIT_SERVICE],
    ) as server:
        server.set_serving(AUDIT_SERVICE, True)
        try:
            yield server
        finally:
            server.begin_drain()
            runs.shutdown(shutdown_timeout_s)
