"""An open gap outlives the deduper that found it (kill -9), with a quiet source and no wrapper to ask.

The envelopes that show a gap are behind the staging offsets the deduper commits; a quiet source sends
no later envelope that would show it again. The gap's end is therefore part of the partition's state,
written in the same transaction as those offsets, and a restore asks for it again.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from ferryman.config import FlowConfig
from ferryman.naming import FlowNames
from ferryman.topics import describe_topics
from ferryman.v1 import control_pb2
from ferryman_deduper._partitions import staging_offsets_metadata

from tests.helpers import kafka as kafka_helpers
from tests.helpers.grpc_clients import LinkedPair, start_linked_pair
from tests.helpers.kafka import (
    KafkaCluster,
    assert_exact_copy,
    create_topic,
    produce_sequences,
    read_all,
    wait_until,
)

pytestmark = pytest.mark.integration

#: Source records, one envelope each; the first DELETED envelopes are deleted from staging unread.
RECORDS = 50
DELETED = 20
#: Process start (Python, Kafka clients, init_transactions) on a 2-core runner takes a few seconds.
START_TIMEOUT_S = 60.0
#: How long one resend round trip may take on loopback (a consumer start and one fetch).
RESEND_S = 30.0


def _staging_records(bootstrap: str, topic: str) -> int:
    records = read_all(bootstrap, topic)
    return sum(len(r) for r in records.values())


def _committed(bootstrap: str, group: str, topic: str) -> TopicPartition:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        tp: TopicPartition = consumer.committed([TopicPartition(topic, 0)], timeout=10)[0]
        return tp
    finally:
        consumer.close()


def _gaps(pair: LinkedPair) -> list[tuple[str, int, int, int]]:
    status: control_pb2.GetDeduperStatusResponse | None = pair.deduper_status()
    if status is None:
        return []
    return [(g.topic, g.partition, g.missing_from, g.missing_to) for g in status.gaps]


def test_an_open_gap_survives_a_kill_9_of_the_deduper_and_is_asked_for_again(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, tmp_path: Path
) -> None:
    """The wrapper wrote every envelope and stopped; the first ones were lost from staging.

    The deduper reads the rest, finds the gap, cannot ask anyone (no wrapper), commits the staging offsets
    and is killed. Restarted, it must know the gap without reading those envelopes again; once a wrapper
    is back, it asks for the records and the copy ends exact. Before the gap was part of the state, the
    restarted deduper knew of no gap, the wrapper's committed source offsets were past every record, and
    the destination stayed empty for good.
    """
    topic = kafka_helpers.unique_name("gap-durable", "topic")
    flow = kafka_helpers.unique_name("gap-durable", "flow")
    create_topic(source_cluster.bootstrap_servers, topic, 1)
    produce_sequences(source_cluster.bootstrap_servers, topic, 1, RECORDS)
    pair = start_linked_pair(
        tmp_path,
        source_cluster,
        destination_cluster,
        flow=flow,
        topics=[topic],
        staging_partitions=1,
        wrapper={"envelope_max_records": 1},
        start=("wrapper",),
    )
    names = FlowNames.of(FlowConfig(name=flow, source="src", target="dst"))
    dst = destination_cluster.bootstrap_servers
    try:
        wait_until(
            lambda: _staging_records(dst, names.staging_topic) >= RECORDS,
            START_TIMEOUT_S,
            message=f"{RECORDS} envelopes in {names.staging_topic}",
        )
        assert pair.wrapper.terminate() == 0  # drained: its source offsets are committed past every record
        prefix = TopicPartition(names.staging_topic, 0, DELETED)
        admin = AdminClient({"bootstrap.servers": dst})  # kept: a client collected early never answers
        admin.delete_records([prefix])[prefix].result(30)

        pair.deduper.start()
        gap = (topic, 0, 0, RECORDS - 1)
        wait_until(lambda: _gaps(pair) == [gap], START_TIMEOUT_S, message=f"the deduper reports the gap {gap}")
        wait_until(
            lambda: _committed(dst, names.deduper_group, names.staging_topic).offset == RECORDS,
            START_TIMEOUT_S,
            message="the staging offsets that showed the gap committed",
        )
        # Committed with the id of the staging topic they were read from.
        staging_id = describe_topics(admin, [names.staging_topic], 30)[names.staging_topic].topic_id
        assert _committed(dst, names.deduper_group, names.staging_topic).metadata == staging_offsets_metadata(
            staging_id
        )
        assert "asked for source records" not in pair.deduper.output()  # nobody to ask yet

        pair.deduper.kill9()
        pair.deduper.start()
        pair.deduper.wait_for_log(
            f"restored an open gap in source partition {topic}-0: records 0..{RECORDS - 1} have not arrived",
            START_TIMEOUT_S,
        )
        wait_until(lambda: _gaps(pair) == [gap], START_TIMEOUT_S, message=f"the restarted deduper reports {gap}")

        pair.wrapper.start()
        src = read_all(source_cluster.bootstrap_servers, topic)
        copied = read_all(dst, f"src.{topic}", expected=RECORDS, timeout_s=START_TIMEOUT_S + RESEND_S)
        assert_exact_copy(src, copied)
        pair.deduper.wait_for_log(f"gap in {topic}-0 closed: records 0..{RECORDS - 1} arrived over the control", 10)
        wait_until(lambda: _gaps(pair) == [], 10, message="no gap left in the deduper's status")
        assert pair.deduper.alive and pair.wrapper.alive
    finally:
        pair.stop()
