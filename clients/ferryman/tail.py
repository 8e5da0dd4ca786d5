"""Following a one-partition compacted topic from its start, in a daemon thread (flow store, audit verdicts).

`CompactedTail` owns the thread, the consumer (assigned, never committing) and the poll loop; its user
gets each record's key and value (None: a tombstone). A tail that fails logs and stops: following is
never worth taking its service down.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

_log = logging.getLogger(__name__)


class CompactedTail:
    """Calls on_record(key, value) from its own thread for every record of partition 0 of topic, from the start.

    Lifecycle: `start` -> `stop` (idempotent). With wait_for_topic_s, a topic that does not exist yet is
    looked for again at that interval (no consumer subscribes to, or auto-creates, a missing topic).
    """

    def __init__(
        self,
        conf: Mapping[str, Any],
        topic: str,
        on_record: Callable[[bytes | None, bytes | None], None],
        *,
        name: str,
        poll_s: float,
        wait_for_topic_s: float | None = None,
    ) -> None:
        self._conf = {
            **conf,
            "enable.auto.commit": False,  # assigned, never committed: every start reads from the beginning
            "isolation.level": "read_committed",
        }
        self._topic = topic
        self._on_record = on_record
        self._poll_s = poll_s
        self._wait_for_topic_s = wait_for_topic_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        """Start following (returns at once)."""
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop following and wait for the thread (up to timeout_s)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        consumer = Consumer(self._conf)
        try:
            if self._wait_for_topic_s is not None:
                while not self._stop.is_set() and not self._topic_exists(consumer):
                    self._stop.wait(self._wait_for_topic_s)
            consumer.assign([TopicPartition(self._topic, 0, OFFSET_BEGINNING)])
            while not self._stop.is_set():
                msg = consumer.poll(self._poll_s)
                if msg is None:
                    continue
                err = msg.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        _log.debug("following %s: %s", self._topic, err)
                    continue
                key = msg.key()
                self._on_record(key if isinstance(key, bytes) else None, msg.value())
        except Exception:
            _log.exception("following %s stopped; what it last read stays in place", self._topic)
        finally:
            consumer.close()

    def _topic_exists(self, consumer: Consumer) -> bool:
        try:
            info = consumer.list_topics(self._topic, timeout=self._poll_s * 5).topics.get(self._topic)
        except KafkaException as exc:
            _log.debug("topic %s: %s", self._topic, exc)
            return False
        return info is not None and info.error is None
