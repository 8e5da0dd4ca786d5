"""The control protocol without Kafka: version rule, the deduper's hub, the wrapper's reconnecting link.

The link tests run the real `ControlLink` against in-process servers on
loopback (the real `ControlServicer`, or a recording one that shows exactly
what arrives on each stream), stopped and restarted under it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from ferryman import protocol
from ferryman.config import RpcConfig
from ferryman.state import PartitionKey
from ferryman.v1 import control_pb2, control_pb2_grpc, envelope_pb2, state_pb2
from ferryman_deduper._control import ControlHub
from ferryman_local import reserve_port
from ferryman_wrapper._control import ControlLink

from tests.helpers.grpc_clients import control_server, local
from tests.helpers.kafka import wait_until

#: Longest reconnect backoff of the links under test: short, so that a test
#: sees several attempts in a second or two.
BACKOFF_MAX_S = 0.4
#: Budget for anything the link does on loopback (connect, deliver, notice a loss).
LINK_TIMEOUT_S = 5.0


def _version(major: int, minor: int) -> control_pb2.ProtocolVersion:
    return control_pb2.ProtocolVersion(major=major, minor=minor)


# -- protocol version --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("major", "minor", "ok"),
    [
        (protocol.PROTOCOL_MAJOR, protocol.PROTOCOL_MINOR, True),
        (protocol.PROTOCOL_MAJOR, protocol.PROTOCOL_MINOR + 5, True),  # a newer minor only adds fields
        (protocol.PROTOCOL_MAJOR, 0, True),
        (protocol.PROTOCOL_MAJOR + 1, protocol.PROTOCOL_MINOR, False),
        (protocol.PROTOCOL_MAJOR - 1, protocol.PROTOCOL_MINOR, False),
        (0, 0, False),  # a Hello without a version (proto3 default) is not accepted as ours
    ],
)
def test_peers_are_compatible_exactly_when_majors_match(major: int, minor: int, ok: bool) -> None:
    assert protocol.compatible(_version(major, minor)) is ok


def test_current_version_and_its_description() -> None:
    current = protocol.current_version()
    assert (current.major, current.minor) == (protocol.PROTOCOL_MAJOR, protocol.PROTOCOL_MINOR)
    assert protocol.compatible(current)
    assert protocol.describe(_version(3, 14)) == "3.14"


# -- the deduper's hub -------------------------------------------------------------------------------------------


def _drain(session: Any) -> list[control_pb2.ConnectResponse]:
    """Every message queued for a session's wrapper so far."""
    out: list[control_pb2.ConnectResponse] = []
    while not session.outbound.empty():
        out.append(session.outbound.get_nowait())
    return out


def test_backpressure_is_broadcast_only_when_it_changes() -> None:
    hub = ControlHub("d", "flow")
    s1, s2 = hub.open("w1"), hub.open("w2")
    assert _drain(s1) == _drain(s2) == []  # nobody is paused at the start: nothing to say

    assert hub.set_backpressure(True, "staging is 80 envelopes ahead")
    assert not hub.set_backpressure(True, "staging is 90 envelopes ahead")  # no change, no message
    assert not hub.set_backpressure(True, "staging is 99 envelopes ahead")
    for session in (s1, s2):
        (only,) = _drain(session)
        assert only.backpressure == control_pb2.Backpressure(paused=True, reason="staging is 80 envelopes ahead")

    assert hub.set_backpressure(False, "caught up")
    assert not hub.set_backpressure(False, "still caught up")
    for session in (s1, s2):
        (only,) = _drain(session)
        assert only.backpressure == control_pb2.Backpressure(paused=False, reason="caught up")


def test_a_wrapper_that_connects_during_a_pause_is_paused_at_once() -> None:
    hub = ControlHub("d", "flow")
    hub.set_backpressure(True, "destination cluster unavailable (2 failed commits)")
    late = hub.open("w-late")
    (first,) = _drain(late)
    assert first.backpressure == control_pb2.Backpressure(
        paused=True, reason="destination cluster unavailable (2 failed commits)"
    )
    hub.set_backpressure(False, "caught up")
    _drain(late)
    assert _drain(hub.open("w-after")) == []  # no pause in force: a new session hears nothing


