"""Helpers of the audit tests: copy a topic to the destination record by record, planting faults on the way."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, Message, Producer
from ferryman.config import FerrymanConfig, parse_config
from ferryman_auditor import AuditRange, AuditReport, PartitionReport

from tests.helpers.kafka import ConsumedRecord, KafkaCluster, create_topic, read_all
from tests.helpers.services import flow_config, write_config

#: Rewrites one partition's records on their way to the copy (the fault to plant).
Planter = Callable[[list[ConsumedRecord]], list[ConsumedRecord]]


def copy_topic(
    source: KafkaCluster,
    topic: str,
    destination: KafkaCluster,
    destination_topic: str,
    partitions: int,
    plant: Mapping[int, Planter] | None = None,
) -> dict[int, list[ConsumedRecord]]:
    """Copy every committed record of topic to destination_topic (same partition, key, value, headers, timestamp).

    ``plant[p]`` rewrites partition p's records first. Returns the source records.
    """
    src = read_all(source.bootstrap_servers, topic)
    create_topic(destination.bootstrap_servers, destination_topic, partitions)
    producer = Producer({"bootstrap.servers": destination.bootstrap_servers, "enable.idempotence": True})
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            errors.append(err)

    for p, records in sorted(src.items()):
        planter = (plant or {}).get(p)
        planted = planter(list(records)) if planter is not None else records
        for r in planted:
            produce_copy(producer, destination_topic, r, on_delivery)
    assert producer.flush(30) == 0 and not errors, errors
    return src


def produce_copy(producer: Producer, topic: str, r: ConsumedRecord, on_delivery: Any = None) -> None:
    """Produce r to topic, byte for byte (its partition, key, value, headers and create time)."""
    producer.produce(
        topic,
        key=r.key,
        value=r.value,
        headers=list(r.headers) or None,
        partition=r.partition,
        timestamp=r.timestamp_ms,
        on_delivery=on_delivery,
    )


def audit_config(source: KafkaCluster, destination: KafkaCluster, flow: str, topics: Sequence[str]) -> dict[str, Any]:
    """The configuration of a flow over topics (destination ``src.<topic>``), as the services and the CLI take it."""
    return flow_config(
        source_bootstrap=source.bootstrap_servers,
        destination_bootstrap=destination.bootstrap_servers,
        flow=flow,
        topics=topics,
    )


def load(data: Mapping[str, Any]) -> FerrymanConfig:
    """Parse a configuration made by audit_config."""
    return parse_config(data)


def write_audit_config(path: Path, data: Mapping[str, Any]) -> Path:
    """Write a configuration for the CLI."""
    return write_config(path, data)


def with_value(r: ConsumedRecord, value: bytes) -> ConsumedRecord:
    """r with another value."""
    return replace(r, value=value)


def one_partition_report(run_id: str, *, missing: int = 0, unverifiable: int = 0) -> AuditReport:
    """A finished run of flow ``f`` over ``t`` [0]: 10 records expected, missing of them not found, the first
    unverifiable source offsets removed before they could be checked."""
    part = PartitionReport(
        topic="t",
        partition=0,
        destination_topic="src.t",
        expected=10,
        found=10 - missing,
        missing=missing,
        duplicated=0,
        reordered=0,
        altered=0,
        unexpected=0,
        unverifiable=unverifiable,
        unverifiable_ranges=[[0, unverifiable]] if unverifiable else [],
        source_range=[0, 10 + unverifiable],
        destination_range=[0, 10 - missing],
        offset_map=None,
        alignments_agree=True,
    )
    return AuditReport(run_id, "f", 1, 2, AuditRange().describe(), [part])
