"""``FlowService`` on the deduper's gRPC server: the flows admin API of the destination cluster.

The servicer only translates: every check and every store access is `ferryman.flows.FlowRegistry`'s,
and its errors (`FlowError` subclasses) become precise status codes in the error-mapping
interceptor (NOT_FOUND, ALREADY_EXISTS, ABORTED, INVALID_ARGUMENT and FAILED_PRECONDITION naming
the field).
"""

from __future__ import annotations

import grpc
from ferryman.flows import FlowRegistry
from ferryman.rpc import call_deadline
from ferryman.v1 import flows_pb2, flows_pb2_grpc

SERVICE_NAME = "ferryman.v1.FlowService"


class FlowServicer(flows_pb2_grpc.FlowServiceServicer):
    """Serves the flows stored in the deduper's destination cluster."""

    def __init__(self, registry: FlowRegistry) -> None:
        self._registry = registry

    def CreateFlow(  # noqa: N802 (gRPC method name)
        self, request: flows_pb2.CreateFlowRequest, context: grpc.ServicerContext
    ) -> flows_pb2.CreateFlowResponse:
        """Store a new flow."""
        return flows_pb2.CreateFlowResponse(flow=self._registry.create(request.flow, call_deadline(context)))

    def GetFlow(  # noqa: N802 (gRPC method name)
        self, request: flows_pb2.GetFlowRequest, context: grpc.ServicerContext
    ) -> flows_pb2.GetFlowResponse:
        """One flow."""
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
        return flows_pb2.UpdateFlowResponse(
            flow=self._registry.update(request.flow, request.update_mask, request.etag, call_deadline(context))
        )

    def DeleteFlow(  # noqa: N802 (gRPC method name)
        self, request: flows_pb2.DeleteFlowRequest, context: grpc.ServicerContext
    ) -> flows_pb2.DeleteFlowResponse:
        """Delete a flow."""
        self._registry.delete(request.name, request.etag, call_deadline(context))
        return flows_pb2.DeleteFlowResponse()

    def PauseFlow(  # noqa: N802 (gRPC method name)
        self, request: flows_pb2.PauseFlowRequest, context: grpc.ServicerContext
    ) -> flows_pb2.PauseFlowResponse:
        """Pause a flow."""
        return flows_pb2.PauseFlowResponse(flow=self._registry.set_paused(request.name, True, call_deadline(context)))

    def ResumeFlow(  # noqa: N802 (gRPC method name)
        self, request: flows_pb2.ResumeFlowRequest, context: grpc.ServicerContext
    ) -> flows_pb2.ResumeFlowResponse:
        """Resume a flow."""
        return flows_pb2.ResumeFlowResponse(flow=self._registry.set_paused(request.name, False, call_deadline(context)))