def test_resend_requests_go_to_exactly_one_connected_wrapper() -> None:
    hub = ControlHub("d", "flow")
    source = envelope_pb2.SourcePartition(cluster_id="c", topic="orders", topic_id=b"\x01" * 16, partition=3)
    assert hub.request_resend(source, 10, 20) is None  # nobody to ask: the deduper asks again later

    s1, s2 = hub.open("w1"), hub.open("w2")
    first = hub.request_resend(source, 10, 20)
    assert first is not None
    received = [(s.wrapper_id, m) for s in (s1, s2) for m in _drain(s)]
    assert len(received) == 1
    _who, message = received[0]
    assert message.resend_request == control_pb2.ResendRequest(
        request_id=first, source=source, from_offset=10, to_offset=20
    )

    # Request ids are unique, and once the wrapper asked is gone the next request goes to the other one.
    hub.close(s1)
    second = hub.request_resend(source, 21, 30)
    assert second is not None and second != first
    assert [m.resend_request.request_id for m in _drain(s2)] == [second]
    hub.close(s2)
    assert hub.request_resend(source, 21, 30) is None


def test_a_resend_goes_to_the_partitions_reader_first_and_a_repeat_to_the_next_wrapper() -> None:
    hub = ControlHub("d", "flow")
    source = envelope_pb2.SourcePartition(cluster_id="c", topic="orders", topic_id=b"\x01" * 16, partition=3)
    sessions = {w: hub.open(w) for w in ("w1", "w2", "w3")}
    # w2 reads orders-3 now (it reports progress for it).
    hub.on_progress(
        control_pb2.Progress(
            partitions=[control_pb2.PartitionProgress(topic="orders", partition=3, log_end_offset=50)]
        ),
        "w2",
    )

    def asked() -> list[str]:
        return [w for w, s in sessions.items() for m in _drain(s) if m.HasField("resend_request")]

    hub.request_resend(source, 10, 20, attempt=0)
    assert asked() == ["w2"]
    # The same gap asked again (w2 did not answer in time): the next wrappers, in turn, then w2 again.
    for attempt, expected in enumerate(("w1", "w3", "w2"), start=1):
        hub.request_resend(source, 10, 20, attempt=attempt)
        assert asked() == [expected]
    # A new gap starts with the reader again.
    hub.request_resend(source, 30, 40, attempt=0)
    assert asked() == ["w2"]


def test_a_reconnecting_wrapper_replaces_its_old_session() -> None:
    hub = ControlHub("d", "flow")
    old = hub.open("w1")
    new = hub.open("w1")  # the same wrapper, reconnected before its old stream was noticed gone
    assert hub.connected_wrappers() == ["w1"]
    hub.close(old)  # the old stream's handler ends late: it must not unregister the new session
    assert hub.connected_wrappers() == ["w1"]
    hub.broadcast(control_pb2.ConnectResponse(watermarks=control_pb2.Watermarks()))
    assert len(_drain(new)) == 1
    assert _drain(old) == []
    hub.close(new)
    assert hub.connected_wrappers() == []


def test_progress_gives_the_source_log_end_per_partition() -> None:
    hub = ControlHub("d", "flow")
    assert hub.log_end_offset(PartitionKey("orders", 0)) is None
    hub.on_progress(
        control_pb2.Progress(
            partitions=[
                control_pb2.PartitionProgress(topic="orders", partition=0, log_end_offset=100, last_wrapped_offset=99),
                control_pb2.PartitionProgress(topic="orders", partition=1, log_end_offset=7, last_wrapped_offset=3),
            ]
        )
    )
    hub.on_progress(
        control_pb2.Progress(partitions=[control_pb2.PartitionProgress(topic="orders", log_end_offset=120)])
    )
    assert hub.log_end_offset(PartitionKey("orders", 0)) == 120
    assert hub.log_end_offset(PartitionKey("orders", 1)) == 7


# -- the wrapper's link ------------------------------------------------------------------------------------------


