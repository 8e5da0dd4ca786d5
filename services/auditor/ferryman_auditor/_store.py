"""The audit topic ``ferryman.<flow>.audit.internal``: runs, latest verdicts and the checkpoint.

A compacted, one-partition topic in the destination cluster, written by the
auditor only. JSON values under three kinds of keys:

* ``run/<run id>``: a run's whole report (``AuditReport.as_dict``); run ids sort by time;
* ``verdict/<topic>/<partition>``: the latest report of each source partition (the flow's status);
* ``checkpoint``: where the next since-last audit starts, per source partition, and the offset map's
  read positions. It is written last, so a run that fails before it is simply checked again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient
from ferryman.audit_verdicts import VERDICT_PREFIX, verdict_key
from ferryman.deadline import NO_DEADLINE, Deadline
from ferryman.errors import KafkaOperationError
from ferryman.state import COMPACTED_TOPIC_CONFIGS, read_compacted
from ferryman.topics import InternalTopic, describe_topics, ensure_internal_topics

from ferryman_auditor._errors import AuditError
from ferryman_auditor._report import AuditReport

CHECKPOINT_KEY = b"checkpoint"
RUN_PREFIX = b"run/"


@dataclass(frozen=True)
class Checkpoint:
    """Where the next since-last audit starts."""

    partitions: Mapping[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    """(topic, partition) to (next source offset, next destination offset)."""
    map_positions: Mapping[int, int] = field(default_factory=dict)
    """Offset-map topic partition to the offset the next audit reads it from."""

    def to_json(self) -> bytes:
        """The record value."""
        return json.dumps(
            {
                "partitions": [
                    {"topic": t, "partition": p, "source_next": s, "destination_next": d}
                    for (t, p), (s, d) in sorted(self.partitions.items())
                ],
                "map_positions": {str(k): v for k, v in sorted(self.map_positions.items())},
            }
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Checkpoint:
        """Parse a record value."""
        data = json.loads(raw)
        return cls(
            partitions={
                (e["topic"], int(e["partition"])): (int(e["source_next"]), int(e["destination_next"]))
                for e in data.get("partitions", [])
            },
            map_positions={int(k): int(v) for k, v in data.get("map_positions", {}).items()},
        )


@dataclass(frozen=True)
class StoredAudits:
    """Everything the audit topic holds."""

    checkpoint: Checkpoint | None
    runs: Sequence[AuditReport]
    """Runs in run-id (time) order."""
    verdicts: Mapping[tuple[str, int], dict[str, Any]]
    """Latest report of each source partition."""


class AuditStore:
    """Reads and writes one flow's audit topic."""

    def __init__(self, client_config: Mapping[str, Any], topic: str, timeout_s: float) -> None:
        self._conf = dict(client_config)
        self._topic = topic
        self._timeout_s = timeout_s

    def load(self, deadline: Deadline = NO_DEADLINE) -> StoredAudits:
        """Read the whole topic (empty if it does not exist yet), each Kafka call within the budget and deadline.

        Raises:
            AuditError: a record cannot be parsed.
            KafkaOperationError: the topic cannot be read within the budget or the deadline.
        """
        what = f"reading the audit topic {self._topic}"
        admin = AdminClient(self._conf)
        try:
            if self._topic not in describe_topics(admin, [self._topic], deadline.budget(self._timeout_s, what)):
                return StoredAudits(None, [], {})
        except (KafkaException, KafkaOperationError) as exc:  # librdkafka's error, or no answer in time
            raise KafkaOperationError(what, exc) from exc
        conf = {**self._conf, "group.id": "ferryman-auditor-store"}
        records = read_compacted(conf, self._topic, [0], deadline.budget(self._timeout_s, what))[0]
        try:
            raw_checkpoint = records.get(CHECKPOINT_KEY)
            checkpoint = Checkpoint.from_json(raw_checkpoint) if raw_checkpoint else None
            runs = [
                AuditReport.from_dict(json.loads(v))
                for k, v in sorted(records.items())
                if k.startswith(RUN_PREFIX) and v is not None
            ]
            verdicts = {}
            for k, v in records.items():
                if k.startswith(VERDICT_PREFIX) and v is not None:
                    entry = json.loads(v)
                    verdicts[(entry["topic"], int(entry["partition"]))] = entry
        except (ValueError, KeyError, TypeError) as exc:
            raise AuditError(f"audit topic {self._topic} holds a record this auditor cannot read: {exc}") from exc
        return StoredAudits(checkpoint, runs, verdicts)

    def save(self, report: AuditReport, checkpoint: Checkpoint | None) -> None:
        """Store a run, the latest verdict of each of its partitions, then the checkpoint (if any).

        Raises:
            AuditError: the records were not acknowledged within the budget.
        """
        admin = AdminClient(self._conf)
        ensure_internal_topics(
            admin, [InternalTopic(self._topic, 1, COMPACTED_TOPIC_CONFIGS, "audit")], self._timeout_s
        )
        producer = Producer({**self._conf, "enable.idempotence": True})
        errors: list[str] = []

        def on_delivery(err: object, _msg: object) -> None:
            if err is not None:
                errors.append(str(err))

        producer.produce(
            self._topic, key=RUN_PREFIX + report.run_id.encode(), value=report.to_json(), on_delivery=on_delivery
        )
        for p in report.partitions:
            entry = {"run_id": report.run_id, "finished_at_ms": report.finished_at_ms, **p.as_dict()}
            key = verdict_key(p.topic, p.partition)
            producer.produce(self._topic, key=key, value=json.dumps(entry).encode(), on_delivery=on_delivery)
        # The checkpoint goes last and only once the run is acknowledged: a checkpoint never points past a run
        # that was not stored.
        if producer.flush(self._timeout_s) or errors:
            raise AuditError(f"storing audit run {report.run_id} in {self._topic}: {errors or 'not acknowledged'}")
        if checkpoint is not None:
            producer.produce(self._topic, key=CHECKPOINT_KEY, value=checkpoint.to_json(), on_delivery=on_delivery)
            if producer.flush(self._timeout_s) or errors:
                raise AuditError(f"storing the audit checkpoint in {self._topic}: {errors or 'not acknowledged'}")
