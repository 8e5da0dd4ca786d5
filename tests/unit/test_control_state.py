"""Control-link state machines without Kafka: version rule, hub bookkeeping, reconnecting link."""

from __future__ import annotations

import socket
import threading

from ferryman import protocol
from ferryman.config import RpcConfig
from ferryman.rpc import build_server, default_server_interceptors
from ferryman.v1 import control_pb2, control_pb2_grpc, envelope_pb2, state_pb2
from ferryman_deduper._control import ControlHub, ControlServicer
from ferryman_wrapper._control import ControlLink

from tests.helpers.kafka import wait_until


def test_protocol_compatibility_is_by_major() -> None:
    assert protocol.compatible(control_pb2.ProtocolVersion(major=protocol.PROTOCOL_MAJOR, minor=99))
    assert not protocol.compatible(control_pb2.ProtocolVersion(major=protocol.PROTOCOL_MAJOR + 1, minor=0))


def test_hub_backpressure_broadcasts_only_changes_and_new_sessions_get_the_current_state() -> None:
    hub = ControlHub("d", "f")
    s1 = hub.open("w1")
    assert hub.set_backpressure(True, "staging ahead")
    assert not hub.set_backpressure(True, "still ahead")
    assert s1.outbound.qsize() == 1
    s2 = hub.open("w2")
    first = s2.outbound.get_nowait()
    assert first.backpressure.paused and first.backpressure.reason == "staging ahead"
    assert hub.set_backpressure(False, "caught up")
    assert hub.connected_wrappers() == ["w1", "w2"]
    hub.close(s1)
    assert hub.connected_wrappers() == ["w2"]


def test_hub_resend_goes_to_one_session_and_needs_one() -> None:
    hub = ControlHub("d", "f")
    src = envelope_pb2.SourcePartition(topic="t", partition=1)
    assert hub.request_resend(src, 10, 20) is None
    s1 = hub.open("w1")
    s2 = hub.open("w2")
    rid = hub.request_resend(src, 10, 20)
    assert rid is not None
    got = [q.outbound.get_nowait() for q in (s1, s2) if not q.outbound.empty()]
    assert len(got) == 1
    req = got[0].resend_request
    assert (req.request_id, req.from_offset, req.to_offset, req.source.topic) == (rid, 10, 20, "t")
    assert hub.request_resend(src, 21, 30) != rid


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server(port: int, hub: ControlHub) -> object:
    server = build_server(
        listen_address=f"127.0.0.1:{port}",
        rpc=RpcConfig(),
        register=[lambda s: control_pb2_grpc.add_ControlServiceServicer_to_server(ControlServicer(hub), s)],
        service_names=["ferryman.v1.ControlService"],
        interceptors=default_server_interceptors(RpcConfig()),
    )
    server.start()
    return server


def test_link_reconnects_resends_specs_and_fails_open() -> None:
    port = _free_port()
    hub = ControlHub("d", "f")
    pauses: list[tuple[bool, str]] = []
    spec = state_pb2.TopicSpec(cluster_id="c", topic="orders", partitions=3)
    link = ControlLink(
        address=f"127.0.0.1:{port}",
        rpc=RpcConfig(connect_backoff_max_s=0.5),
        hello=lambda: control_pb2.Hello(version=protocol.current_version(), wrapper_id="w1", flow="f"),
        specs=lambda: [spec],
        on_backpressure=lambda paused, reason: pauses.append((paused, reason)),
        on_resend=lambda req, lnk: None,
        on_watermarks=lambda w: None,
    )
    assert not link.send(control_pb2.ConnectRequest(progress=control_pb2.Progress()))  # down: dropped
    link.start()
    try:
        for _round in range(2):  # connect, lose the server, connect again
            server = _server(port, hub)
            wait_until(lambda: link.connected, 10, message="link up")
            wait_until(lambda: hub.specs.qsize() >= 1, 10, message="specs sent on connect")
            assert hub.specs.get_nowait().topic == "orders"
            hub.set_backpressure(True, "test pause")
            wait_until(lambda: (True, "test pause") in pauses, 10, message="pause delivered")
            hub.set_backpressure(False, "reset")
            server.stop(0)  # type: ignore[attr-defined]
            wait_until(lambda: not link.connected, 10, message="link loss noticed")
            # Fail open: the pause is lifted when the link goes away.
            assert pauses[-1][0] is False
        assert link.connects >= 2
    finally:
        link.stop()


def test_incompatible_deduper_is_not_hammered() -> None:
    """A FAILED_PRECONDITION answer moves the link to its longest backoff instead of a hot loop."""
    port = _free_port()
    hub = ControlHub("d", "another-flow")
    server = _server(port, hub)
    attempts = threading.Event()
    link = ControlLink(
        address=f"127.0.0.1:{port}",
        rpc=RpcConfig(connect_backoff_max_s=5.0),
        hello=lambda: (attempts.set(), control_pb2.Hello(version=protocol.current_version(), flow="f"))[1],
        specs=lambda: [],
        on_backpressure=lambda paused, reason: None,
        on_resend=lambda req, lnk: None,
        on_watermarks=lambda w: None,
    )
    link.start()
    try:
        assert attempts.wait(10)
        wait_until(lambda: link.connects >= 1 and not link.connected, 10, message="refused")
        connects = link.connects
        # Within a second nothing retries: the backoff after a refusal is the maximum (5 s here).
        assert not threading.Event().wait(1.0)
        assert link.connects == connects
    finally:
        link.stop()
        server.stop(0)  # type: ignore[attr-defined]
