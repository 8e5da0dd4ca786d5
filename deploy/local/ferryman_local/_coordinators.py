"""Which broker coordinates a transactional id or a consumer group, for tests that take that broker away.

librdkafka has no DescribeTransactions, so the transaction coordinator is found the way the
brokers place it: transactional id ``t`` lives in partition ``abs(t.hashCode()) %
partitions`` of ``__transaction_state`` (Java's ``String.hashCode``, Kafka's ``Utils.abs``),
and that partition's leader is its coordinator. The group coordinator is what
DescribeGroups reports.
"""

from __future__ import annotations

import logging

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from ferryman_local._errors import CoordinatorNotFoundError

_client_log = logging.getLogger("ferryman_local.librdkafka")

TRANSACTION_STATE_TOPIC = "__transaction_state"
"""Kafka's internal topic of transaction coordinators' state."""

_INT_MIN = -(2**31)


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode()`` of text: ``s[0]*31^(n-1) + ... + s[n-1]`` over UTF-16 code units, as int32."""
    units = text.encode("utf-16-be")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + (units[i] << 8 | units[i + 1])) & 0xFFFFFFFF
    return h - 2**32 if h >= 2**31 else h


def coordinator_partition(key: str, partitions: int) -> int:
    """The internal-topic partition that coordinates key (a transactional id or a group id).

    Kafka's ``Utils.abs(key.hashCode()) % partitions``, where ``Utils.abs`` maps
    ``Integer.MIN_VALUE`` to 0 instead of overflowing.
    """
    h = java_string_hash(key)
    return (0 if h == _INT_MIN else abs(h)) % partitions


def transaction_coordinator(bootstrap: str, transactional_id: str, timeout_s: float = 10.0) -> int:
    """Node id of the broker that is now the transaction coordinator of transactional_id.

    Args:
        bootstrap: bootstrap servers of the cluster.
        transactional_id: the producer's ``transactional.id``.
        timeout_s: budget for the metadata request.

    Returns:
        The leader of the id's ``__transaction_state`` partition.

    Raises:
        CoordinatorNotFoundError: the topic does not exist yet (no transaction
            has been initialised on the cluster), or the partition has no leader
            right now (an election is under way).
    """
    admin = AdminClient({"bootstrap.servers": bootstrap}, logger=_client_log)
    try:
        topic = admin.list_topics(TRANSACTION_STATE_TOPIC, timeout=timeout_s).topics.get(TRANSACTION_STATE_TOPIC)
    except KafkaException as exc:
        raise CoordinatorNotFoundError(f"metadata of {TRANSACTION_STATE_TOPIC} from {bootstrap}: {exc}") from exc
    if topic is None or topic.error is not None or not topic.partitions:
        error = "" if topic is None else f" ({topic.error})"
        raise CoordinatorNotFoundError(f"{bootstrap} has no {TRANSACTION_STATE_TOPIC} topic{error}")
    partition = coordinator_partition(transactional_id, len(topic.partitions))
    leader = topic.partitions[partition].leader
    if leader < 0:
        raise CoordinatorNotFoundError(
            f"{TRANSACTION_STATE_TOPIC} partition {partition} (of {transactional_id!r}) has no leader right now"
        )
    return int(leader)


def group_coordinator(bootstrap: str, group_id: str, timeout_s: float = 10.0) -> int:
    """Node id of the broker that is now the coordinator of consumer group group_id.

    The group need not exist: every group id has a coordinator.

    Raises:
        CoordinatorNotFoundError: the brokers could not name one (``__consumer_offsets``
            does not exist yet, or its partition is being moved).
    """
    admin = AdminClient({"bootstrap.servers": bootstrap}, logger=_client_log)
    try:
        description = admin.describe_consumer_groups([group_id], request_timeout=timeout_s)[group_id].result(
            timeout=timeout_s
        )
    except KafkaException as exc:
        raise CoordinatorNotFoundError(f"coordinator of group {group_id!r} from {bootstrap}: {exc}") from exc
    return int(description.coordinator.id)
