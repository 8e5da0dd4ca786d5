"""Data lost upstream is loud, never silent: exact ranges in status and logs, held until resent or acknowledged.

Retention is played by ``delete_records`` (what retention does: the log start moves past records), which
makes the deleted range exact and immediate; the local brokers' 1 s retention check would make it approximate.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from ferryman import envelope

from tests.helpers.grpc_clients import LinkedPair, start_linked_pair
from tests.helpers.kafka import KafkaCluster, assert_sequences, create_topic, produce_sequences, read_all, wait_until
from tests.helpers.services import BIN

pytestmark = pytest.mark.integration

STAGING_PARTITIONS = 4
ROUND = 100
#: Replication and a resend round trip on a busy 2-core machine.
TIMEOUT_S = 90.0
#: Ask again for a gap quickly: the tests wait for resend answers.
RESEND_RETRY_S = 1.0


def _delete_before(bootstrap: str, topic: str, partition: int, offset: int) -> None:
    """Delete the records of topic-partition before offset, as retention would."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.delete_records([TopicPartition(topic, partition, offset)], request_timeout=30)
    for fut in futures.values():
        assert fut.result(timeout=30).low_watermark == offset  # the new log start


def _high(bootstrap: str, topic: str, partition: int) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "lost-data-probe"})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)[1])
    finally:
        consumer.close()


def _pair(tmp_path: Path, source: KafkaCluster, destination: KafkaCluster, flow: str, topic: str) -> LinkedPair:
    return start_linked_pair(
        tmp_path,
        source,
        destination,
        flow=flow,
        topics=[topic],
        staging_partitions=STAGING_PARTITIONS,
        deduper={"resend_retry_s": RESEND_RETRY_S},
    )


def test_source_retention_loss_is_a_held_gap_with_its_exact_range_until_acknowledged(
    source_cluster: KafkaCluster,
    destination_cluster: KafkaCluster,
    unique_name: Callable[[str], str],
    tmp_path: Path,
) -> None:
    topic, flow = unique_name("srcloss"), unique_name("flow")
    src, dst = source_cluster.bootstrap_servers, destination_cluster.bootstrap_servers
    dst_topic = f"src.{topic}"
    create_topic(src, topic, 1)
    expected = produce_sequences(src, topic, 1, ROUND)
    pair = _pair(tmp_path, source_cluster, destination_cluster, flow, topic)
    try:
        assert_sequences(read_all(dst, dst_topic, expected=ROUND, timeout_s=TIMEOUT_S), expected)
        assert pair.wrapper.terminate() == 0
        # While the wrapper is down, 100 more records; retention takes the first half of them unread.
        more = produce_sequences(src, topic, 1, ROUND, start=ROUND)[0]
        _delete_before(src, topic, 0, ROUND + ROUND // 2)
        pair.wrapper.start()

        def lost_gap() -> bool:
            status = pair.deduper_status()
            return status is not None and [(g.topic, g.partition, g.missing_from, g.lost_to) for g in status.gaps] == [
                (topic, 0, ROUND, ROUND + ROUND // 2 - 1)
            ]

        wait_until(lost_gap, TIMEOUT_S, message="the gap reported lost with its exact range")
        assert pair.await_wrapper_status().source_records_lost == ROUND // 2
        # What an operator sees: `ferryman status` names the lost range.
        cli = subprocess.run(
            [str(BIN / "ferryman"), "status", "--server", pair.deduper_address],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert cli.returncode == 0, cli.stderr
        assert f"LOST {ROUND}..{ROUND + ROUND // 2 - 1}" in cli.stdout.replace("\n", "")
        assert f"offsets {ROUND}..{ROUND + ROUND // 2 - 1} were deleted" in pair.wrapper.output()
        assert f"no longer holds records {ROUND}..{ROUND + ROUND // 2 - 1}" in pair.deduper.output()
        # Held, never skipped: nothing after the hole reached the destination.
        assert sum(len(r) for r in read_all(dst, dst_topic).values()) == ROUND
        assert pair.deduper.alive
        assert pair.wrapper.alive

        # The way out: acknowledge the loss in the deduper's configuration and restart it.
        assert pair.deduper.config is not None
        cfg = yaml.safe_load(pair.deduper.config.read_text())
        cfg["flows"][0]["acknowledged_losses"] = [
            {"topic": topic, "partition": 0, "through_offset": ROUND + ROUND // 2 - 1, "note": "test: accepted"}
        ]
        pair.deduper.config.write_text(yaml.safe_dump(cfg, sort_keys=False))
        assert pair.deduper.terminate() == 0
        pair.deduper.start()
        # The partition moves with its next record: the skip, then the rest resent from the source.
        last = produce_sequences(src, topic, 1, 10, start=2 * ROUND)[0]
        expected[0].extend(more[ROUND // 2 :] + last)
        assert_sequences(read_all(dst, dst_topic, expected=len(expected[0]), timeout_s=TIMEOUT_S), expected)
        status = pair.await_deduper_status()
        assert status.acknowledged_lost_records == ROUND // 2
        wait_until(lambda: not pair.await_deduper_status().gaps, TIMEOUT_S, message="no gap left")
        assert "acknowledged loss: records 100..149" in pair.deduper.output()
    finally:
        pair.stop()


def test_staging_retention_loss_names_the_staging_range_and_heals_from_the_source(
    source_cluster: KafkaCluster,
    destination_cluster: KafkaCluster,
    unique_name: Callable[[str], str],
    tmp_path: Path,
) -> None:
    topic, flow = unique_name("stgloss"), unique_name("flow")
    src, dst = source_cluster.bootstrap_servers, destination_cluster.bootstrap_servers
    dst_topic = f"src.{topic}"
    staging = f"ferryman.{flow}.staging.internal"
    sp = envelope.staging_partition(topic, 0, STAGING_PARTITIONS)
    create_topic(src, topic, 1)
    expected = produce_sequences(src, topic, 1, ROUND)
    pair = _pair(tmp_path, source_cluster, destination_cluster, flow, topic)
    try:
        assert_sequences(read_all(dst, dst_topic, expected=ROUND, timeout_s=TIMEOUT_S), expected)
        assert pair.deduper.terminate() == 0
        committed = _high(dst, staging, sp)  # the deduper had read and committed everything
        # While the deduper is down, the wrapper stages 100 more records; retention takes them all unread.
        expected[0].extend(produce_sequences(src, topic, 1, ROUND, start=ROUND)[0])
        wait_until(
            lambda: (pair.wrapper_status() or pair.await_wrapper_status()).records_sent >= 2 * ROUND,
            TIMEOUT_S,
            message="the new records staged",
        )
        staged_end = wait_until(lambda: _high(dst, staging, sp) > committed and _high(dst, staging, sp), TIMEOUT_S)
        _delete_before(dst, staging, sp, staged_end)
        pair.deduper.start()
        expected[0].extend(produce_sequences(src, topic, 1, 10, start=2 * ROUND)[0])

        # Healed from the source (the wrapper resends what the lost envelopes held), exactly once.
        assert_sequences(read_all(dst, dst_topic, expected=len(expected[0]), timeout_s=TIMEOUT_S), expected)
        status = pair.await_deduper_status()
        assert [(s.staging_partition, s.first_offset, s.last_offset) for s in status.staging_losses] == [
            (sp, committed, staged_end - 1)
        ]
        assert f"offsets {committed}..{staged_end - 1} were deleted" in pair.deduper.output()
        wait_until(lambda: not pair.await_deduper_status().gaps, TIMEOUT_S, message="no gap left")
    finally:
        pair.stop()
