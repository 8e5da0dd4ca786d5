"""A consumer group's committed offsets, read and written without joining the group.

Both go through a consumer that never subscribes: its OffsetFetch and OffsetCommit reach the group's
coordinator with no member id and generation -1. Reading so never disturbs the group; the coordinator takes
such a commit only while the group has no members (it answers UNKNOWN_MEMBER_ID otherwise), so consumers
still running at the destination are never moved under their feet. The Admin API's group calls are avoided
on purpose: librdkafka 2.16 can abort the process when a broker restarts during one (docs/notes.md,
Pitfalls, "Do not call coordinator Admin APIs").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, TopicPartition

from ferryman.errors import KafkaOperationError, PreconditionError

#: Coordinator answers to a non-member's commit while the group has members (classic and KIP-848 groups).
_GROUP_HAS_MEMBERS = frozenset(
    {
        KafkaError.UNKNOWN_MEMBER_ID,
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.REBALANCE_IN_PROGRESS,
        KafkaError.STALE_MEMBER_EPOCH,
        KafkaError.FENCED_MEMBER_EPOCH,
    }
)

Position = tuple[str, int]


def _consumer(conf: Mapping[str, Any], group: str) -> Consumer:
    return Consumer(
        {
            **conf,
            "group.id": group,  # never subscribed: no join, no rebalance of the group's members
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
        }
    )


def read_group_offsets(
    conf: Mapping[str, Any], group: str, topics: Callable[[str], bool], budget_s: float
) -> dict[Position, int]:
    """The group's committed offset of each partition of the topics chosen that has one.

    An offset is the next one the group reads. topics: which of the cluster's topics to ask about.

    Raises:
        KafkaOperationError: the cluster or the group's coordinator did not answer within budget_s.
    """
    deadline = time.monotonic() + max(budget_s, 0.1)
    consumer = _consumer(conf, group)
    try:
        metadata = consumer.list_topics(timeout=max(deadline - time.monotonic(), 0.1))
        tps = [
            TopicPartition(name, p)
            for name, meta in sorted(metadata.topics.items())
            if meta.error is None and topics(name)
            for p in sorted(meta.partitions)
        ]
        committed = consumer.committed(tps, timeout=max(deadline - time.monotonic(), 0.1)) if tps else []
    except KafkaException as exc:
        raise KafkaOperationError(f"reading the committed offsets of group {group}", exc) from exc
    finally:
        consumer.close()
    out: dict[Position, int] = {}
    for tp in committed:
        if tp.error is not None:
            raise KafkaOperationError(f"reading the committed offsets of group {group}", KafkaException(tp.error))
        if tp.offset != OFFSET_INVALID and tp.offset >= 0:
            out[(tp.topic, tp.partition)] = tp.offset
    return out


#: How far before a committed offset its last record is looked for: past a transaction's marker and a few
#: aborted records. Not found within it, the caller takes offset - 1.
LOOKBACK = 64


def last_records_below(
    conf: Mapping[str, Any], positions: Mapping[Position, int], budget_s: float
) -> dict[Position, int]:
    """The offset of the last record before each position, as a read_committed reader sees the partition.

    A group's committed offset can stand past transaction markers (a Java consumer at the end of a
    transactional partition commits the offset after the marker), so "offset - 1" is not always a record.
    Partitions not read to their position within budget_s (or with no record in the `LOOKBACK` offsets
    before it) are left out: a refinement, never a failure.
    """
    wanted = {pos: offset for pos, offset in positions.items() if offset > 0}
    if not wanted:
        return {}
    deadline = time.monotonic() + max(budget_s, 0.1)
    found: dict[Position, int] = {}
    done: set[Position] = set()
    consumer = Consumer(
        {
            **conf,
            "group.id": "ferryman-group-offsets",  # assign() only: never joined nor committed
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",  # a look-back below the log start reads from the start
        }
    )
    try:
        consumer.assign([TopicPartition(t, p, max(o - LOOKBACK, 0)) for (t, p), o in sorted(wanted.items())])
        while len(done) < len(wanted) and time.monotonic() < deadline:
            for msg in consumer.consume(500, timeout=min(0.2, max(deadline - time.monotonic(), 0.0))):
                pos = (str(msg.topic()), int(msg.partition() or 0))
                if pos not in wanted or pos in done:
                    continue
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        done.add(pos)
                    continue
                offset = int(msg.offset() or 0)
                if offset >= wanted[pos]:
                    done.add(pos)
                else:
                    found[pos] = offset
    except KafkaException:
        pass  # a refinement: what was read to its end stands
    finally:
        consumer.close()
    return {pos: offset for pos, offset in found.items() if pos in done}


def commit_group_offsets(conf: Mapping[str, Any], group: str, offsets: Mapping[Position, int], budget_s: float) -> None:
    """Commit offsets for the group, which must have no members on that cluster.

    Raises:
        PreconditionError: the group has members (its consumers are running there).
        KafkaOperationError: the coordinator refused, or did not answer within budget_s (the commit may
            then still land).
    """
    if not offsets:
        return
    tps = [TopicPartition(topic, partition, offset) for (topic, partition), offset in sorted(offsets.items())]
    answers: list[tuple[KafkaError | None, list[TopicPartition]]] = []
    consumer = _consumer({**conf, "on_commit": lambda err, parts: answers.append((err, list(parts)))}, group)
    deadline = time.monotonic() + max(budget_s, 0.1)
    try:
        consumer.commit(offsets=tps, asynchronous=True)
        while not answers and time.monotonic() < deadline:
            consumer.poll(min(0.1, max(deadline - time.monotonic(), 0.0)))  # serves the commit's callback
    except KafkaException as exc:
        raise KafkaOperationError(f"committing offsets for group {group}", exc) from exc
    finally:
        consumer.close()
    if not answers:
        raise KafkaOperationError(
            f"committing offsets for group {group}",
            TimeoutError(f"no answer within {budget_s:.0f} s (the commit may still land)"),
        )
    error, parts = answers[0]
    errors = [error] if error is not None else [tp.error for tp in parts if tp.error is not None]
    if not errors:
        return
    if any(e.code() in _GROUP_HAS_MEMBERS for e in errors):
        raise PreconditionError(
            f"consumer group {group} has members at the destination: stop its consumers there, then commit again"
        )
    raise KafkaOperationError(f"committing offsets for group {group}", KafkaException(errors[0]))
