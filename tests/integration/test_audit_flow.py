"""Audits of a real flow (wrapper and deduper as processes): both alignments, incremental runs, removed ranges."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from ferryman.config import load_config
from ferryman_auditor import AuditRange, run_audit
from ferryman_local import reserve_port
from prometheus_client.parser import text_string_to_metric_families
from pyspark.sql import SparkSession

from tests.helpers.audit import produce_copy
from tests.helpers.grpc_clients import local
from tests.helpers.kafka import KafkaCluster, create_topic, produce_sequences, read_all, wait_until
from tests.helpers.services import running_flow

pytestmark = pytest.mark.integration

PARTITIONS = 3
FIRST = 3000  # per partition: 9 k records, then 1.5 k more
MORE = 500
REMOVED_BEFORE = 100  # source partition 0 loses offsets [0, 100) to a deletion before the first audit


def test_a_flow_audits_clean_by_both_alignments_then_only_new_data_is_checked(
    spark: SparkSession,
    source_cluster: KafkaCluster,
    destination_cluster: KafkaCluster,
    unique_name: Callable[[str], str],
    tmp_path: Path,
) -> None:
    topic = unique_name("audited")
    create_topic(source_cluster.bootstrap_servers, topic, PARTITIONS)
    # Transactions leave markers between records (sparse offsets); an aborted one must never be expected.
    produce_sequences(
        source_cluster.bootstrap_servers, topic, PARTITIONS, FIRST, transactional=True, records_per_transaction=400
    )
    _abort_some(source_cluster.bootstrap_servers, topic)
    flow = unique_name("flow")
    dest = f"src.{topic}"
    grpc_address, metrics_address = local(reserve_port()), local(reserve_port())
    addresses = {"listen_address": grpc_address, "metrics_address": metrics_address}
    with running_flow(
        source_cluster, destination_cluster, tmp_path, flow=flow, topics=[topic], deduper=addresses
    ) as running:
        read_all(destination_cluster.bootstrap_servers, dest, expected=PARTITIONS * FIRST, timeout_s=120)
        # Retention at the source: the oldest records of partition 0 are gone before anyone audited them.
        admin = AdminClient({"bootstrap.servers": source_cluster.bootstrap_servers})
        admin.delete_records([TopicPartition(topic, 0, REMOVED_BEFORE)])[TopicPartition(topic, 0)].result(30)
        config = load_config(running.config)

        first = run_audit(spark, config, config.flows[0], AuditRange())
        assert first.verdict == "EXACTLY_ONCE", first.as_dict()
        parts = {p.partition: p for p in first.partitions}
        for p, part in parts.items():
            assert part.offset_map is not None, part  # the flow writes the map: both alignments ran and agree
            assert part.alignments_agree
            removed = p == 0
            assert part.unverifiable_ranges == ([[0, REMOVED_BEFORE]] if removed else [])
            # Copies of the removed records cannot be checked: reported apart, never as missing.
            assert (part.unverifiable > 0) == removed
            assert part.expected + part.unverifiable == FIRST, part

        produce_sequences(source_cluster.bootstrap_servers, topic, PARTITIONS, MORE, start=FIRST)
        read_all(destination_cluster.bootstrap_servers, dest, expected=PARTITIONS * (FIRST + MORE), timeout_s=120)
        second = run_audit(spark, config, config.flows[0], AuditRange())
        assert second.verdict == "EXACTLY_ONCE", second.as_dict()
        assert {p.partition: p.expected for p in second.partitions} == dict.fromkeys(range(PARTITIONS), MORE)

        # A duplicate of one of the newest records, written next to the flow's copies.
        produce_sequences(source_cluster.bootstrap_servers, topic, PARTITIONS, 10, start=FIRST + MORE)
        copied = read_all(destination_cluster.bootstrap_servers, dest, expected=PARTITIONS * (FIRST + MORE + 10))
        producer = Producer({"bootstrap.servers": destination_cluster.bootstrap_servers})
        produce_copy(producer, dest, copied[2][-3])
        assert producer.flush(30) == 0
        third = run_audit(spark, config, config.flows[0], AuditRange())
        # The last verdict per partition is in the deduper's status (`ferryman status`) and its metrics.
        latest = dict.fromkeys(range(PARTITIONS), "EXACTLY_ONCE") | {2: "VIOLATED"}
        wait_until(lambda: _status_verdicts(grpc_address) == latest, 30, message="the verdicts in the status")
        scraped = urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=10).read().decode()
        violated = {
            int(s.labels["partition"]): s.value
            for family in text_string_to_metric_families(scraped)
            for s in family.samples
            if s.name == "ferryman_deduper_audit_violated" and (s.labels["flow"], s.labels["topic"]) == (flow, topic)
        }
        assert violated == {p: 1.0 if v == "VIOLATED" else 0.0 for p, v in latest.items()}, scraped
    assert third.verdict == "VIOLATED"
    by_partition = {p.partition: p for p in third.partitions}
    assert by_partition[2].duplicated == 1
    assert by_partition[2].offset_map is not None and by_partition[2].offset_map["duplicated"] == 1
    assert by_partition[2].alignments_agree
    for p, part in by_partition.items():
        assert part.expected == 10
        faults = (part.missing, part.reordered, part.altered, part.unexpected, part.duplicated)
        assert faults == ((0, 0, 0, 0, 1) if p == 2 else (0, 0, 0, 0, 0)), part


LARGE_PARTITIONS, LARGE_PER_PARTITION = 4, 30_000  # 120 k records: the "at least 100 k"


@pytest.mark.nightly
def test_a_clean_replication_of_120k_records_audits_clean(
    spark: SparkSession,
    source_cluster: KafkaCluster,
    destination_cluster: KafkaCluster,
    unique_name: Callable[[str], str],
    tmp_path: Path,
) -> None:
    """The long variant of the first test's first audit (CI runs the 9 k one): every record expected and found."""
    topic = unique_name("large")
    total = LARGE_PARTITIONS * LARGE_PER_PARTITION
    create_topic(source_cluster.bootstrap_servers, topic, LARGE_PARTITIONS)
    produce_sequences(
        source_cluster.bootstrap_servers,
        topic,
        LARGE_PARTITIONS,
        LARGE_PER_PARTITION,
        transactional=True,
        records_per_transaction=5000,
        timeout_s=300,
    )
    flow = unique_name("flow")
    with running_flow(source_cluster, destination_cluster, tmp_path, flow=flow, topics=[topic]) as running:
        read_all(destination_cluster.bootstrap_servers, f"src.{topic}", expected=total, timeout_s=300)
        config = load_config(running.config)
        report = run_audit(spark, config, config.flows[0], AuditRange())
    assert report.verdict == "EXACTLY_ONCE", report.as_dict()
    assert report.totals()["expected"] == report.totals()["found"] == total
    for part in report.partitions:
        assert part.expected == LARGE_PER_PARTITION, part
        assert part.offset_map is not None and part.offset_map["found"] == LARGE_PER_PARTITION, part
        assert part.alignments_agree


def _abort_some(bootstrap: str, topic: str) -> None:
    """An aborted transaction over every partition (written, flushed, then aborted)."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-aborted"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for p in range(PARTITIONS):
        for _ in range(20):
            producer.produce(topic, value=b"aborted", partition=p)
    producer.flush(30)
    producer.abort_transaction(30)


def _status_verdicts(address: str) -> dict[int, str]:
    """The audit verdicts `ferryman status --output json` shows for the deduper at address, by partition."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FERRYMAN_")}
    cli = Path(sys.executable).parent / "ferryman"
    result = subprocess.run(
        [str(cli), "status", "--server", address, "--output", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=environ,
        check=True,
    )
    return {int(v["partition"]): v["verdict"] for v in json.loads(result.stdout).get("audit_verdicts", [])}
