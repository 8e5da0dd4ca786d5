"""Status of running services over gRPC: ``WrapperService`` and ``DeduperService``.

One call each, on a channel of its own (``ferryman.rpc.open_channel``: TLS and
the bearer token as ``RpcConfig`` says). For tools that ask now and then, such as
the bench and the tests; a caller asking often should keep a channel and a stub.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from importlib import metadata
from typing import TypeVar

import grpc

from ferryman.config import RpcConfig
from ferryman.rpc import open_channel
from ferryman.v1 import control_pb2, control_pb2_grpc

T = TypeVar("T")

#: Default budget of one status call.
STATUS_TIMEOUT_S = 5.0


@functools.cache
def package_version() -> str:
    """The installed Ferryman version (what the status RPCs report), ``"unknown"`` outside an install."""
    try:
        return metadata.version("ferryman")
    except metadata.PackageNotFoundError:
        return "unknown"


def _call(address: str, rpc: RpcConfig | None, call: Callable[[grpc.Channel], T]) -> T:
    """``call`` on a channel of its own to ``address``, closed afterwards."""
    with open_channel(address, rpc or RpcConfig()) as channel:
        return call(channel)


def wrapper_status(
    address: str, rpc: RpcConfig | None = None, timeout_s: float = STATUS_TIMEOUT_S
) -> control_pb2.GetWrapperStatusResponse:
    """``GetWrapperStatus`` of the wrapper at ``address`` (``host:port``).

    Raises:
        grpc.RpcError: the call failed (not listening, refused, timed out).
    """
    request = control_pb2.GetWrapperStatusRequest()
    return _call(
        address,
        rpc,
        lambda channel: control_pb2_grpc.WrapperServiceStub(channel).GetWrapperStatus(request, timeout=timeout_s),
    )


def deduper_status(
    address: str, rpc: RpcConfig | None = None, timeout_s: float = STATUS_TIMEOUT_S
) -> control_pb2.GetDeduperStatusResponse:
    """``GetDeduperStatus`` of the deduper at ``address`` (``host:port``).

    Raises:
        grpc.RpcError: the call failed (not listening, refused, timed out).
    """
    request = control_pb2.GetDeduperStatusRequest()
    return _call(
        address,
        rpc,
        lambda channel: control_pb2_grpc.DeduperServiceStub(channel).GetDeduperStatus(request, timeout=timeout_s),
    )
