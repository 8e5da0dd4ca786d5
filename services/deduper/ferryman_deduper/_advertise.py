"""The deduper's advertisement in the destination cluster (see ``ferryman.advertisement``).

`Advertiser` writes this deduper's address to the flow's dedupers topic at start, every
``advertise_interval_s`` (a heartbeat wrappers judge liveness by), and a tombstone on a
clean stop, from a thread of its own so that a slow destination never holds up the loop.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from confluent_kafka import KafkaError, Message, Producer
from ferryman.naming import FlowNames
from ferryman.v1 import state_pb2

_log = logging.getLogger(__name__)

#: How long stop() waits for the tombstone to be written. Short: a tombstone that does not
#: make it only delays the wrappers' noticing (the heartbeat expires), and shutdown has
#: a transaction to commit after this.
_TOMBSTONE_BUDGET_S = 5.0


class Advertiser:
    """Keeps one deduper's advertisement fresh in the flow's dedupers topic."""

    def __init__(
        self,
        *,
        names: FlowNames,
        instance_id: str,
        address: str,
        interval_s: float,
        producer_config: dict[str, Any],
    ) -> None:
        """Prepare (nothing is written before start()).

        Args:
            names: the flow's names (the dedupers topic).
            instance_id: this deduper's instance id (the record key).
            address: the advertised ``host:port``.
            interval_s: time between heartbeats.
            producer_config: destination cluster client settings (bootstrap, security).
        """
        self._names = names
        self._key = instance_id.encode()
        self._interval_s = interval_s
        self._ad = state_pb2.DeduperAdvertisement(
            instance_id=instance_id,
            flow=names.flow,
            address=address,
            heartbeat_interval_ms=round(interval_s * 1000),
            started_at_ms=int(time.time() * 1000),
        )
        self._producer = Producer(
            {
                **producer_config,
                # A heartbeat not delivered within its interval is stale anyway: the next one replaces it.
                "message.timeout.ms": max(1000, round(interval_s * 1000)),
                "linger.ms": 0,
            }
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="advertise", daemon=True)
        self._failing = False

    @property
    def address(self) -> str:
        """The advertised address."""
        return self._ad.address

    def start(self) -> None:
        """Advertise now and every interval (the deduper's start-up made the dedupers topic)."""
        _log.info("advertising %s in %s every %.1f s", self._ad.address, self._names.dedupers_topic, self._interval_s)
        self._thread.start()

    def stop(self) -> None:
        """Stop the heartbeats and write a tombstone (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._interval_s + _TOMBSTONE_BUDGET_S)
            self._producer.produce(self._names.dedupers_topic, key=self._key, value=None, on_delivery=self._delivered)
        left = self._producer.flush(_TOMBSTONE_BUDGET_S)
        if left:
            _log.warning("advertisement tombstone not written in %.0f s: wrappers see it expire", _TOMBSTONE_BUDGET_S)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._ad.heartbeat_at_ms = int(time.time() * 1000)
            value = self._ad.SerializeToString()
            self._producer.produce(self._names.dedupers_topic, key=self._key, value=value, on_delivery=self._delivered)
            self._producer.poll(0)
            self._stop.wait(self._interval_s)
            self._producer.poll(0)

    def _delivered(self, err: KafkaError | None, _msg: Message) -> None:
        # Logged once per outage, not per heartbeat: librdkafka keeps trying and the next heartbeat follows.
        if err is not None and not self._failing:
            _log.warning("advertisement not written (wrappers may not find this deduper): %s", err)
        elif err is None and self._failing:
            _log.info("advertisement written again")
        self._failing = err is not None
