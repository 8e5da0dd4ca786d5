"""Following one flow's definition in the flow store, on a thread of its own.

Running wrappers and dedupers use `FlowWatcher` to apply changes made through the admin API
without a restart: it tails the store topic (``read_committed``, so only committed writes)
and calls back with the flow's new `FlowConfig`, or None once the flow is deleted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ferryman.client_config import base_config
from ferryman.config import ClusterConfig, FlowConfig
from ferryman.errors import FlowFieldError
from ferryman.flows._model import to_config
from ferryman.naming import FLOWS_TOPIC
from ferryman.tail import CompactedTail
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
        self._name = name
        self._key = name.encode()
        self._on_change = on_change
        conf = base_config(cluster, f"{client_id}-flows-watch")
        conf.update(
            {
                "group.id": "ferryman-flows-watch",  # assigned, never committed
                "fetch.wait.max.ms": 100,
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )
        self._tail = CompactedTail(conf, FLOWS_TOPIC, self._record, name=f"ferryman-flow-watch-{name}", poll_s=POLL_S)
        self._last: bytes | None = None
        self._seen = False

    def start(self) -> None:
        """Start following the store."""
        self._tail.start()

    def stop(self) -> None:
        """Stop and wait for the thread (idempotent)."""
        self._tail.stop(5 * POLL_S)

    def _record(self, key: bytes | None, value: bytes | None) -> None:
        if key == self._key:
            self._changed(value)

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