class RecordingServicer(control_pb2_grpc.ControlServiceServicer):
    """A ControlService that records every request of every stream and answers a Hello with a Welcome.

    With ``hold_welcome`` set, the Welcome waits until the event is set: the
    moment between a stream's start and the link knowing it is up.
    """

    def __init__(self, hold_welcome: threading.Event | None = None) -> None:
        self.streams: list[list[control_pb2.ConnectRequest]] = []
        self.hold_welcome = hold_welcome
        self._lock = threading.Lock()

    def Connect(  # noqa: N802 (gRPC method name)
        self, request_iterator: Iterator[control_pb2.ConnectRequest], context: grpc.ServicerContext
    ) -> Iterator[control_pb2.ConnectResponse]:
        received: list[control_pb2.ConnectRequest] = []
        with self._lock:
            self.streams.append(received)
        first = next(request_iterator, None)
        if first is None:
            return
        received.append(first)

        def read() -> None:
            with contextlib.suppress(grpc.RpcError):  # the client went away: the stream is over
                received.extend(request_iterator)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        if self.hold_welcome is not None:
            self.hold_welcome.wait(LINK_TIMEOUT_S * 2)
        yield control_pb2.ConnectResponse(welcome=control_pb2.Welcome(deduper_id="recorder", flows=["flow"]))
        while context.is_active() and reader.is_alive():
            reader.join(0.05)

    def kinds(self, stream: int) -> list[str]:
        return [str(r.WhichOneof("kind")) for r in list(self.streams[stream])]


@dataclass
class LinkProbe:
    """What a ControlLink told its owner, the way the wrapper would have heard it."""

    specs: list[state_pb2.TopicSpec] = field(default_factory=list)
    backpressure: list[tuple[bool, str]] = field(default_factory=list)
    watermarks: list[control_pb2.Watermarks] = field(default_factory=list)
    resends: list[tuple[control_pb2.ResendRequest, ControlLink]] = field(default_factory=list)
    hellos: int = 0

    def hello(self) -> control_pb2.Hello:
        self.hellos += 1
        return control_pb2.Hello(
            version=protocol.current_version(), wrapper_id="w1", epoch=self.hellos, flow="flow", source_cluster_id="c"
        )

    def link(self, port: int, backoff_max_s: float = BACKOFF_MAX_S) -> ControlLink:
        return ControlLink(
            address=local(port),
            rpc=RpcConfig(connect_backoff_max_s=backoff_max_s),
            hello=self.hello,
            specs=lambda: list(self.specs),
            on_backpressure=lambda paused, reason: self.backpressure.append((paused, reason)),
            on_resend=lambda request, link: self.resends.append((request, link)),
            on_watermarks=self.watermarks.append,
        )


def _spec(topic: str, partitions: int = 3) -> state_pb2.TopicSpec:
    return state_pb2.TopicSpec(
        cluster_id="c", topic=topic, topic_id=topic.encode().ljust(16, b"."), partitions=partitions
    )


def _progress(marker: int) -> control_pb2.ConnectRequest:
    """A Progress request recognisable by its log-end offset."""
    return control_pb2.ConnectRequest(
        progress=control_pb2.Progress(partitions=[control_pb2.PartitionProgress(topic="t", log_end_offset=marker)])
    )


def _markers(requests: list[control_pb2.ConnectRequest]) -> list[int]:
    return [p.log_end_offset for r in requests if r.HasField("progress") for p in r.progress.partitions]


@pytest.fixture
def probe() -> LinkProbe:
    return LinkProbe()


@contextmanager
def running(link: ControlLink) -> Iterator[ControlLink]:
    link.start()
    try:
        yield link
    finally:
        link.stop()


