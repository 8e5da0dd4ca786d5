"""gRPC servers with health checking, reflection, TLS and explicit interceptors."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ferryman.config import RpcConfig
from ferryman.rpc._channel import MAX_MESSAGE_BYTES
from ferryman.rpc._errors import RpcBindError
from ferryman.rpc._tls import check_server_tls, server_credentials

_log = logging.getLogger(__name__)

#: Name under which the health service reports the whole server.
OVERALL = ""

#: Grace given to in-flight calls when a server is left through ``with``.
#: Long-lived streams are cancelled when it runs out; unary status calls
#: finish in milliseconds, so a few seconds never cut one short.
EXIT_GRACE_S = 5.0

_HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name

SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # gRPC sets SO_REUSEPORT by default: a second process on the same port
    # would bind without error and silently take half of the connections.
    ("grpc.so_reuseport", 0),
    # Ping every client each minute, dropping it after 20 s of silence: a
    # wrapper that vanished (host gone, flow dropped by a firewall) otherwise
    # holds a worker thread and its control session until TCP gives up (~15 min).
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    # Accept the clients' 30 s keepalive pings (gRPC's default floor is 5 min;
    # pings more frequent than this count as strikes and end in GOAWAY).
    ("grpc.http2.min_ping_interval_without_data_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 1),
)


class RpcServer:
    """A gRPC server with health checking and reflection; build it with `build_server`.

    Health starts NOT_SERVING for every service and for the whole server
    (``""``); the owner flips each service with `set_serving` once it can
    really serve. The whole server is SERVING only while every service is.

    Lifecycle: `start` -> `set_serving` ... -> `begin_drain` (health
    NOT_SERVING for good, calls still served) -> `stop` (idempotent). As a
    context manager it starts on entry and stops on exit.
    """

    def __init__(
        self,
        server: grpc.Server,
        executor: ThreadPoolExecutor,
        port: int,
        health_servicer: health.HealthServicer,
        service_names: Sequence[str],
    ) -> None:
        self._server = server
        self._executor = executor
        self._port = port
        self._health = health_servicer
        self._serving = dict.fromkeys(service_names, False)
        self._lock = threading.Lock()
        self._started = False
        self._draining = False
        self._stopped: threading.Event | None = None
        for name in (*self._serving, OVERALL):
            self._health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)

    @property
    def port(self) -> int:
        """The bound port (the one picked by the system when the address asked for port 0)."""
        return self._port

    @property
    def service_names(self) -> tuple[str, ...]:
        """Full names of the application services (health and reflection excluded)."""
        return tuple(self._serving)

    def start(self) -> None:
        """Start accepting calls. Idempotent.

        Raises:
            RuntimeError: the server was stopped (a stopped server cannot restart).
        """
        with self._lock:
            if self._stopped is not None:
                raise RuntimeError("a stopped RpcServer cannot be started again")
            if self._started:
                return
            self._started = True
        self._server.start()

    def set_serving(self, service: str, serving: bool) -> None:
        """Report one service SERVING or NOT_SERVING; the overall status follows.

        Ignored once `begin_drain` was called: a drain is final.

        Raises:
            ValueError: service is not one of the server's service names.
        """
        if service not in self._serving:
            raise ValueError(f"unknown service {service!r} (known: {', '.join(self._serving)})")
        with self._lock:
            if self._draining:
                return
            self._serving[service] = serving
            overall = all(self._serving.values())
            self._health.set(service, _status(serving))
            self._health.set(OVERALL, _status(overall))

    def begin_drain(self) -> None:
        """Report every service NOT_SERVING, for good, so that load balancers and peers move away.

        Calls, new ones included, are still served until `stop`. Idempotent.
        """
        with self._lock:
            self._draining = True
            self._serving = dict.fromkeys(self._serving, False)
        self._health.enter_graceful_shutdown()

    def stop(self, grace_s: float) -> None:
        """Drain, then stop: in-flight calls get grace_s to finish, then are cancelled.

        Idempotent: later calls wait for the first stop to complete.

        Args:
            grace_s: Budget for in-flight calls, in seconds (0 cancels them at once).
        """
        self.begin_drain()
        with self._lock:
            if self._stopped is None:
                self._stopped = self._server.stop(grace_s)
            stopped = self._stopped
        # gRPC's stop() returns at once, with an event set when shutdown is
        # complete: grace_s away at most, plus a second of slack for gRPC to
        # cancel what is left (a handler blocked in our code may outlive it).
        stopped.wait(grace_s + 1.0)
        self._executor.shutdown(wait=False)  # gRPC leaves its handler pool to its owner

    def __enter__(self) -> RpcServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop(EXIT_GRACE_S)


def _status(serving: bool) -> int:
    return health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING


def build_server(
    *,
    listen_address: str,
    rpc: RpcConfig,
    register: Sequence[Callable[[grpc.Server], None]],
    service_names: Sequence[str],
    interceptors: Sequence[grpc.ServerInterceptor] | None = None,
    max_workers: int = 16,
) -> RpcServer:
    """Build (not start) a server with health checking, reflection, TLS and interceptors.

    Health checking serves ``grpc.health.v1.Health`` with one status per
    service name plus the overall ``""``; reflection lists the service names,
    health and reflection itself. With ``rpc.tls`` material the port is TLS
    (mutual TLS when ``require_client_cert``), plaintext otherwise.

    Args:
        listen_address: ``host:port`` to bind; port 0 picks a free port (see `RpcServer.port`).
        rpc: Shared gRPC settings (TLS; the token is checked by the interceptors).
        register: Functions adding the application servicers to the server.
        service_names: Full names of the services they add (``ferryman.v1.DeduperService``).
        interceptors: Server interceptors, outermost first; usually `default_server_interceptors`.
        max_workers: Handler threads. Every open stream holds one for its
            whole life, and a call waits while all are busy (health checks
            included), so size it above the expected number of streams.

    Raises:
        RpcBindError: The address cannot be bound (in use, not local, malformed).
        ConfigError: TLS settings are incomplete or their files unreadable.
    """
    check_server_tls(rpc.tls)
    credentials = server_credentials(rpc.tls) if rpc.tls.enabled else None
    names = list(service_names)
    executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc-handler")
    server = grpc.server(
        executor,
        interceptors=list(interceptors or ()),
        options=list(SERVER_OPTIONS),
    )
    for add in register:
        add(server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection([*names, _HEALTH_SERVICE, reflection.SERVICE_NAME], server)
    try:
        if credentials is not None:
            port = server.add_secure_port(listen_address, credentials)
        else:
            port = server.add_insecure_port(listen_address)
    except RuntimeError as exc:
        server.stop(None)
        executor.shutdown(wait=False)
        raise RpcBindError(f"cannot listen on {listen_address}: address in use, not local, or malformed") from exc
    if port == 0:  # older gRPC releases report a failed bind this way
        server.stop(None)
        executor.shutdown(wait=False)
        raise RpcBindError(f"cannot listen on {listen_address}: address in use, not local, or malformed")
    return RpcServer(server, executor, port, health_servicer, names)
