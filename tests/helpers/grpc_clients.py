"""Typed test clients of the services' gRPC APIs, and the wiring of a wrapper/deduper pair over the control link.

* status of a linked pair, through ``ferryman.status`` (``LinkedPair.wrapper_status()`` and ``deduper_status()``);
* standard health checking and server reflection;
* a hand-driven ``ControlService/Connect`` stream (`ControlStream`) and an
  in-process control server (`control_server`) for the protocol tests;
* `start_linked_pair`: a ``ferryman-wrapper`` and a ``ferryman-deduper`` process
  with one configuration file each, joined by the control link on fixed ports.
"""

from __future__ import annotations

import queue
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import grpc
from ferryman import protocol
from ferryman.config import RpcConfig
from ferryman.rpc import RpcServer, build_server, default_server_interceptors, open_channel
from ferryman.status import deduper_status, wrapper_status
from ferryman.v1 import control_pb2, control_pb2_grpc, flows_pb2
from ferryman_deduper._control import ControlHub, ControlServicer
from ferryman_local import reserve_port
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from tests.helpers.kafka import KafkaCluster, wait_until
from tests.helpers.services import ServiceProcess, flow_config, write_config

T = TypeVar("T")

#: Budget of one unary call. Loopback answers in milliseconds; a process busy
#: starting its Kafka clients still answers gRPC within a second or two.
CALL_TIMEOUT_S = 5.0

CONTROL_SERVICE = control_pb2.DESCRIPTOR.services_by_name["ControlService"].full_name
DEDUPER_SERVICE = control_pb2.DESCRIPTOR.services_by_name["DeduperService"].full_name
WRAPPER_SERVICE = control_pb2.DESCRIPTOR.services_by_name["WrapperService"].full_name
HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
FLOW_SERVICE = flows_pb2.DESCRIPTOR.services_by_name["FlowService"].full_name
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

#: Codes a call gets while a service process is not (yet, or any more) listening.
_NOT_LISTENING = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

#: ``%(asctime)s`` of the services' log lines (logging's default format).
_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def local(port: int) -> str:
    """``127.0.0.1:<port>``."""
    return f"127.0.0.1:{port}"


# -- unary calls -------------------------------------------------------------------------------------------------


def when_listening(call: Callable[[], T]) -> T | None:
    """call(), or None while its server is not listening (starting, restarting, killed).

    Any other failure (INTERNAL, UNAUTHENTICATED, ...) propagates: a status
    call that fails on a live server is a finding, not something to wait out.
    """
    try:
        return call()
    except grpc.RpcError as exc:
        if isinstance(exc, grpc.Call) and exc.code() in _NOT_LISTENING:
            return None
        raise


def health(address: str, service: str = "", rpc: RpcConfig | None = None) -> int:
    """Status reported by ``grpc.health.v1.Health/Check`` for service (``""``: the whole server)."""
    with open_channel(address, rpc or RpcConfig()) as channel:
        response = health_pb2_grpc.HealthStub(channel).Check(  # type: ignore[attr-defined]
            health_pb2.HealthCheckRequest(service=service), timeout=CALL_TIMEOUT_S
        )
        return int(response.status)


def reflected_services(address: str, rpc: RpcConfig | None = None) -> set[str]:
    """Full names of the services listed by server reflection."""
    with open_channel(address, rpc or RpcConfig()) as channel:
        return set(ProtoReflectionDescriptorDatabase(channel).get_services())


# -- control streams ---------------------------------------------------------------------------------------------


def hello(
    *,
    major: int = protocol.PROTOCOL_MAJOR,
    minor: int = protocol.PROTOCOL_MINOR,
    flow: str = "flow",
    wrapper_id: str = "w-test",
) -> control_pb2.ConnectRequest:
    """A Hello request."""
    return control_pb2.ConnectRequest(
        hello=control_pb2.Hello(
            version=control_pb2.ProtocolVersion(major=major, minor=minor),
            wrapper_id=wrapper_id,
            epoch=1,
            flow=flow,
            source_cluster_id="source-cluster",
        )
    )


