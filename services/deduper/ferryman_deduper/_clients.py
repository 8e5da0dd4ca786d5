"""The properties of the deduper's two data clients: its destination producer and its staging consumer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, Message
from ferryman.client_config import data_producer_config, streaming_consumer_config
from ferryman.config import ClusterConfig, DeduperConfig


def producer_config(
    target: ClusterConfig,
    client_id: str,
    dc: DeduperConfig,
    *,
    transactional_id: str | None,
    error_cb: Callable[[KafkaError], None],
    on_delivery: Callable[[KafkaError | None, Message], None],
    on_produce_failed: Callable[[str, int, str], None],
) -> dict[str, Any]:
    """The destination producer: transactional with a transactional_id (exactly-once), else reporting each record.

    ``on_produce_failed(topic, partition, reason)``: its log named the partition that failed a transaction.
    """
    conf = data_producer_config(
        target, client_id, max_message_bytes=dc.max_message_bytes, on_produce_failed=on_produce_failed
    )
    conf.update(
        {
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": dc.linger_ms,
            "compression.type": dc.compression_type,
            "message.max.bytes": dc.max_message_bytes,
            # A transaction may hold up to transaction_max_records records
            # before it is committed; all of them wait in the local queue
            # while the broker is behind.
            "queue.buffering.max.messages": max(100_000, 2 * dc.transaction_max_records),
            # CONCURRENT_TRANSACTIONS right after a commit clears within
            # tens of ms; the 100 ms default backoff would cap us at a few
            # transactions per second (KAFKA-5477).
            "retry.backoff.ms": 20,
            "error_cb": error_cb,
        }
    )
    if transactional_id is not None:
        conf["transactional.id"] = transactional_id
        conf["transaction.timeout.ms"] = dc.transaction_timeout_ms
    else:
        # No transaction fails for a record librdkafka gave up on (message.timeout.ms, a record the
        # destination refuses): a delivery report per record catches it before the staging offsets
        # past it are committed. So the direct path, which has no per-record report, is for
        # exactly-once flows only.
        conf["on_delivery"] = on_delivery
    return conf


def staging_consumer_config(
    target: ClusterConfig,
    client_id: str,
    dc: DeduperConfig,
    *,
    group_id: str,
    instance_id: str,
    on_session_timeout: Callable[[], None],
    error_cb: Callable[[KafkaError], None],
) -> dict[str, Any]:
    """The staging consumer: read committed, positions set by the deduper, a static member of its group."""
    conf = streaming_consumer_config(target, client_id, on_session_timeout=on_session_timeout)
    conf.update(
        {
            "group.id": group_id,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            # Positions are set explicitly on assignment. If a committed
            # position has left the log (staging retention or a deletion
            # ran ahead of us) we restart at the log start: the envelope
            # chain then shows exactly which source records are missing,
            # and they are reported as a gap and held, never skipped.
            "auto.offset.reset": "earliest",
            "partition.assignment.strategy": "cooperative-sticky",
            "group.instance.id": instance_id,
            "session.timeout.ms": dc.session_timeout_ms,
            "error_cb": error_cb,
        }
    )
    return conf
