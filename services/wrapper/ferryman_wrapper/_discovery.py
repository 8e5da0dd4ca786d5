"""Finding the flow's dedupers in the destination cluster (``deduper_addresses`` empty).

`DeduperDiscovery` tails the flow's dedupers topic (see ``ferryman.advertisement``) and keeps
one `ControlLink` per live deduper address: a deduper that appears gets a link within a
second of its first advertisement, one that writes a tombstone, or stops heartbeating while
its link is down, has its link stopped. The wrapper's list of links is updated in place with one slice assignment, so
the loop and gRPC threads iterating it see either the old or the new set, never a torn one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from ferryman.advertisement import is_live
from ferryman.naming import FlowNames
from ferryman.v1 import state_pb2
from google.protobuf.message import DecodeError

from ferryman_wrapper._control import ControlLink

_log = logging.getLogger(__name__)

#: Longest wait for a record in one poll, and so the longest between two checks of the live
#: set: a new deduper gets its link, and an expired one loses it, within about this long.
_POLL_S = 0.5


class DeduperDiscovery:
    """One control link per live deduper advertised in the flow's dedupers topic."""

    def __init__(
        self,
        *,
        names: FlowNames,
        consumer_config: dict[str, Any],
        make_link: Callable[[str], ControlLink],
        links: list[ControlLink],
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        """Prepare (nothing is read before start()).

        Args:
            names: the flow's names (the dedupers topic).
            consumer_config: destination cluster client settings (bootstrap, security).
            make_link: a new, not yet started link to an address.
            links: the wrapper's links, kept equal to the live dedupers' (changed in place).
            clock_ms: wall clock in ms (advertisements carry the deduper's wall clock).
        """
        self._names = names
        self._consumer_config = {
            **consumer_config,
            # assign() only: no offsets are committed; the id is required by the client.
            "group.id": f"{names.wrapper_group}.discovery",
            "enable.auto.commit": False,
        }
        self._make_link = make_link
        self._links = links
        self._clock_ms = clock_ms
        self._ads: dict[bytes, state_pb2.DeduperAdvertisement] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="deduper-discovery", daemon=True)
        self._consumer: Consumer | None = None

    def start(self) -> None:
        """Start following the dedupers topic (the wrapper's start-up made it: a wrapper may start first)."""
        self._consumer = Consumer(self._consumer_config)
        self._consumer.assign([TopicPartition(self._names.dedupers_topic, 0, OFFSET_BEGINNING)])
        _log.info("discovering dedupers in %s", self._names.dedupers_topic)
        self._thread.start()

    def stop(self) -> None:
        """Stop following the topic (idempotent); the links are the wrapper's to stop."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10 * _POLL_S)
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def _run(self) -> None:
        assert self._consumer is not None
        while not self._stop.is_set():
            try:
                msg = self._consumer.poll(_POLL_S)
                if msg is not None and msg.error() is None:
                    self._record(msg.key() or b"", msg.value())
                self.reconcile()
            except Exception:
                # A thread that died here would leave the links as they are for the wrapper's life:
                # log, wait a poll and carry on (librdkafka recovers its own connection faults).
                _log.exception("deduper discovery failed; retrying")
                self._stop.wait(_POLL_S)

    def _record(self, key: bytes, value: bytes | None) -> None:
        if value is None:
            self._ads.pop(key, None)
            return
        try:
            ad = state_pb2.DeduperAdvertisement.FromString(value)
        except DecodeError:
            _log.warning("ignoring an undecodable record in %s (key %r)", self._names.dedupers_topic, key)
            return
        if ad.flow == self._names.flow and ad.address:
            self._ads[key] = ad

    def reconcile(self) -> None:
        """Start links to live dedupers without one and stop links to dedupers gone.

        A deduper is live while its heartbeat is fresh, or while its link is up: during a
        destination outage its heartbeats cannot be written, yet the link (and the pause it
        carries) still works. A tombstone ends it either way (the deduper is draining).
        """
        now_ms = self._clock_ms()
        advertised = {ad.address: ad for ad in self._ads.values()}
        current = {link.address: link for link in self._links}
        live = {
            address: ad
            for address, ad in advertised.items()
            if is_live(ad, now_ms) or (address in current and current[address].connected)
        }
        if live.keys() == current.keys():
            return
        added = []
        for address in live.keys() - current.keys():
            link = self._make_link(address)
            link.start()
            added.append(link)
            _log.info("linking to deduper %s at %s", live[address].instance_id, address)
        gone = [link for address, link in current.items() if address not in live]
        self._links[:] = [link for link in self._links if link.address in live] + added
        for link in gone:
            _log.info("deduper at %s is gone (tombstone or no heartbeat): stopping its link", link.address)
            link.stop()