def test_link_retries_with_capped_backoff_then_says_hello_first_and_sends_current_specs_on_every_connect(
    probe: LinkProbe,
) -> None:
    port = reserve_port()
    recorder = RecordingServicer()
    probe.specs = [_spec("orders")]
    with running(probe.link(port)) as link:
        # Nothing listens yet: the link keeps trying, spaced by its backoff.
        wait_until(lambda: link.connects >= 1, LINK_TIMEOUT_S, interval_s=0.01, message="first attempt")
        first = time.monotonic()
        wait_until(lambda: link.connects >= 4, LINK_TIMEOUT_S, interval_s=0.01, message="three more attempts")
        elapsed = time.monotonic() - first
        # Backoff 0.2 s doubling to 0.4 s, +-20 % jitter: three retries take at least 0.8 * (0.2 + 0.4 + 0.4) s.
        # A hot loop would take milliseconds; a link that gave up would never get here.
        assert elapsed >= 0.8 * (0.2 + 2 * BACKOFF_MAX_S) - 0.05, f"three retries in {elapsed:.2f}s"
        assert not link.connected

        with control_server(recorder, listen_address=local(port)):
            # Capped backoff: the server is found within one maximal backoff (plus jitter and slack).
            wait_until(lambda: link.connected, BACKOFF_MAX_S * 1.2 + 2.0, message="link up after the server started")
            wait_until(lambda: len(recorder.kinds(-1)) >= 2, LINK_TIMEOUT_S, message="hello and specs received")
            assert recorder.kinds(-1)[:2] == ["hello", "topic_specs"]
            assert recorder.streams[-1][0].hello.wrapper_id == "w1"
            assert recorder.streams[-1][0].hello.version == protocol.current_version()
            assert [s.topic for s in recorder.streams[-1][1].topic_specs.specs] == ["orders"]
            streams_before_restart = len(recorder.streams)
            # The wrapper learns of a new topic while connected.
            probe.specs = [_spec("orders"), _spec("payments", 8)]
        wait_until(lambda: not link.connected, LINK_TIMEOUT_S, message="link loss noticed")

        with control_server(recorder, listen_address=local(port)):
            wait_until(lambda: link.connected, BACKOFF_MAX_S * 1.2 + 2.0, message="link up after the restart")
            wait_until(lambda: len(recorder.kinds(-1)) >= 2, LINK_TIMEOUT_S, message="hello and specs received again")
            assert len(recorder.streams) > streams_before_restart
            assert recorder.kinds(-1)[:2] == ["hello", "topic_specs"]
            # The specs of *now*, not those of the first connect.
            assert [(s.topic, s.partitions) for s in recorder.streams[-1][1].topic_specs.specs] == [
                ("orders", 3),
                ("payments", 8),
            ]
        # Every stream the link ever opened started with a Hello (no stream without one).
        assert all(kinds[0] == "hello" for kinds in (recorder.kinds(i) for i in range(len(recorder.streams))) if kinds)


def test_link_sends_no_specs_message_when_there_are_none(probe: LinkProbe) -> None:
    port = reserve_port()
    recorder = RecordingServicer()
    with control_server(recorder, listen_address=local(port)), running(probe.link(port)) as link:
        wait_until(lambda: link.connected, LINK_TIMEOUT_S, message="link up")
        assert link.send(_progress(1))
        wait_until(lambda: _markers(recorder.streams[-1]) == [1], LINK_TIMEOUT_S, message="progress received")
        assert recorder.kinds(-1) == ["hello", "progress"]


def test_pause_is_delivered_and_lifted_when_the_link_drops(probe: LinkProbe) -> None:
    port = reserve_port()
    hub = ControlHub("d1", "flow")
    with running(probe.link(port)) as link:
        with control_server(hub, listen_address=local(port)):
            wait_until(lambda: link.connected, LINK_TIMEOUT_S, message="link up")
            wait_until(lambda: hub.connected_wrappers() == ["w1"], LINK_TIMEOUT_S, message="hub sees the wrapper")
            hub.set_backpressure(True, "staging is 500 envelopes ahead of the deduper (limit 50)")
            wait_until(
                lambda: probe.backpressure[-1:] == [(True, "staging is 500 envelopes ahead of the deduper (limit 50)")],
                LINK_TIMEOUT_S,
                message="pause delivered",
            )
        # The deduper is gone while its pause is in force: the wrapper must not stay paused (fail open).
        wait_until(lambda: not link.connected, LINK_TIMEOUT_S, message="link loss noticed")
        wait_until(lambda: probe.backpressure[-1:] == [(False, "control link lost")], LINK_TIMEOUT_S, message="lifted")

        # A new deduper that is itself paused says so as soon as the link is back.
        hub2 = ControlHub("d2", "flow")
        hub2.set_backpressure(True, "destination cluster unavailable (2 failed commits)")
        with control_server(hub2, listen_address=local(port)):
            wait_until(
                lambda: probe.backpressure[-1:] == [(True, "destination cluster unavailable (2 failed commits)")],
                LINK_TIMEOUT_S,
                message="pause of the new deduper delivered on connect",
            )


