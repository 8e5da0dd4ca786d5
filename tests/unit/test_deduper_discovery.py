"""Deduper advertisements (ferryman.advertisement) and the wrapper's link set (ferryman_wrapper._discovery)."""

from __future__ import annotations

import socket
from typing import Any, cast

import pytest
from ferryman.advertisement import LIVENESS_INTERVALS, advertised_address, dedupers_topic, is_live
from ferryman.config import FlowConfig
from ferryman.naming import FlowNames
from ferryman.v1 import state_pb2
from ferryman_wrapper._control import ControlLink
from ferryman_wrapper._discovery import DeduperDiscovery

NAMES = FlowNames.of(FlowConfig(name="f1", source="a", target="b"))


def _ad(instance: str, address: str, at_ms: int, interval_ms: int = 1000, flow: str = "f1") -> bytes:
    return state_pb2.DeduperAdvertisement(
        instance_id=instance, flow=flow, address=address, heartbeat_at_ms=at_ms, heartbeat_interval_ms=interval_ms
    ).SerializeToString()


@pytest.mark.parametrize(
    ("configured", "listen", "port", "expected"),
    [
        ("dd.example:7460", "[::]:7460", 7460, "dd.example:7460"),
        (None, "10.0.0.5:7460", 7460, "10.0.0.5:7460"),
        (None, "127.0.0.1:0", 40123, "127.0.0.1:40123"),
        (None, "[::]:7460", 7460, f"{socket.gethostname()}:7460"),
        (None, "0.0.0.0:0", 40123, f"{socket.gethostname()}:40123"),
        (None, "[fd00::1]:7460", 7460, "[fd00::1]:7460"),
    ],
)
def test_advertised_address_is_the_listen_address_made_dialable(
    configured: str | None, listen: str, port: int, expected: str
) -> None:
    assert advertised_address(configured, listen, port) == expected


def test_an_advertisement_lives_for_a_few_heartbeat_intervals() -> None:
    ad = state_pb2.DeduperAdvertisement.FromString(_ad("d1", "h:1", at_ms=10_000, interval_ms=1000))
    assert is_live(ad, 10_000 + LIVENESS_INTERVALS * 1000)
    assert not is_live(ad, 10_001 + LIVENESS_INTERVALS * 1000)


def test_the_dedupers_topic_is_compacted_and_named_after_the_flow() -> None:
    topic = dedupers_topic(NAMES)
    assert topic.name == "ferryman.f1.dedupers.internal"
    assert topic.configs["cleanup.policy"] == "compact"
    assert topic.partitions == 1


class _Link:
    """Stands in for a ControlLink: records start and stop."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.started = False
        self.stopped = False
        self.connected = False

    def start(self) -> None:
        self.started = True

    def stop(self) -> None:
        self.stopped = True


class _Clock:
    def __init__(self) -> None:
        self.now_ms = 100_000

    def __call__(self) -> int:
        return self.now_ms


def _discovery(links: list[Any], clock: _Clock, made: list[_Link]) -> DeduperDiscovery:
    def make(address: str) -> ControlLink:
        made.append(_Link(address))
        return cast(ControlLink, made[-1])

    return DeduperDiscovery(
        names=NAMES, consumer_config={}, make_link=make, links=cast(list[ControlLink], links), clock_ms=clock
    )


def test_live_dedupers_get_a_link_and_gone_ones_lose_it() -> None:
    clock, made, links = _Clock(), list[_Link](), list[Any]()
    finder = _discovery(links, clock, made)
    finder._record(b"d1", _ad("d1", "h1:1", clock.now_ms))
    finder._record(b"d2", _ad("d2", "h2:1", clock.now_ms))
    finder._record(b"old", _ad("old", "h3:1", clock.now_ms - 10_000))  # a crashed deduper's, long expired
    finder._record(b"other", _ad("x", "h4:1", clock.now_ms, flow="f2"))  # not this flow's
    finder.reconcile()
    assert sorted(link.address for link in links) == ["h1:1", "h2:1"]
    assert all(link.started for link in made)

    finder._record(b"d1", None)  # a clean stop's tombstone
    clock.now_ms += 2_000
    finder._record(b"d2", _ad("d2", "h2:1", clock.now_ms))  # heartbeat
    finder._record(b"d3", _ad("d3", "h3:2", clock.now_ms))  # scale-out
    finder.reconcile()
    assert sorted(link.address for link in links) == ["h2:1", "h3:2"]
    assert [link.address for link in made if link.stopped] == ["h1:1"]

    clock.now_ms += LIVENESS_INTERVALS * 1000 + 1  # no more heartbeats: both crashed
    finder.reconcile()
    assert links == []
    assert all(link.stopped for link in made)


def test_a_steady_set_keeps_its_links() -> None:
    clock, made, links = _Clock(), list[_Link](), list[Any]()
    finder = _discovery(links, clock, made)
    finder._record(b"d1", _ad("d1", "h1:1", clock.now_ms))
    finder.reconcile()
    first = list(links)
    for _ in range(3):
        clock.now_ms += 1000
        finder._record(b"d1", _ad("d1", "h1:1", clock.now_ms))
        finder.reconcile()
    assert links == first and len(made) == 1


def test_undecodable_records_are_ignored() -> None:
    clock, made, links = _Clock(), list[_Link](), list[Any]()
    finder = _discovery(links, clock, made)
    finder._record(b"d1", b"\xff\xff\xff")
    finder.reconcile()
    assert links == []


def test_a_connected_deduper_is_kept_while_its_heartbeats_cannot_be_written() -> None:
    """A destination outage stops the heartbeats, not the link: only a tombstone or a lost link ends it."""
    clock, made, links = _Clock(), list[_Link](), list[Any]()
    finder = _discovery(links, clock, made)
    finder._record(b"d1", _ad("d1", "h1:1", clock.now_ms))
    finder.reconcile()
    made[0].connected = True
    clock.now_ms += 10 * LIVENESS_INTERVALS * 1000
    finder.reconcile()
    assert [link.address for link in links] == ["h1:1"]
    made[0].connected = False  # the stream ended: a crash
    finder.reconcile()
    assert links == [] and made[0].stopped


def test_a_tombstone_ends_a_connected_link() -> None:
    clock, made, links = _Clock(), list[_Link](), list[Any]()
    finder = _discovery(links, clock, made)
    finder._record(b"d1", _ad("d1", "h1:1", clock.now_ms))
    finder.reconcile()
    made[0].connected = True
    finder._record(b"d1", None)
    finder.reconcile()
    assert links == [] and made[0].stopped
