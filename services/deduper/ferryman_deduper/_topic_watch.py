"""Which of the flow's topics still exist, asked without holding the deduper's loop.

The loop asks after a failed transaction (destination, offset-map, dead-letter and dedupers topics deleted
under the flow), after a failed recovery (the state topic) and every sync (the staging topic made again by a
wrapper, the state and dedupers topics), and takes the answer on a later round once it has come. A
describe waited for in the loop held it for its whole timeout whenever the destination was away or had
just thawed: no commits and no NOT_SERVING meanwhile (a broker killed or frozen just as the check was due;
CI, 2026-12-03).
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from ferryman import controller
from ferryman.renewing_admin import RenewingAdmin
from ferryman.topics import TopicInfo, uuid_bytes

_log = logging.getLogger(__name__)

#: How long one describe may go unanswered before librdkafka fails it (and the names are asked again).
REQUEST_TIMEOUT_S = 10.0

#: How long past its request timeout a describe is given up on: the client failed to fail it (a client
#: stuck with no usable broker, replaced by `RenewingAdmin`); its names are asked again.
ABANDON_AFTER_TIMEOUT_S = 5.0

#: What a describe found: a topic's info, None for a topic the cluster says does not exist. Topics it
#: could not answer for (no answer in time, a transport error) are left out: nothing is known of them.
Found = Mapping[str, TopicInfo | None]


class TopicWatch:
    """One DescribeTopics in flight at a time; names asked meanwhile go with the next one."""

    def __init__(self, admin: RenewingAdmin, request_timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self._admin = admin
        self._timeout_s = request_timeout_s
        self._in_flight: dict[str, concurrent.futures.Future[Any]] = {}
        self._waited_at = 0.0
        self._sent_at = 0.0
        self._wanted: set[str] = set()

    def ask(self, names: Iterable[str]) -> None:
        """Have names described: at once if nothing is in flight, else right after the answer in flight."""
        self._wanted.update(names)
        self._send()

    def answers(self) -> Found:
        """What the describe in flight found, once it is answered for every topic; empty until then."""
        if not self._in_flight:
            return {}
        if not all(f.done() for f in self._in_flight.values()):
            now = time.monotonic()
            if now - self._sent_at >= self._timeout_s + ABANDON_AFTER_TIMEOUT_S:
                _log.info("describe topics %s unanswered past its timeout: asked again", sorted(self._in_flight))
                self._wanted.update(self._in_flight)
                self._in_flight = {}
                self._admin.suspect()
                self._send()
                return {}
            if now - self._waited_at >= controller.CONTROLLER_WAIT_S:  # its controller may be gone
                controller.refresh(self._admin.client)
                self._waited_at = now
            return {}
        found: dict[str, TopicInfo | None] = {}
        for name, future in self._in_flight.items():
            try:
                desc = future.result()
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if isinstance(err, KafkaError) and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                    found[name] = None
                else:
                    _log.debug("describe topic %s: %s (asked again next time)", name, exc)
                continue
            found[name] = TopicInfo(name=name, topic_id=uuid_bytes(desc.topic_id), partitions=len(desc.partitions))
        self._in_flight = {}
        self._send()
        return found

    def _send(self) -> None:
        if self._in_flight or not self._wanted:
            return
        names, self._wanted = sorted(self._wanted), set()
        try:
            admin = self._admin.client
            self._in_flight = admin.describe_topics(TopicCollection(names), request_timeout=self._timeout_s)
            self._waited_at = self._sent_at = time.monotonic()
        except KafkaException as exc:  # refused before it was sent (the client is shutting down)
            _log.debug("describe topics %s not sent: %s", names, exc)
