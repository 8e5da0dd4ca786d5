"""The latest audit verdict per source partition: its record in the audit topic, and a background follower.

The auditor (``ferryman audit``) stores, in the flow's compacted audit topic
(``FlowNames.audit_topic``, one partition, destination cluster), one JSON record
per audited source partition under ``verdict/<topic>/<partition>``: the
partition's last report. ``VerdictFollower`` reads that topic in a thread of its
own, from the beginning and then as audits write it, so a service's status and
metrics show the last verdicts without any work on its data path.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from typing import Any

from ferryman.tail import CompactedTail
from ferryman.v1 import control_pb2

_log = logging.getLogger(__name__)

#: Key prefix of the verdict records: ``verdict/<topic>/<partition>``.
VERDICT_PREFIX = b"verdict/"
#: How long a poll of the follower waits; it is also how soon stop() is seen.
_POLL_S = 1.0
#: How often the follower looks again for an audit topic that does not exist yet (no audit has run).
_TOPIC_RETRY_S = 30.0

_COUNTS = ("expected", "found", "missing", "duplicated", "reordered", "altered", "unexpected", "unverifiable")


def verdict_key(topic: str, partition: int) -> bytes:
    """The audit-topic key of a source partition's latest verdict."""
    return VERDICT_PREFIX + f"{topic}/{partition}".encode()


def parse_verdict(value: bytes) -> control_pb2.AuditVerdict:
    """A verdict record's value (a partition report with ``run_id``, ``finished_at_ms`` and ``verdict``).

    Raises:
        ValueError: the value is not such a record.
    """
    try:
        entry: Mapping[str, Any] = json.loads(value)
        return control_pb2.AuditVerdict(
            topic=str(entry["topic"]),
            partition=int(entry["partition"]),
            verdict=str(entry["verdict"]),
            run_id=str(entry.get("run_id", "")),
            finished_at_ms=int(entry.get("finished_at_ms", 0)),
            **{k: int(entry.get(k, 0)) for k in _COUNTS},
        )
    except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not an audit verdict record: {exc}") from exc


class VerdictFollower:
    """Follows one audit topic in a daemon thread and keeps the latest verdict of each source partition."""

    def __init__(self, consumer_config: Mapping[str, Any], topic: str) -> None:
        conf = {
            **consumer_config,
            "group.id": f"{consumer_config.get('client.id', 'ferryman')}-audit-verdicts",
            "auto.offset.reset": "earliest",
        }
        self._topic = topic
        self._verdicts: dict[tuple[str, int], control_pb2.AuditVerdict] = {}
        self._lock = threading.Lock()
        self._tail = CompactedTail(
            conf, topic, self._take, name="audit-verdicts", poll_s=_POLL_S, wait_for_topic_s=_TOPIC_RETRY_S
        )

    def start(self) -> None:
        """Start following (returns at once)."""
        self._tail.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop following and wait for the thread (up to timeout_s)."""
        self._tail.stop(timeout_s)

    def verdicts(self) -> list[control_pb2.AuditVerdict]:
        """The latest verdicts read so far, by topic and partition."""
        with self._lock:
            return [self._verdicts[k] for k in sorted(self._verdicts)]

    def _take(self, key: bytes | None, value: bytes | None) -> None:
        if key is None or not key.startswith(VERDICT_PREFIX):
            return
        name = key[len(VERDICT_PREFIX) :].decode(errors="replace")
        topic, _, part = name.rpartition("/")
        if value is None:  # a tombstone: the partition's verdict was removed
            with self._lock:
                self._verdicts.pop((topic, int(part)) if part.isdigit() else (name, -1), None)
            return
        try:
            verdict = parse_verdict(value)
        except ValueError as exc:
            _log.warning("audit topic %s, key %s: %s", self._topic, name, exc)
            return
        with self._lock:
            self._verdicts[(verdict.topic, verdict.partition)] = verdict
