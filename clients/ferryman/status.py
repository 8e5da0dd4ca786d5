"""Status of running services over gRPC: ``WrapperService`` and ``DeduperService``.

One call each, on a channel of its own (``ferryman.rpc.open_channel``: TLS and
the bearer token as ``RpcConfig`` says). For tools that ask now and then, such as
the bench and the tests; a caller asking often should keep a channel and a stub.
"""

from __future__ import annotations

from ferryman.config import RpcConfig
from ferryman.rpc import open_channel
from ferryman.v1 import control_pb2, control_pb2_grpc

#: Default budget of one status call.
STATUS_TIMEOUT_S = 5.0


def wrapper_status(
    address: str, rpc: RpcConfig | None = None, timeout_s: float = STATUS_TIMEOUT_S
) -> control_pb2.GetWrapperStatusResponse:
    """``GetWrapperStatus`` of the wrapper at ``address`` (``host:port``).

    Raises:
        grpc.RpcError: the call failed (not listening, refused, timed out).
    """
    with open_channel(address, rpc or RpcConfig()) as channel:
        response: control_pb2.GetWrapperStatusResponse = control_pb2_grpc.WrapperServiceStub(channel).GetWrapperStatus(
            control_pb2.GetWrapperStatusRequest(), timeout=timeout_s
        )
        return response


def deduper_status(
    address: str, rpc: RpcConfig | None = None, timeout_s: float = STATUS_TIMEOUT_S
) -> control_pb2.GetDeduperStatusResponse:
    """``GetDeduperStatus`` of the deduper at ``address`` (``host:port``).

    Raises:
        grpc.RpcError: the call failed (not listening, refused, timed out).
    """
    with open_channel(address, rpc or RpcConfig()) as channel:
        response: control_pb2.GetDeduperStatusResponse = control_pb2_grpc.DeduperServiceStub(channel).GetDeduperStatus(
            control_pb2.GetDeduperStatusRequest(), timeout=timeout_s
        )
        return response