def test_sends_are_dropped_while_disconnected_and_never_delivered_late(probe: LinkProbe) -> None:
    port = reserve_port()
    recorder = RecordingServicer()
    link = probe.link(port)
    assert not link.send(_progress(1))  # not started: dropped
    with running(link):
        assert not link.send(_progress(2))  # no server: dropped
        with control_server(recorder, listen_address=local(port)):
            wait_until(lambda: link.connected, LINK_TIMEOUT_S * 2, message="link up")
            assert link.send(_progress(3))
            wait_until(lambda: 3 in _markers(recorder.streams[-1]), LINK_TIMEOUT_S, message="progress 3 received")
        wait_until(lambda: not link.connected, LINK_TIMEOUT_S, message="link loss noticed")
        assert not link.send(_progress(4))  # down: dropped, not queued for the next stream
        with control_server(recorder, listen_address=local(port)):
            wait_until(lambda: link.connected, LINK_TIMEOUT_S, message="link back")
            assert link.send(_progress(5))
            wait_until(lambda: 5 in _markers(recorder.streams[-1]), LINK_TIMEOUT_S, message="progress 5 received")
    everything = [m for stream in recorder.streams for m in _markers(stream)]
    assert everything == [3, 5]


def test_watermarks_and_resend_requests_reach_the_owner_and_resend_data_reaches_the_hub(probe: LinkProbe) -> None:
    port = reserve_port()
    hub = ControlHub("d1", "flow")
    source = envelope_pb2.SourcePartition(cluster_id="c", topic="orders", partition=2)
    with control_server(hub, listen_address=local(port)), running(probe.link(port)) as link:
        wait_until(lambda: hub.connected_wrappers() == ["w1"], LINK_TIMEOUT_S, message="hub sees the wrapper")
        watermarks = control_pb2.Watermarks(
            partitions=[control_pb2.PartitionWatermark(topic="orders", partition=2, watermark=41, lag=0)]
        )
        hub.broadcast(control_pb2.ConnectResponse(watermarks=watermarks))
        wait_until(lambda: probe.watermarks == [watermarks], LINK_TIMEOUT_S, message="watermarks delivered")

        request_id = hub.request_resend(source, 5, 9)
        assert request_id is not None
        wait_until(lambda: len(probe.resends) == 1, LINK_TIMEOUT_S, message="resend request delivered")
        request, via = probe.resends[0]
        assert via is link
        assert (request.request_id, request.source, request.from_offset, request.to_offset) == (
            request_id,
            source,
            5,
            9,
        )
        envelope = envelope_pb2.Envelope(source=source, previous_offset=4)
        assert link.send(
            control_pb2.ConnectRequest(
                resend_data=control_pb2.ResendData(request_id=request_id, envelopes=[envelope], done=True)
            )
        )
        answer = hub.resent.get(timeout=LINK_TIMEOUT_S)
        assert (answer.request_id, answer.done, answer.error) == (request_id, True, "")
        assert [e.previous_offset for e in answer.envelopes] == [4]


def test_stop_is_prompt_idempotent_and_final(probe: LinkProbe) -> None:
    port = reserve_port()
    hub = ControlHub("d1", "flow")
    with control_server(hub, listen_address=local(port)):
        link = probe.link(port)
        link.start()
        wait_until(lambda: link.connected, LINK_TIMEOUT_S, message="link up")
        started = time.monotonic()
        link.stop()
        link.stop()
        assert time.monotonic() - started < 2.0
        wait_until(lambda: hub.connected_wrappers() == [], LINK_TIMEOUT_S, message="hub saw the stream end")
        # Its thread is gone: a stopped link never dials again.
        assert not link.running
        assert not link.connected
        assert not link.send(_progress(1))


def test_a_refusing_deduper_is_retried_only_after_the_longest_backoff(probe: LinkProbe) -> None:
    """FAILED_PRECONDITION (another flow, another major) will not change by retrying soon: no hot loop."""
    port = reserve_port()
    refusing = ControlHub("d1", "another-flow")
    backoff_max_s = 1.0
    with control_server(refusing, listen_address=local(port)), running(probe.link(port, backoff_max_s)) as link:
        wait_until(lambda: link.connects >= 1, LINK_TIMEOUT_S, interval_s=0.01, message="first attempt")
        first = time.monotonic()
        wait_until(lambda: link.connects >= 2, LINK_TIMEOUT_S, interval_s=0.01, message="second attempt")
        waited = time.monotonic() - first
        # Not the first backoff (0.2 s +-20 %) but the longest one, -20 % jitter at most.
        assert waited >= 0.8 * backoff_max_s - 0.05, f"retried after {waited:.2f}s"
        assert not link.connected
        assert refusing.connected_wrappers() == []


