"""The service-process shape shared by the wrapper and the deduper: a gRPC server around a run."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence

import grpc
from opentelemetry.trace import TracerProvider

from ferryman.config import RpcConfig
from ferryman.rpc._interceptors import default_server_interceptors
from ferryman.rpc._server import RpcServer, build_server

_log = logging.getLogger(__name__)

#: Time given to in-flight RPCs when a service's gRPC server stops at shutdown.
GRPC_GRACE_S = 5.0


@contextlib.contextmanager
def serving(
    what: str,
    *,
    listen_address: str,
    rpc: RpcConfig,
    register: Sequence[Callable[[grpc.Server], None]],
    service_names: Sequence[str],
    tracer_provider: TracerProvider | None = None,
) -> Iterator[RpcServer]:
    """Start a service's gRPC server (NOT_SERVING until the service says so) and stop it on exit.

    The server is up from the start of the process, before any Kafka client,
    with the project's default interceptors; leaving the block stops it after
    the caller's own drain. Server spans go to tracer_provider (the service's
    ``Tracing.provider``); with None, to OpenTelemetry's global provider, a no-op
    unless someone installed one.
    """
    server = build_server(
        listen_address=listen_address,
        rpc=rpc,
        register=register,
        service_names=service_names,
        interceptors=default_server_interceptors(rpc, tracer_provider=tracer_provider),
    )
    server.start()
    _log.info("%s gRPC server listening on port %d", what, server.port)
    try:
        yield server
    finally:
        server.stop(GRPC_GRACE_S)
