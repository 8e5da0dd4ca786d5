"""gRPC servers with health checking, reflection, TLS and explicit interceptors."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ferryman.config import RpcConfig
from ferryman.rpc._errors import RpcBindError
from ferryman.rpc._tls import server_credentials

#: Message size cap both ways: resend answers carry envelopes of records near
#: Kafka's size limit (gRPC's default is 4 MiB).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

#: Keepalive: control streams live for days and cross firewalls that drop idle
#: flows; clients ping every 30 s, so servers must accept pings that often.
SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_ping_strikes", 0),
)


class RpcServer:
    """A started-on-demand gRPC server; see build_server()."""

    def __init__(
        self, server: grpc.Server, port: int, health_servicer: health.HealthServicer, service_names: Sequence[str]
    ) -> None:
        self._server = server
        self.port = port
        self.health = health_servicer
        self._names = list(service_names)
        self._stopped = False
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start serving (health reports NOT_SERVING until set_serving)."""
        self._server.start()

    def set_serving(self, service: str, serving: bool) -> None:
        """Set the health of one service; the overall status follows the conjunction."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        self.health.set(service, status)
        self._statuses[service] = serving
        overall = all(self._statuses.get(n, False) for n in self._names)
        self.health.set(
            "",
            health_pb2.HealthCheckResponse.SERVING if overall else health_pb2.HealthCheckResponse.NOT_SERVING,
        )

    @property
    def _statuses(self) -> dict[str, bool]:
        if not hasattr(self, "_status_map"):
            self._status_map: dict[str, bool] = {}
        return self._status_map

    def begin_drain(self) -> None:
        """Every service NOT_SERVING (load balancers stop routing); calls still work until stop()."""
        for name in self._names:
            self.set_serving(name, False)

    def stop(self, grace_s: float) -> None:
        """Stop, letting in-flight calls finish for grace_s. Idempotent."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self.begin_drain()
        self._server.stop(grace_s).wait(grace_s + 1)

    def __enter__(self) -> RpcServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop(1.0)


def build_server(
    *,
    listen_address: str,
    rpc: RpcConfig,
    register: Sequence[Callable[[grpc.Server], None]],
    service_names: Sequence[str],
    interceptors: Sequence[grpc.ServerInterceptor] | None = None,
    max_workers: int = 16,
) -> RpcServer:
    """Build (not start) a server with health, reflection, TLS and interceptors.

    Args:
        listen_address: host:port; port 0 picks a free port (see RpcServer.port).
        rpc: TLS and auth settings.
        register: functions adding the servicers to the server.
        service_names: full names of the registered services (health, reflection).
        interceptors: server interceptors, outermost first.
        max_workers: handler threads; each open control stream holds one.

    Raises:
        RpcBindError: the address cannot be bound.
    """
    server = grpc.server(
        ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc"),
        interceptors=list(interceptors or ()),
        options=list(SERVER_OPTIONS),
    )
    for add in register:
        add(server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = list(service_names)
    reflection.enable_server_reflection(
        [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME], server
    )
    try:
        if rpc.tls.enabled:
            port = server.add_secure_port(listen_address, server_credentials(rpc.tls))
        else:
            port = server.add_insecure_port(listen_address)
    except RuntimeError as exc:
        raise RpcBindError(f"cannot listen on {listen_address}: {exc}") from exc
    if port == 0:
        raise RpcBindError(f"cannot listen on {listen_address} (address in use or invalid)")
    result = RpcServer(server, port, health_servicer, names)
    for name in names:
        result.set_serving(name, False)
    return result
