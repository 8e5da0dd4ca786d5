"""Exactly-once replication on two real clusters: content, fidelity, source transactions, compaction."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from ferryman.config import load_config
from ferryman.naming import FlowNames

from tests.helpers.kafka import (
    KafkaCluster,
    assert_exact_copy,
    create_topic,
    produce_sequences,
    read_all,
    recent_create_time_ms,
    wait_until,
)
from tests.helpers.services import running_flow

pytestmark = pytest.mark.integration

PARTITIONS = 4
#: Just under the broker's default max.message.bytes (1048588) once key and
#: headers are added: the largest record a source topic accepts by default.
NEAR_LIMIT_BYTES = 1_040_000


def _produce_mixed(bootstrap: str, topic: str, per_partition: int) -> int:
    """Records covering every shape: null keys, tombstones, empty values, repeated and null headers."""
    p = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20, "message.max.bytes": 2_000_000}
    )
    n = 0
    base_ts = recent_create_time_ms()  # explicit create times the retention keeps
    for i in range(per_partition):
        for part in range(PARTITIONS):
            key = None if i % 7 == 0 else f"k{i}".encode()
            value: bytes | None = f"{topic}:{part}:{i}".encode()
            if i % 11 == 0:
                value = None  # tombstone
            elif i % 13 == 0:
                value = b""  # empty, not null
            headers: list[tuple[str, str | bytes | None]] | None = (
                [("h", b"1"), ("h", b"2"), ("n", None), ("e", b"")] if i % 5 == 0 else None
            )
            if i == per_partition // 2:
                value = bytes([part % 256]) * NEAR_LIMIT_BYTES
            while True:
                try:
                    p.produce(topic, value=value, key=key, partition=part, headers=headers, timestamp=base_ts + i)
                    break
                except BufferError:
                    p.poll(0.1)
            n += 1
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(60) == 0
    return n


def _set_topic_config(bootstrap: str, topic: str, name: str, value: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)],
    )
    admin.incremental_alter_configs([res])[res].result(30)


def test_exact_copy_of_every_record_shape(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    topics = [unique_name(f"mixed{i}") for i in range(3)]
    total = 0
    for t in topics:
        create_topic(
            source_cluster.bootstrap_servers,
            t,
            PARTITIONS,
            {"retention.ms": "86400000", "message.timestamp.type": "CreateTime"},
        )
        total += _produce_mixed(source_cluster.bootstrap_servers, t, 8500)
    assert total >= 100_000

    with running_flow(source_cluster, destination_cluster, tmp_path, flow=unique_name("flow"), topics=topics) as f:
        for t in topics:
            src = read_all(source_cluster.bootstrap_servers, t)
            expected = sum(len(v) for v in src.values())
            dst = read_all(destination_cluster.bootstrap_servers, f"src.{t}", expected=expected, timeout_s=180)
            assert_exact_copy(src, dst)
        assert f.wrapper.terminate() == 0
        assert f.deduper.terminate() == 0
    assert "produce path direct to librdkafka" in f.deduper.output()

    # Destination topics: same partition count, replicated configs minus the excluded ones.
    admin = AdminClient({"bootstrap.servers": destination_cluster.bootstrap_servers})
    md = admin.list_topics(timeout=30)
    res = ConfigResource(ResourceType.TOPIC, f"src.{topics[0]}")
    configs = admin.describe_configs([res])[res].result(30)
    assert len(md.topics[f"src.{topics[0]}"].partitions) == PARTITIONS
    assert configs["retention.ms"].value == "86400000"
    assert configs["message.timestamp.type"].source != 1  # not copied: a DYNAMIC_TOPIC_CONFIG would be 1


def test_exact_copy_through_produce_calls_when_direct_produce_is_off(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    """The deduper's fallback path (``produce()`` per record) copies every shape as exactly as the direct one.

    The flow also leaves a topic config out of the topics it creates (``topic_configs_exclude``).
    """
    topic = unique_name("mixed-calls")
    create_topic(
        source_cluster.bootstrap_servers,
        topic,
        PARTITIONS,
        {"message.timestamp.type": "CreateTime", "retention.ms": "86400000", "max.message.bytes": "2000000"},
    )
    _produce_mixed(source_cluster.bootstrap_servers, topic, 600)
    with running_flow(
        source_cluster,
        destination_cluster,
        tmp_path,
        flow=unique_name("flow"),
        topics=[topic],
        deduper={"direct_produce": False},
        extra_flow={"topic_configs_exclude": [r"retention\.ms"]},
    ) as f:
        src = read_all(source_cluster.bootstrap_servers, topic)
        dst = read_all(
            destination_cluster.bootstrap_servers, f"src.{topic}", expected=sum(map(len, src.values())), timeout_s=120
        )
        assert_exact_copy(src, dst)
        assert f.deduper.terminate() == 0
    assert "produce path produce() per record (direct_produce: false)" in f.deduper.output()
    admin = AdminClient({"bootstrap.servers": destination_cluster.bootstrap_servers})
    res = ConfigResource(ResourceType.TOPIC, f"src.{topic}")
    configs = admin.describe_configs([res])[res].result(30)
    assert configs["max.message.bytes"].value == "2000000"  # replicated
    assert configs["retention.ms"].source != 1  # excluded: not a DYNAMIC_TOPIC_CONFIG of the created topic


def test_aborted_source_transactions_are_never_replicated(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    topic = unique_name("txn")
    create_topic(source_cluster.bootstrap_servers, topic, PARTITIONS)
    p = Producer({"bootstrap.servers": source_cluster.bootstrap_servers, "transactional.id": unique_name("txp")})
    p.init_transactions(30)
    for batch in range(30):
        p.begin_transaction()
        for i in range(100):
            p.produce(
                topic, value=f"b{batch}-{i}-{'abort' if batch % 3 == 1 else 'keep'}".encode(), partition=i % PARTITIONS
            )
        if batch % 3 == 1:
            assert p.flush(30) == 0  # written, then aborted (an abort before that may be refused, and skips nothing)
            p.abort_transaction(30)
        else:
            p.commit_transaction(30)
    src = read_all(source_cluster.bootstrap_servers, topic)
    assert sum(len(v) for v in src.values()) == 2000
    with running_flow(source_cluster, destination_cluster, tmp_path, flow=unique_name("flow"), topics=[topic]):
        dst = read_all(destination_cluster.bootstrap_servers, f"src.{topic}", expected=2000, timeout_s=120)
        assert_exact_copy(src, dst)
        values = [r.value for recs in dst.values() for r in recs]
        assert not any(v is not None and v.endswith(b"abort") for v in values)
        # Offsets at the destination are dense per transaction, source offsets are not:
        # the aborted records and the markers left gaps that must not confuse the deduper.
        assert any(b.offset - a.offset > 1 for recs in src.values() for a, b in itertools.pairwise(recs))


def test_compacted_source_with_offset_gaps(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    topic = unique_name("compact")
    create_topic(
        source_cluster.bootstrap_servers,
        topic,
        PARTITIONS,
        {
            "cleanup.policy": "compact",
            "segment.ms": "100",
            "min.cleanable.dirty.ratio": "0.001",
            "min.compaction.lag.ms": "0",
            "delete.retention.ms": "100",
        },
    )
    p = Producer({"bootstrap.servers": source_cluster.bootstrap_servers, "linger.ms": 5})
    for round_ in range(20):
        # Later rounds overwrite only some keys, so the survivors of compaction are
        # interleaved with removed records: offset gaps inside the partition.
        for key in range(48):
            if round_ >= 10 and (key // PARTITIONS) % 2:
                continue  # in every partition, every other key stops changing
            p.produce(topic, key=f"key{key}".encode(), value=f"v{round_}".encode(), partition=key % PARTITIONS)
        p.flush(30)

    def compacted() -> bool:
        # Keep rolling segments (a write after segment.ms) until the cleaner has removed overwritten records.
        for part in range(PARTITIONS):
            p.produce(topic, key=b"roll", value=b"x", partition=part)
        p.flush(10)
        recs = read_all(source_cluster.bootstrap_servers, topic)
        return sum(len(v) for v in recs.values()) < 200

    wait_until(compacted, timeout_s=120, interval_s=1.0, message="source topic was never compacted")
    # Freeze the source: no further cleaning while we replicate and compare.
    _set_topic_config(source_cluster.bootstrap_servers, topic, "min.compaction.lag.ms", "86400000")
    # A cleaning pass already under way still removes records (an overwritten "roll", say) after the
    # config change: take the source as it is once two reads a second apart agree.
    reads = [read_all(source_cluster.bootstrap_servers, topic)]

    def settled() -> bool:
        reads.append(read_all(source_cluster.bootstrap_servers, topic))
        return reads[-1] == reads[-2]

    wait_until(settled, timeout_s=60, interval_s=1.0, message="source topic kept changing after compaction froze")
    src = reads[-1]
    assert any(b.offset - a.offset > 1 for recs in src.values() for a, b in itertools.pairwise(recs))
    # The destination must not compact behind our back while we compare: configs are not replicated here.
    with running_flow(
        source_cluster,
        destination_cluster,
        tmp_path,
        flow=unique_name("flow"),
        topics=[topic],
        extra_flow={"replicate_topic_configs": False},
    ):
        expected = sum(len(v) for v in src.values())
        dst = read_all(destination_cluster.bootstrap_servers, f"src.{topic}", expected=expected, timeout_s=120)
        assert_exact_copy(src, dst)


def test_the_wrapper_commits_its_source_positions_while_it_runs(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    """The periodic source-offset commit lands while the wrapper runs, not only at shutdown."""
    topic, flow = unique_name("commits"), unique_name("flow")
    create_topic(source_cluster.bootstrap_servers, topic, PARTITIONS)
    produce_sequences(source_cluster.bootstrap_servers, topic, PARTITIONS, 2000)
    with running_flow(source_cluster, destination_cluster, tmp_path, flow=flow, topics=[topic]) as f:
        config = load_config(f.config)
        names = FlowNames.of(config.flows[0], wrapper_group=config.wrapper.group_id)
        group = Consumer({"bootstrap.servers": source_cluster.bootstrap_servers, "group.id": names.wrapper_group})
        try:
            read_all(destination_cluster.bootstrap_servers, f"src.{topic}", expected=2000 * PARTITIONS, timeout_s=120)

            def every_partition_committed_to_its_end() -> bool:
                committed = group.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)
                return all(tp.error is None and tp.offset == 2000 for tp in committed)

            wait_until(every_partition_committed_to_its_end, 30, message="source offsets committed to the end")
            assert f.wrapper.alive and f.deduper.alive
        finally:
            group.close()


def test_at_least_once_holds_at_a_record_the_destination_refuses_until_it_is_taken(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    """exactly_once: false has no transaction to fail: a failed delivery must still stop the commit.

    The destination topic refuses a record larger than its ``max.message.bytes``.
    The deduper must not commit the staging offsets past it (it rewinds and tries
    again) and must deliver it once the topic takes it: at least once, nothing lost.
    """
    topic = unique_name("alo")
    create_topic(source_cluster.bootstrap_servers, topic, 1, {"message.timestamp.type": "CreateTime"})
    dest_topic = f"src.{topic}"
    create_topic(destination_cluster.bootstrap_servers, dest_topic, 1, {"max.message.bytes": "20000"})
    big = b"B" * 50_000
    values = [b"small-%d" % i for i in range(30)] + [big] + [b"small-%d" % i for i in range(30, 60)]
    producer = Producer({"bootstrap.servers": source_cluster.bootstrap_servers, "enable.idempotence": True})
    for v in values:
        producer.produce(topic, value=v, partition=0)
    assert producer.flush(30) == 0

    with running_flow(
        source_cluster,
        destination_cluster,
        tmp_path,
        flow=unique_name("flow"),
        topics=[topic],
        # No offset map: its first- and last-record callbacks would report the failure by themselves.
        extra_flow={"exactly_once": False, "emit_offset_mappings": False},
    ) as f:
        f.deduper.wait_for_log("MSG_SIZE_TOO_LARGE", timeout_s=90)
        _set_topic_config(destination_cluster.bootstrap_servers, dest_topic, "max.message.bytes", "1048588")

        def delivered() -> bool:
            copied = read_all(destination_cluster.bootstrap_servers, dest_topic, timeout_s=30)
            return big in {r.value for r in copied.get(0, [])}

        wait_until(delivered, timeout_s=120, message="the refused record, once the topic takes it")
        copied = [r.value for r in read_all(destination_cluster.bootstrap_servers, dest_topic)[0]]
        assert set(copied) == set(values)  # at least once: every record, duplicates allowed
        assert f.deduper.terminate() == 0
    assert "produce path produce() per record (at-least-once: a delivery report per record)" in f.deduper.output()