class ControlStream:
    """A ``ControlService/Connect`` stream driven by hand: the request side stays open until `close`.

    Keeping the request side open matters: a server that only answers once
    the client half-closes would pass with a request list, and hang here.
    """

    def __init__(self, address: str, rpc: RpcConfig | None = None, *, timeout_s: float = 30.0) -> None:
        self._requests: queue.Queue[control_pb2.ConnectRequest | None] = queue.Queue()
        self._channel = open_channel(address, rpc or RpcConfig())
        self._call: Any = control_pb2_grpc.ControlServiceStub(self._channel).Connect(
            self._request_iterator(), timeout=timeout_s
        )
        self._responses: Iterator[control_pb2.ConnectResponse] = iter(self._call)

    def _request_iterator(self) -> Iterator[control_pb2.ConnectRequest]:
        while (request := self._requests.get()) is not None:
            yield request

    def send(self, request: control_pb2.ConnectRequest) -> None:
        """Queue one request."""
        self._requests.put(request)

    def half_close(self) -> None:
        """End the request side (the response side goes on)."""
        self._requests.put(None)

    def receive(self) -> control_pb2.ConnectResponse:
        """The next response; raises the call's ``grpc.RpcError`` if the stream ended with an error.

        Raises:
            grpc.RpcError: the server ended the stream with a status other than OK.
            StopIteration: the server ended the stream with OK.
        """
        return next(self._responses)

    def close(self) -> None:
        """Cancel the call and close the channel (idempotent)."""
        self._requests.put(None)
        self._call.cancel()
        self._channel.close()

    def __enter__(self) -> ControlStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def control_server(
    hub: ControlHub | control_pb2_grpc.ControlServiceServicer,
    *,
    listen_address: str = "127.0.0.1:0",
    rpc: RpcConfig | None = None,
) -> Iterator[RpcServer]:
    """A started in-process ControlService server, stopped at once on exit.

    It hosts the deduper's real `ControlServicer` over a hub, or the servicer given.
    """
    settings = rpc or RpcConfig()
    servicer = ControlServicer(hub) if isinstance(hub, ControlHub) else hub
    server = build_server(
        listen_address=listen_address,
        rpc=settings,
        register=[lambda s: control_pb2_grpc.add_ControlServiceServicer_to_server(servicer, s)],
        service_names=[CONTROL_SERVICE],
        interceptors=default_server_interceptors(settings),
    )
    server.start()
    server.set_serving(CONTROL_SERVICE, True)
    try:
        yield server
    finally:
        server.stop(0)


# -- a wrapper and a deduper joined by the control link ----------------------------------------------------------


@dataclass
class LinkedPair:
    """A wrapper process and a deduper process of one flow, with their gRPC addresses."""

    flow: str
    wrapper: ServiceProcess
    deduper: ServiceProcess
    wrapper_address: str
    deduper_address: str
    rpc: RpcConfig
    """Client settings that the services accept (TLS material and token when configured)."""

    def wrapper_status(self) -> control_pb2.GetWrapperStatusResponse | None:
        """The wrapper's status, or None while it is not listening."""
        return when_listening(lambda: wrapper_status(self.wrapper_address, self.rpc))

    def deduper_status(self) -> control_pb2.GetDeduperStatusResponse | None:
        """The deduper's status, or None while it is not listening."""
        return when_listening(lambda: deduper_status(self.deduper_address, self.rpc))

    def await_wrapper_status(self, timeout_s: float = 10.0) -> control_pb2.GetWrapperStatusResponse:
        """The wrapper's status, waiting up to timeout_s for it to listen."""
        status = wait_until(self.wrapper_status, timeout_s, message="wrapper status")
        assert status is not None
        return status

    def await_deduper_status(self, timeout_s: float = 10.0) -> control_pb2.GetDeduperStatusResponse:
        """The deduper's status, waiting up to timeout_s for it to listen."""
        status = wait_until(self.deduper_status, timeout_s, message="deduper status")
        assert status is not None
        return status

    def link_up(self) -> bool:
        """True when the wrapper reports its control link up and the deduper lists it as connected."""
        w, d = self.wrapper_status(), self.deduper_status()
        return w is not None and d is not None and w.control_connected and w.wrapper_id in d.connected_wrappers

    def link_down(self) -> bool:
        """True when both sides report the control link down."""
        w, d = self.wrapper_status(), self.deduper_status()
        return w is not None and d is not None and not w.control_connected and not d.connected_wrappers

    def stop(self) -> None:
        """Best-effort cleanup of both processes."""
        self.wrapper.stop()
        self.deduper.stop()


