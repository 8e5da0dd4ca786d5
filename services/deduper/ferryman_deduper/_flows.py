"""``FlowService`` on the deduper's gRPC server: the flows admin API of the destination cluster.

The servicer only translates: every check and every store access is `ferryman.flows.FlowRegistry`'s,
and its errors (`FlowError` subclasses) become precise status codes in the error-mapping
interceptor (NOT_FOUND, ALREADY_EXISTS, ABORTED, INVALID_ARGUMENT and FAILED_PRECONDITION naming
the field). The one thing it adds: the server answers before start-up has stored the deduper's own flow,
and a request naming that flow meanwhile is UNAVAILABLE ("ask again"), not NOT_FOUND.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import grpc
from ferryman.errors import FlowNotFoundError, FlowNotStoredYetError
from ferryman.flows import FlowRegistry
from ferryman.rpc import call_deadline
from ferryman.v1 import flows_pb2, flows_pb2_grpc

SERVICE_NAME = "ferryman.v1.FlowService"


class FlowServicer(flows_pb2_grpc.FlowServiceServicer):
    """Serves the flows stored in the deduper's destination cluster."""

    def __init__(self, registry: FlowRegistry, storing: Callable[[], str | None] = lambda: None) -> None:
        """``storing``: the name of the deduper's own flow while start-up has not stored it yet, else None."""
        self._registry = registry
        self._storing = storing

    @contextmanager
    def _named(self, name: str) -> Iterator[None]:
        """Around a call on the flow named: NOT_FOUND for the own flow not stored yet becomes UNAVAILABLE."""
        try:
            yield
        except FlowNotFoundError as exc:
            if name and name == self._storing():
                raise FlowNotStoredYetError(
                    f"flow {name!r} is this deduper's own (its configuration file declares it) and is stored once "
                    "the destination cluster answers at start-up: ask again"
                ) from exc
            raise

    def CreateFlow(  # noqa: N802 (gRPC method name)
        self, request: flows_pb2.CreateFlowRequest, context: grpc.ServicerContext
    ) -> flows_pb2.CreateFlowResponse:
        """Store a new flow."""
        return flows_pb2.CreateFlowResponse(flow=self._registry.create(request.flow, call_deadline(context)))

    def GetFlow(  # noqa: N802 (gRPC method name)
        self, request: flows_pb2.GetFlowRequest, context: grpc.ServicerContext
    ) -> flows_pb2.GetFlowResponse:
        """One flow."""
        with self._named(request.name):
            return flows_pb2.GetFlowResponse(flow=self._registry.get(request.name, call_deadline(context)))

    def ListFlows(  # noqa: N802 (gRPC method name)
        self, request: flows_pb2.ListFlowsRequest, context: grpc.ServicerContext
    ) -> flows_pb2.ListFlowsResponse:
        """Every flow, by name."""
        return flows_pb2.ListFlowsResponse(flows=self._registry.list_flows(call_deadline(context)))

    def UpdateFlow(  # noqa: N802 (gRPC method name)
        self, request: flows_pb2.UpdateFlowRequest, context: grpc.ServicerContext
    ) -> flows_pb2.UpdateFlowResponse:
        """Change the masked fields of a flow."""
        with self._named(request.flow.name):
            return flows_pb2.UpdateFlowResponse(
                flow=self._registry.update(request.flow, request.update_mask, request.etag, call_deadline(context))
            )

    def DeleteFlow(  # noqa: N802 (gRPC method name)
        self, request: flows_pb2.DeleteFlowRequest, context: grpc.ServicerContext
    ) -> flows_pb2.DeleteFlowResponse:
        """Delete a flow."""
        with self._named(request.name):
            self._registry.delete(request.name, request.etag, call_deadline(context))
        return flows_pb2.DeleteFlowResponse()

    def PauseFlow(  # noqa: N802 (gRPC method name)
        self, request: flows_pb2.PauseFlowRequest, context: grpc.ServicerContext
    ) -> flows_pb2.PauseFlowResponse:
        """Pause a flow."""
        with self._named(request.name):
            return flows_pb2.PauseFlowResponse(
                flow=self._registry.set_paused(request.name, True, call_deadline(context))
            )

    def ResumeFlow(  # noqa: N802 (gRPC method name)
        self, request: flows_pb2.ResumeFlowRequest, context: grpc.ServicerContext
    ) -> flows_pb2.ResumeFlowResponse:
        """Resume a flow."""
        with self._named(request.name):
            return flows_pb2.ResumeFlowResponse(
                flow=self._registry.set_paused(request.name, False, call_deadline(context))
            )
