"""Durable per-source-partition state: watermarks and topic specs.

The deduper writes a flow's watermarks to its compacted state topic inside the
same transaction as the destination records; the state topic has as many
partitions as the staging topic, and the state of a source partition lives on
the state partition numbered like its staging partition, so a deduper that owns
staging partition ``s`` restores exactly state partition ``s``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from ferryman.envelope import consecutive
from ferryman.errors import KafkaOperationError
from ferryman.topics import settled_ends, watermark_offsets
from ferryman.v1 import envelope_pb2, state_pb2

#: Configs of the compacted internal topics (state, topic specs, offset map).
COMPACTED_TOPIC_CONFIGS = {"cleanup.policy": "compact", "min.compaction.lag.ms": "60000"}


def offset_mapping(
    source: envelope_pb2.SourcePartition,
    destination_topic: str,
    first_destination_offset: int,
    source_offsets: Sequence[int],
) -> state_pb2.OffsetMapping:
    """The offset-map record of records written at consecutive destination offsets.

    Consecutive source offsets (the usual case) are stored as their first one
    and a count; others are listed. Read them back with mapped_source_offsets.
    """
    listed = not consecutive(source_offsets)
    return state_pb2.OffsetMapping(
        source=source,
        destination_topic=destination_topic,
        destination_partition=source.partition,
        first_destination_offset=first_destination_offset,
        source_offsets=source_offsets if listed else (),
        first_source_offset=0 if listed else source_offsets[0],
        record_count=len(source_offsets),
    )


def mapped_source_offsets(mapping: state_pb2.OffsetMapping) -> Sequence[int]:
    """The source offsets an offset-map record maps, in either form; the i-th is at first_destination_offset + i."""
    if mapping.source_offsets:
        return list(mapping.source_offsets)
    return range(mapping.first_source_offset, mapping.first_source_offset + mapping.record_count)


@dataclass(frozen=True, order=True)
class PartitionKey:
    """A source partition, as used for in-memory maps and state keys."""

    topic: str
    partition: int

    def encode(self, cluster_id: str) -> bytes:
        """State-topic key bytes."""
        return state_pb2.WatermarkKey(
            cluster_id=cluster_id, topic=self.topic, partition=self.partition
        ).SerializeToString()

    @staticmethod
    def decode(data: bytes) -> tuple[str, PartitionKey]:
        """Parse state-topic key bytes into (cluster_id, key)."""
        k = state_pb2.WatermarkKey()
        k.ParseFromString(data)
        return k.cluster_id, PartitionKey(k.topic, k.partition)

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


#: fetch.wait.max.ms of restore readers (see read_compacted).
_RESTORE_FETCH_WAIT_MS = 10


def read_compacted(
    consumer_config: dict[str, Any],
    topic: str,
    partitions: Iterable[int],
    timeout_s: float,
    *,
    settle: bool = False,
) -> dict[int, dict[bytes, bytes | None]]:
    """Read partitions of a compacted topic from the beginning to their end.

    Reads with ``read_committed`` up to the last stable offset, so records of
    open or aborted transactions are never seen. Later values replace earlier
    ones per key; a null value (tombstone) is kept as None.

    With settle, first waits until every transaction with records in the
    partitions has ended there (``settled_ends``): a transaction the
    coordinator has committed may still be writing its markers, partition by
    partition, and until then its records are invisible.

    Raises:
        KafkaOperationError: the end was not reached within timeout_s.
    """
    parts = sorted(set(partitions))
    out: dict[int, dict[bytes, bytes | None]] = {p: {} for p in parts}
    if not parts:
        return out
    conf = dict(consumer_config)
    conf.update(
        {
            "group.id": conf.get("group.id", "ferryman-restore"),
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            # Restores hold up start-up and rebalances: have the broker answer
            # at once at the end of a partition instead of after 500 ms.
            "fetch.wait.max.ms": _RESTORE_FETCH_WAIT_MS,
        }
    )
    consumer = Consumer(conf)
    try:
        deadline = time.monotonic() + timeout_s

        # Each partition is read to the end offset the broker gives now (the last stable
        # offset, read_committed), not to the first end-of-partition event: just after a
        # leader change the new leader's high watermark can lag what was committed, and
        # fetches end early at it. Asking for the offsets is refused meanwhile
        # (OFFSET_NOT_AVAILABLE, KIP-207) and retried, like a leadership move or a topic
        # created a moment ago. An empty partition (low == end) has nothing to restore.
        if settle:
            settled = settled_ends(conf, consumer, [(topic, p) for p in parts], deadline)
            ends = {p: settled[(topic, p)] for p in parts}
        else:
            ends = {p: watermark_offsets(consumer, topic, p, budget_s=timeout_s) for p in parts}
        pending = {p for p, (low, end) in ends.items() if low < end}
        if not pending:
            return out
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(pending)])
        while pending:
            if time.monotonic() > deadline:
                raise KafkaOperationError(
                    f"reading {topic} partitions {sorted(pending)} to the end",
                    TimeoutError(f"not done within {timeout_s:.0f}s"),
                )
            for msg in consumer.consume(num_messages=1000, timeout=0.2):
                err = msg.error()
                if err is not None:
                    eof_at = msg.offset()
                    if err.code() == KafkaError._PARTITION_EOF and eof_at is not None:
                        part_eof = msg.partition() or 0
                        if eof_at >= ends[part_eof][1]:
                            pending.discard(part_eof)
                        continue
                    raise KafkaException(err)
                key = msg.key()
                part = msg.partition()
                if key is not None and part is not None:
                    out[part][key] = msg.value()
    finally:
        consumer.close()
    return out


def decode_watermarks(
    records: dict[bytes, bytes | None], cluster_id: str | None = None
) -> dict[PartitionKey, state_pb2.WatermarkState]:
    """Decode state-topic records, optionally keeping one source cluster only."""
    out: dict[PartitionKey, state_pb2.WatermarkState] = {}
    for raw_key, raw_value in records.items():
        cid, key = PartitionKey.decode(raw_key)
        if raw_value is None or (cluster_id is not None and cid != cluster_id):
            continue
        st = state_pb2.WatermarkState()
        st.ParseFromString(raw_value)
        out[key] = st
    return out


def spec_key(cluster_id: str, topic: str) -> bytes:
    """Key of a TopicSpec record in a flow's topic-spec topic."""
    return f"{cluster_id}/{topic}".encode()
