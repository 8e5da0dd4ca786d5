"""Topic administration shared by the services: describe, create, grow, configs.

Thin typed wrappers over confluent-kafka's AdminClient futures; every call
takes an explicit timeout and foreign errors surface as KafkaException (for
classification) or as Ferryman errors where the meaning is ours.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    ResourceType,
)

from ferryman.errors import TopicShapeError
from ferryman.kafka_errors import retry_retriable

_log = logging.getLogger(__name__)

#: Topic configs never copied to the destination: broker-specific or
#: destination-policy settings (MirrorMaker 2's DefaultConfigPropertyFilter).
#: message.timestamp.type is among them: destination records keep the source
#: timestamp as their CreateTime.
EXCLUDED_TOPIC_CONFIGS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(p)
    for p in (
        r"follower\.replication\.throttled\.replicas",
        r"leader\.replication\.throttled\.replicas",
        r"message\.timestamp\.difference\.max\.ms",
        r"message\.timestamp\.before\.max\.ms",
        r"message\.timestamp\.after\.max\.ms",
        r"message\.timestamp\.type",
        r"unclean\.leader\.election\.enable",
        r"min\.insync\.replicas",
    )
)


@dataclass(frozen=True)
class TopicInfo:
    """What Ferryman needs to know about a topic."""

    name: str
    topic_id: bytes
    partitions: int
    configs: Mapping[str, str] = field(default_factory=dict)


def watermark_offsets(consumer: Consumer, topic: str, partition: int, *, budget_s: float) -> tuple[int, int]:
    """A partition's (low, high) offsets as consumer sees them.

    High is the last stable offset for a read_committed consumer. A topic created
    a moment ago may have no leader yet; such errors come from this call with the
    code only, and are retried within budget_s (``retry_retriable``).
    """
    return retry_retriable(
        lambda: consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=budget_s),
        what=f"reading the offsets of {topic} [{partition}]",
        budget_s=budget_s,
    )


def uuid_bytes(uuid: object) -> bytes:
    """16-byte form of a confluent-kafka Uuid (topic id)."""
    msb = uuid.get_most_significant_bits()  # type: ignore[attr-defined]
    lsb = uuid.get_least_significant_bits()  # type: ignore[attr-defined]
    return int(msb).to_bytes(8, "big", signed=True) + int(lsb).to_bytes(8, "big", signed=True)


def cluster_id(admin: AdminClient, timeout_s: float) -> str:
    """The cluster id reported by the cluster itself."""
    result = admin.describe_cluster(request_timeout=timeout_s).result(timeout=timeout_s)
    cid = result.cluster_id
    if not cid:
        raise KafkaException(KafkaError(KafkaError._INVALID_ARG, "cluster reported no cluster id"))
    return str(cid)


def list_topic_names(admin: AdminClient, timeout_s: float) -> list[str]:
    """Names of all topics visible to this client."""
    md = admin.list_topics(timeout=timeout_s)
    return sorted(name for name, t in md.topics.items() if t.error is None)


def describe_topics(admin: AdminClient, names: Iterable[str], timeout_s: float) -> dict[str, TopicInfo]:
    """Describe existing topics; missing ones are left out of the result."""
    names = list(names)
    if not names:
        return {}
    futures = admin.describe_topics(TopicCollection(names), request_timeout=timeout_s)
    out: dict[str, TopicInfo] = {}
    for name, fut in futures.items():
        try:
            desc = fut.result(timeout=timeout_s)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                continue
            raise
        out[name] = TopicInfo(name=name, topic_id=uuid_bytes(desc.topic_id), partitions=len(desc.partitions))
    return out


def replicable_configs(admin: AdminClient, names: Iterable[str], timeout_s: float) -> dict[str, dict[str, str]]:
    """Topic configs set explicitly on each topic, minus the excluded ones."""
    resources = [ConfigResource(ResourceType.TOPIC, n) for n in names]
    if not resources:
        return {}
    out: dict[str, dict[str, str]] = {}
    for res, fut in admin.describe_configs(resources, request_timeout=timeout_s).items():
        entries = fut.result(timeout=timeout_s)
        out[res.name] = {
            k: e.value
            for k, e in entries.items()
            if e.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
            and e.value is not None
            and not e.is_sensitive
            and not any(p.fullmatch(k) for p in EXCLUDED_TOPIC_CONFIGS)
        }
    return out


def create_topic(
    admin: AdminClient,
    name: str,
    partitions: int,
    configs: Mapping[str, str],
    timeout_s: float,
    *,
    replication_factor: int = -1,
) -> bool:
    """Create a topic; return False if it already existed.

    replication_factor -1 uses the broker's ``default.replication.factor``.
    """
    topic = NewTopic(name, num_partitions=partitions, replication_factor=replication_factor, config=dict(configs))
    fut = admin.create_topics([topic], request_timeout=timeout_s, operation_timeout=timeout_s)[name]
    try:
        fut.result(timeout=timeout_s)
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return False
        raise
    _log.info("created topic %s with %d partitions %s", name, partitions, dict(configs) or "")
    return True


def grow_partitions(admin: AdminClient, name: str, partitions: int, timeout_s: float) -> None:
    """Grow topic name to the given partition count."""
    fut = admin.create_partitions([NewPartitions(name, partitions)], request_timeout=timeout_s)[name]
    try:
        fut.result(timeout=timeout_s)
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        # Someone else grew it first: fine as long as the count is reached.
        if not (isinstance(err, KafkaError) and err.code() == KafkaError.INVALID_PARTITIONS):
            raise
    _log.info("grew topic %s to %d partitions", name, partitions)


def ensure_internal_topic(
    admin: AdminClient,
    name: str,
    partitions: int,
    configs: Mapping[str, str],
    timeout_s: float,
    *,
    purpose: str,
) -> TopicInfo:
    """Create an internal topic if missing and check the shape of an existing one.

    Raises:
        TopicShapeError: the topic exists with another partition count or
            cleanup policy than Ferryman needs.
    """
    create_topic(admin, name, partitions, configs, timeout_s)
    info = await_topic(admin, name, timeout_s)
    if info is None:
        raise TopicShapeError(f"{purpose} topic {name} does not exist and could not be created")
    if info.partitions != partitions:
        raise TopicShapeError(
            f"{purpose} topic {name} has {info.partitions} partitions but the flow is configured for "
            f"{partitions}; the source-to-staging partition map depends on this count, so it must not "
            f"change. Fix the configuration or recreate the topic after draining it."
        )
    wanted_policy = configs.get("cleanup.policy")
    if wanted_policy is not None:
        actual = _topic_config(admin, name, timeout_s)
        if actual.get("cleanup.policy") != wanted_policy:
            raise TopicShapeError(
                f"{purpose} topic {name} has cleanup.policy={actual.get('cleanup.policy')}, expected {wanted_policy}"
            )
        want_max = configs.get("max.message.bytes")
        if want_max is not None and int(actual.get("max.message.bytes", "0")) < int(want_max):
            raise TopicShapeError(
                f"{purpose} topic {name} has max.message.bytes={actual.get('max.message.bytes')}, "
                f"below the {want_max} needed for records near the size limit once wrapped"
            )
    return info


def await_topic(admin: AdminClient, name: str, timeout_s: float, min_partitions: int = 1) -> TopicInfo | None:
    """Describe name until it exists with min_partitions (metadata propagates after creation)."""
    deadline = time.monotonic() + timeout_s
    while True:
        info = describe_topics(admin, [name], timeout_s).get(name)
        if (info is not None and info.partitions >= min_partitions) or time.monotonic() >= deadline:
            return info
        time.sleep(0.1)  # metadata propagation takes tens of ms: poll briefly


def _topic_config(admin: AdminClient, name: str, timeout_s: float) -> dict[str, str]:
    res = ConfigResource(ResourceType.TOPIC, name)
    entries = admin.describe_configs([res], request_timeout=timeout_s)[res].result(timeout=timeout_s)
    return {k: e.value for k, e in entries.items() if e.value is not None}