def start_linked_pair(
    log_dir: Path,
    source: KafkaCluster,
    destination: KafkaCluster,
    *,
    flow: str,
    topics: list[str],
    staging_partitions: int = 6,
    link_address: str | None = None,
    deduper_port: int | None = None,
    wrapper: Mapping[str, Any] | None = None,
    deduper: Mapping[str, Any] | None = None,
    rpc: Mapping[str, Any] | None = None,
    client_rpc: RpcConfig | None = None,
    deduper_source_bootstrap: str | None = None,
    start: tuple[str, ...] = ("deduper", "wrapper"),
    extra_flow: Mapping[str, Any] | None = None,
) -> LinkedPair:
    """Write one configuration file per service and start the services named in start, in that order.

    The deduper listens on a fixed port (it must be known before the wrapper
    starts) and the wrapper dials link_address (default: that port; give a
    proxy's address to put faults on the link). Both use the fast reconnect
    backoff below unless rpc overrides it.

    Args:
        log_dir: where the configuration files and process logs go.
        source: the source cluster (the wrapper's view of it).
        destination: the destination cluster.
        flow: the flow name.
        topics: the flow's source topic regexes.
        staging_partitions: the flow's staging partition count.
        link_address: where the wrapper dials its control link.
        deduper_port: the deduper's gRPC port (default: a free one).
        wrapper: extra ``wrapper:`` settings.
        deduper: extra ``deduper:`` settings.
        rpc: the ``rpc:`` section of both files.
        client_rpc: the settings the test's own calls use.
        deduper_source_bootstrap: the source cluster's address in the deduper's file
            (the deduper must never need it).
        start: which services to start now, in order (the others via ``pair.<name>.start()``).
        extra_flow: more settings of the flow (both files).
    """
    dport = deduper_port or reserve_port()
    wport = reserve_port()
    common: dict[str, Any] = {
        "destination_bootstrap": destination.bootstrap_servers,
        "flow": flow,
        "topics": topics,
        "staging_partitions": staging_partitions,
        "extra_flow": extra_flow,
        "wrapper": {
            "listen_address": local(wport),
            "deduper_addresses": [link_address or local(dport)],
            # Progress often, so that lag is known within a test's patience.
            "progress_interval_s": 0.2,
            **dict(wrapper or {}),
        },
        "deduper": {
            "instance_id": "d1",
            "listen_address": local(dport),
            "watermark_interval_s": 0.2,
            **dict(deduper or {}),
        },
    }
    # Reconnect within a second instead of the 10 s default: the tests restart and cut things.
    rpc_section = {"connect_backoff_max_s": 1.0, **dict(rpc or {})}
    wcfg = flow_config(source_bootstrap=source.bootstrap_servers, **common)
    dcfg = flow_config(source_bootstrap=deduper_source_bootstrap or source.bootstrap_servers, **common)
    wcfg["rpc"] = rpc_section
    dcfg["rpc"] = rpc_section
    pair = LinkedPair(
        flow=flow,
        wrapper=ServiceProcess("wrapper", write_config(log_dir / f"{flow}-wrapper.yaml", wcfg), log_dir),
        deduper=ServiceProcess("deduper", write_config(log_dir / f"{flow}-deduper.yaml", dcfg), log_dir),
        wrapper_address=local(wport),
        deduper_address=local(dport),
        rpc=client_rpc or RpcConfig(),
    )
    try:
        for name in start:
            getattr(pair, name).start()
    except BaseException:
        pair.stop()
        raise
    return pair


def log_time(process: ServiceProcess, needle: str) -> datetime:
    """Time stamp of the first line of process's output containing needle.

    Raises:
        AssertionError: no line contains needle.
    """
    for line in process.output().splitlines():
        if needle in line and (m := _LOG_TIME.match(line)):
            return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
    raise AssertionError(f"{process.kind} never logged {needle!r}")
