"""An audit of a flow whose source is compacted: sparse offsets and tombstones audit clean, by both alignments.

Compaction leaves gaps where overwritten records were, and keeps tombstones
(null values) for ``delete.retention.ms``: the audit must expect exactly the
records that are left, match their copies (the flow's destination offsets are
dense) by content and through the offset map, and count no gap as missing.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from ferryman.config import load_config
from ferryman_auditor import AuditRange, run_audit
from pyspark.sql import SparkSession

from tests.helpers.kafka import KafkaCluster, create_topic, read_all, wait_until
from tests.helpers.services import running_flow

pytestmark = pytest.mark.integration

PARTITIONS = 2
KEYS = 40  # per round, over both partitions
ROUNDS = 12
#: Below this many records left (of KEYS * ROUNDS written, plus the segment rolls), the cleaner has run.
COMPACTED_BELOW = 200


def _freeze(bootstrap: str, topic: str) -> None:
    """No further cleaning: a record becomes cleanable only a day after it was written."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    entry = ConfigEntry("min.compaction.lag.ms", "86400000", incremental_operation=AlterConfigOpType.SET)
    res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry])
    admin.incremental_alter_configs([res])[res].result(30)


def test_a_compacted_source_with_tombstones_audits_clean(
    spark: SparkSession,
    source_cluster: KafkaCluster,
    destination_cluster: KafkaCluster,
    unique_name: Callable[[str], str],
    tmp_path: Path,
) -> None:
    topic = unique_name("audit-compacted")
    bootstrap = source_cluster.bootstrap_servers
    # Tombstones are kept for a day: the source keeps them after cleaning, and so must the audit.
    settings = {"cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.001"}
    settings |= {"min.compaction.lag.ms": "0", "delete.retention.ms": "86400000"}
    create_topic(bootstrap, topic, PARTITIONS, settings)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for round_ in range(ROUNDS):
        for key in range(KEYS):
            if round_ >= ROUNDS // 2 and key % 3 == 0:
                continue  # these keys stop changing: survivors interleaved with removed records (gaps)
            deleted = round_ == ROUNDS - 1 and key % 3 == 1
            value = None if deleted else f"v{round_}".encode()
            producer.produce(topic, key=f"key{key}".encode(), value=value, partition=key % PARTITIONS)
        producer.flush(30)

    def compacted() -> bool:
        # A write after segment.ms rolls the segment, so the cleaner may take the records before it.
        for p in range(PARTITIONS):
            producer.produce(topic, key=b"roll", value=b"x", partition=p)
        producer.flush(10)
        return sum(len(v) for v in read_all(bootstrap, topic).values()) < COMPACTED_BELOW

    wait_until(compacted, timeout_s=120, interval_s=1.0, message="the source topic was never compacted")
    _freeze(bootstrap, topic)
    # A cleaning pass under way when the config changed may still remove records: wait for two equal reads.
    reads = [read_all(bootstrap, topic)]

    def settled() -> bool:
        reads.append(read_all(bootstrap, topic))
        return reads[-1] == reads[-2]

    wait_until(settled, timeout_s=60, interval_s=1.0, message="the source kept changing after compaction froze")
    src = reads[-1]
    assert any(b.offset - a.offset > 1 for recs in src.values() for a, b in itertools.pairwise(recs))
    assert any(r.value is None for recs in src.values() for r in recs)  # tombstones among the records

    with running_flow(
        source_cluster,
        destination_cluster,
        tmp_path,
        flow=unique_name("flow"),
        topics=[topic],
        extra_flow={"replicate_topic_configs": False},  # the destination must not compact behind the audit
    ) as running:
        total = sum(len(v) for v in src.values())
        read_all(destination_cluster.bootstrap_servers, f"src.{topic}", expected=total, timeout_s=120)
        config = load_config(running.config)
        report = run_audit(spark, config, config.flows[0], AuditRange())

    assert report.verdict == "EXACTLY_ONCE", report.as_dict()
    for part in report.partitions:
        left = len(src[part.partition])
        assert part.expected == part.found == left, part  # every gap skipped, not one counted as missing
        assert part.offset_map is not None and part.alignments_agree, part
        assert (part.unverifiable, part.unverifiable_ranges) == (0, []), part