def test_specs_changed_during_the_handshake_reach_the_deduper(probe: LinkProbe) -> None:
    """Specs are sent "on connect and whenever they change" (control.proto): no change may fall in between.

    The link refuses sends until the Welcome is back, and the wrapper's
    on-change hook ignores a refusal; so right after the Welcome the link sends
    the specs of that moment. Here a topic appears while the Welcome is held
    back (a WAN round trip and a TLS handshake in production).
    """
    port = reserve_port()
    welcome = threading.Event()
    recorder = RecordingServicer(hold_welcome=welcome)
    probe.specs = [_spec("orders")]
    with control_server(recorder, listen_address=local(port)), running(probe.link(port)) as link:
        wait_until(
            lambda: recorder.streams and recorder.kinds(-1)[:1] == ["hello"], LINK_TIMEOUT_S, message="hello received"
        )
        # The wrapper publishes a new topic's spec now, exactly as DeduperLinks._send_specs does.
        probe.specs = [_spec("orders"), _spec("payments")]
        assert not link.send(control_pb2.ConnectRequest(topic_specs=control_pb2.TopicSpecs(specs=[_spec("payments")])))
        welcome.set()
        wait_until(lambda: link.connected, LINK_TIMEOUT_S, message="link up")
        wait_until(lambda: len(recorder.kinds(-1)) >= 2, LINK_TIMEOUT_S, message="specs after the welcome")
        assert recorder.kinds(-1) == ["hello", "topic_specs"]
        assert [s.topic for s in recorder.streams[-1][1].topic_specs.specs] == ["orders", "payments"]


def test_how_a_stream_ended_decides_what_the_wrapper_logs(probe: LinkProbe, caplog: pytest.LogCaptureFixture) -> None:
    """A deduper's drain (`end_streams`) is news, not a fault; a lost server is a warning; our own stop is silent."""
    caplog.set_level(logging.INFO, logger="ferryman_wrapper._control")
    port = reserve_port()

    def said(level: int, text: str) -> bool:
        return any(r.levelno == level and text in r.getMessage() for r in wrapper_said())

    def wrapper_said() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.name == "ferryman_wrapper._control"]

    with running(probe.link(port)) as link:
        draining = ControlHub("d1", "flow")
        with control_server(draining, listen_address=local(port)):
            wait_until(lambda: link.connected, LINK_TIMEOUT_S, message="link up")
            caplog.clear()  # the link dialled before the server listened: a warning, the test's own doing
            draining.end_streams()
            wait_until(lambda: said(logging.INFO, "closed by the deduper"), LINK_TIMEOUT_S, message="drain heard")
            dialled = link.connects
            # Dialling the drained deduper again is refused ("shutting down"), then finds no server: no warning.
            wait_until(lambda: link.connects > dialled, LINK_TIMEOUT_S, message="dialled while it drains")
        dialled = link.connects
        wait_until(lambda: link.connects > dialled, LINK_TIMEOUT_S, message="dialled after it stopped")
        assert not said(logging.WARNING, "lost")
        assert not said(logging.WARNING, "down")
        assert probe.backpressure[-1:] == [(False, "control link lost")]  # fails open all the same

        caplog.clear()
        with control_server(ControlHub("d2", "flow"), listen_address=local(port)):
            wait_until(lambda: link.connected, LINK_TIMEOUT_S, message="link up to the next deduper")
        wait_until(lambda: said(logging.WARNING, "lost; the data path goes on"), LINK_TIMEOUT_S, message="loss")

        with control_server(ControlHub("d3", "flow"), listen_address=local(port)):
            wait_until(lambda: link.connected, LINK_TIMEOUT_S, message="link up to a third deduper")
            # Dials between d2's stop and d3's start warn ("down"): judged from here, our own stop alone.
            caplog.clear()
            link.stop()
            assert [r.getMessage() for r in wrapper_said()] == []
