"""The wrapper's status: ``ferryman.v1.WrapperService`` and the snapshot it (and the metrics) serve.

Read from gRPC and metrics threads while the loop runs: it only reads
counters and collections the loop replaces or updates in place.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc
from ferryman.config import FlowConfig
from ferryman.errors import PreconditionError
from ferryman.health import ClusterHealth
from ferryman.rpc import call_deadline
from ferryman.status import package_version
from ferryman.v1 import control_pb2, control_pb2_grpc

from ferryman_wrapper._clients import LoopClients
from ferryman_wrapper._datapath import DataPath
from ferryman_wrapper._group_offsets import MAX_BUDGET_S as GROUP_BUDGET_S
from ferryman_wrapper._group_offsets import SourceGroupOffsets
from ferryman_wrapper._links import DeduperLinks


class WrapperStatusServicer(control_pb2_grpc.WrapperServiceServicer):
    """``ferryman.v1.WrapperService``: status for operators and tools."""

    def __init__(
        self, status: Callable[[], control_pb2.GetWrapperStatusResponse], groups: SourceGroupOffsets | None = None
    ) -> None:
        self._status = status
        self._groups = groups

    def GetWrapperStatus(  # noqa: N802 (gRPC method name)
        self, request: control_pb2.GetWrapperStatusRequest, context: grpc.ServicerContext
    ) -> control_pb2.GetWrapperStatusResponse:
        """Snapshot of counters, pause state and partition progress."""
        return self._status()

    def GetGroupOffsets(  # noqa: N802 (gRPC method name)
        self, request: control_pb2.GetGroupOffsetsRequest, context: grpc.ServicerContext
    ) -> control_pb2.GetGroupOffsetsResponse:
        """A consumer group's committed offsets of the flow's source topics (`SourceGroupOffsets`)."""
        if self._groups is None:
            raise PreconditionError("this wrapper does not read group offsets")
        return self._groups.read(request, call_deadline(context).cap(GROUP_BUDGET_S))


class WrapperStatus:
    """Builds the status snapshot from the wrapper's parts (any thread)."""

    def __init__(
        self,
        *,
        wrapper_id: str,
        flow: Callable[[], FlowConfig],
        data: DataPath,
        clients: LoopClients,
        dedupers: DeduperLinks,
        source_health: ClusterHealth,
        target_health: ClusterHealth,
        recovering: Callable[[], str],
    ) -> None:
        """Prepare.

        Args:
            wrapper_id: this process's identity.
            flow: the flow as it is now (the store may change it).
            data: the data path (records and envelopes sent, records lost).
            clients: the loop's clients (rewinds, rebuilds).
            dedupers: the control links (pause, watermarks, progress, resends).
            source_health: the source cluster's health.
            target_health: the staging cluster's health.
            recovering: why the last step failed, while the loop recovers from it ("" otherwise).
        """
        self._wrapper_id = wrapper_id
        self._flow = flow
        self._data = data
        self._clients = clients
        self._dedupers = dedupers
        self._source_health = source_health
        self._target_health = target_health
        self._recovering = recovering

    def snapshot(self) -> control_pb2.GetWrapperStatusResponse:
        """Snapshot for WrapperService.GetWrapperStatus (called from gRPC threads)."""
        dedupers = self._dedupers
        return control_pb2.GetWrapperStatusResponse(
            wrapper_id=self._wrapper_id,
            flow=self._flow().name,
            records_sent=self._data.records_sent,
            envelopes_sent=self._data.envelopes_sent,
            rewinds=self._clients.rewinds,
            paused=dedupers.paused,
            pause_reason=dedupers.pause_wanted[1] if dedupers.paused else "",
            control_connected=any(link.connected for link in dedupers.links),
            resends_served=dedupers.resender.served if dedupers.links else 0,
            partitions=dedupers.progress_snapshot,
            watermarks=[w for _, w in sorted(dict(dedupers.watermarks).items())],
            unavailable_reason=self.unavailable_reason(),
            producer_rebuilds=self._clients.producer_rebuilds,
            source_records_lost=self._data.source_records_lost,
            version=package_version(),
            control_links=[
                control_pb2.ControlLinkState(address=link.address, connected=link.connected)
                for link in list(dedupers.links)
            ],
            held_partitions=[
                control_pb2.HeldPartition(topic=k.topic, partition=k.partition, offset=at, envelope_bytes=size)
                for k, at, size in self._data.held()
            ],
        )

    def unavailable_reason(self) -> str:
        """Why the wrapper is NOT_SERVING ("" when it is serving): a cluster unreachable, or a recovery."""
        for health in (self._source_health, self._target_health):
            if not health.reachable:
                return f"{health.name} unreachable: {health.reason}"
        recovering = self._recovering()
        return f"recovering: {recovering}" if recovering else ""
