"""Following one flow's definition in the flow store, on a thread of its own.

Running wrappers and dedupers use `FlowWatcher` to apply changes made through the admin API
without a restart: it tails the store topic (``read_committed``, so only committed writes)
and calls back with the flow's new `FlowConfig`, or None once the flow is deleted.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from ferryman.client_config import base_config
from ferryman.config import ClusterConfig, FlowConfig
from ferryman.errors import FlowFieldError
from ferryman.flows._model import to_config
from ferryman.naming import FLOWS_TOPIC
from ferryman.v1 import flows_pb2

_log = logging.getLogger(__name__)

#: Longest wait of one poll: a change reaches on_change within about this long after its
#: commit (plus librdkafka's fetch wait), well inside the "within seconds" promise.
POLL_S = 0.5


class FlowWatcher:
    """Calls on_change(flow or None) from its thread each time the stored flow name changes.

    The first call reports the flow as stored when the watcher started (None: not stored,
    which is not a deletion and is not reported). Lifecycle: `start` -> `stop` (idempotent).
    """

    def __init__(
        self,
        cluster: ClusterConfig,
        name: str,
        on_change: Callable[[FlowConfig | None], None],
        *,
        client_id: str,
    ) -> None:
        self._cluster = cluster
        self._name = name
        self._key = name.encode()
        self._on_change = on_change
        self._client_id = client_id
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"ferryman-flow-watch-{name}", daemon=True)
        self._last: bytes | None = None
        self._seen = False

    def start(self) -> None:
        """Start following the store."""
        self._thread.start()

    def stop(self) -> None:
        """Stop and wait for the thread (idempotent)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5 * POLL_S)

    def _run(self) -> None:
        conf = base_config(self._cluster, f"{self._client_id}-flows-watch")
        conf.update(
            {
                "group.id": "ferryman-flows-watch",  # assigned, never committed
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": 100,
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )
        consumer = Consumer(conf)
        try:
            consumer.assign([TopicPartition(FLOWS_TOPIC, 0, OFFSET_BEGINNING)])
            while not self._stop.is_set():
                msg = consumer.poll(POLL_S)
                if msg is None:
                    continue
                err = msg.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        _log.debug("flow store watch: %s", err)
                    continue
                if msg.key() == self._key:
                    self._changed(msg.value())
        except Exception:  # a watcher must never take its service down; it logs and stops
            _log.exception("watching flow %s in the flow store failed; live changes are no longer applied", self._name)
        finally:
            consumer.close()

    def _changed(self, value: bytes | None) -> None:
        if value == self._last and self._seen:
            return
        self._seen, self._last = True, value
        if value is None:
            _log.warning("flow %s was deleted from the flow store", self._name)
            self._on_change(None)
            return
        flow = flows_pb2.Flow()
        flow.ParseFromString(value)
        try:
            config = to_config(flow)
        except FlowFieldError as exc:  # written by another version? keep running what we have
            _log.error("flow %s in the flow store is not valid here (%s); ignored", self._name, exc)
            return
        self._on_change(config)
