"""An audit planned while a committed transaction's markers are still on their way (real clusters and Spark).

The coordinator writes a transaction's markers partition by partition after
its decision, so for a moment a flow's watermark can be visible while the
copies committed with it are not. An audit planned then took the watermark as
the range's end and the destination's last stable offset as the window's, and
reported the copies still behind their marker as missing. The planning now
waits, before each read, for the transactions open on what it reads.

Here the destination's last copies sit in a transaction that is still open
(to a reader, the same as one whose marker is on its way) while the
watermark covering them is committed; the transaction commits 1.5 s into the
audit, which must find every record exactly once.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from ferryman.naming import FlowNames
from ferryman.state import COMPACTED_TOPIC_CONFIGS, PartitionKey
from ferryman.topics import cluster_id
from ferryman.v1 import state_pb2
from ferryman_auditor import AuditRange, AuditSettings, run_audit
from pyspark.sql import SparkSession

from tests.helpers import kafka as kafka_helpers
from tests.helpers.audit import audit_config, load, produce_copy
from tests.helpers.kafka import KafkaCluster, create_topic, produce_sequences, read_all

pytestmark = pytest.mark.integration

RECORDS = 60
BEHIND_THE_MARKER = 10


def _transactional(bootstrap: str, txn_id: str) -> Producer:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id})
    p.init_transactions(30)
    return p


def test_an_audit_waits_for_copies_whose_transaction_is_ending(
    spark: SparkSession, source_cluster: KafkaCluster, destination_cluster: KafkaCluster, tmp_path: Path
) -> None:
    topic = kafka_helpers.unique_name("markers", "src")
    dest = kafka_helpers.unique_name("markers", "dst")
    flow = kafka_helpers.unique_name("markers", "flow")
    dst_bootstrap = destination_cluster.bootstrap_servers
    create_topic(source_cluster.bootstrap_servers, topic, 1)
    produce_sequences(source_cluster.bootstrap_servers, topic, 1, RECORDS)
    records = read_all(source_cluster.bootstrap_servers, topic)[0]
    assert len(records) == RECORDS
    create_topic(dst_bootstrap, dest, 1)
    names = FlowNames.of(load(audit_config(source_cluster, destination_cluster, flow, [topic])).flows[0])
    create_topic(dst_bootstrap, names.state_topic, 2, COMPACTED_TOPIC_CONFIGS)

    copier = _transactional(dst_bootstrap, f"{flow}-copier")
    copier.begin_transaction()
    for r in records[: RECORDS - BEHIND_THE_MARKER]:
        produce_copy(copier, dest, r)
    copier.commit_transaction(30)
    copier.begin_transaction()
    for r in records[RECORDS - BEHIND_THE_MARKER :]:
        produce_copy(copier, dest, r)
    copier.flush(30)
    # The watermark of every record, committed: visible while the last copies are not.
    source_id = cluster_id(AdminClient({"bootstrap.servers": source_cluster.bootstrap_servers}), 30)
    state = _transactional(dst_bootstrap, f"{flow}-state")
    state.begin_transaction()
    state.produce(
        names.state_topic,
        key=PartitionKey(topic, 0).encode(source_id),
        value=state_pb2.WatermarkState(watermark=records[-1].offset, destination_topic=dest).SerializeToString(),
        partition=1,
    )
    state.commit_transaction(30)

    data = audit_config(source_cluster, destination_cluster, flow, [topic])
    data["flows"][0]["naming"] = {"policy": "prefix", "rename": {topic: dest}}
    config = load(data)
    committed_at: list[float] = []

    def commit_later() -> None:
        time.sleep(1.5)
        copier.commit_transaction(30)
        committed_at.append(time.monotonic())

    committer = threading.Thread(target=commit_later, name="commit-copies")
    committer.start()
    try:
        report = run_audit(spark, config, config.flows[0], AuditRange(), settings=AuditSettings(reports_dir=tmp_path))
    finally:
        committer.join(60)
    assert committed_at, "the copies' transaction did not commit"
    assert report.verdict == "EXACTLY_ONCE", report.as_dict()
    assert report.totals()["expected"] == report.totals()["found"] == RECORDS
