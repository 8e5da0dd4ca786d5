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
