"""Hostile staging records on real brokers: quarantined to the dead-letter topic, never replicated, never a crash."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer
from ferryman import envelope
from ferryman.v1 import envelope_pb2
from ferryman_deduper import _quarantine as quarantine

from tests.helpers.grpc_clients import LinkedPair, start_linked_pair
from tests.helpers.kafka import (
    ConsumedRecord,
    KafkaCluster,
    assert_sequences,
    create_topic,
    produce_sequences,
    read_all,
    wait_until,
)

pytestmark = pytest.mark.integration

PARTITIONS = 2
STAGING_PARTITIONS = 4
PER_ROUND = 100
#: Small envelopes: the healing part needs envelope boundaries it can predict.
ENVELOPE_RECORDS = 20
#: Replication of a few hundred records on a busy 2-core machine.
COPY_TIMEOUT_S = 90.0


def _plant(bootstrap: str, records: list[tuple[int, bytes | None, bytes]], topic: str) -> None:
    """Write (staging partition, key, value) records with a plain producer, as someone else would."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for partition, key, value in records:
        producer.produce(topic, value=value, key=key, partition=partition)
    assert producer.flush(30) == 0


def _status_counts(pair: LinkedPair) -> dict[str, int]:
    status = pair.deduper_status()
    return dict(status.bad_envelopes) if status is not None else {}


def _hostile_copies(real: ConsumedRecord, staging_partitions: int) -> list[tuple[str, int, bytes | None, bytes]]:
    """(expected reason, staging partition, key, value) of each kind of bad record, made from a real envelope."""
    assert real.value is not None
    sp = real.partition
    raw = real.value
    env = envelope_pb2.Envelope.FromString(raw)
    payload_at = raw.find(env.records)
    flipped = bytearray(raw)
    flipped[payload_at + len(env.records) // 2] ^= 0x10  # a bit flip inside the records
    wrong_crc = envelope_pb2.Envelope.FromString(raw)
    wrong_crc.records_crc32c = (env.records_crc32c + 1) & 0xFFFFFFFF
    newer = envelope_pb2.Envelope.FromString(raw)
    newer.schema_version = envelope.SCHEMA_VERSION + 1
    return [
        ("malformed", sp, real.key, raw[: len(raw) // 2]),  # truncated
        ("checksum_mismatch", sp, real.key, bytes(flipped)),
        ("checksum_mismatch", sp, real.key, wrong_crc.SerializeToString()),
        ("unknown_schema_version", sp, real.key, newer.SerializeToString()),
        ("wrong_staging_partition", (sp + 1) % staging_partitions, real.key, raw),
        ("foreign", sp, b"order-42", b'{"order": 42, "total": "9.99"}'),
        ("foreign", sp, None, b"\x00\x01garbage"),
    ]


def test_bad_staging_records_go_to_the_dead_letter_topic_and_the_flow_keeps_exactly_once(
    source_cluster: KafkaCluster,
    destination_cluster: KafkaCluster,
    unique_name: Callable[[str], str],
    tmp_path: Path,
) -> None:
    topic = unique_name("hostile")
    flow = unique_name("flow")
    staging_topic = f"ferryman.{flow}.staging.internal"
    dlq_topic = f"ferryman.{flow}.dlq.internal"
    dst_topic = f"src.{topic}"
    dst = destination_cluster.bootstrap_servers
    create_topic(source_cluster.bootstrap_servers, topic, PARTITIONS)
    expected = produce_sequences(source_cluster.bootstrap_servers, topic, PARTITIONS, PER_ROUND)
    pair = start_linked_pair(
        tmp_path,
        source_cluster,
        destination_cluster,
        flow=flow,
        topics=[topic],
        staging_partitions=STAGING_PARTITIONS,
        wrapper={"envelope_max_records": ENVELOPE_RECORDS},
    )
    try:
        assert_sequences(read_all(dst, dst_topic, expected=PARTITIONS * PER_ROUND, timeout_s=COPY_TIMEOUT_S), expected)

        # Every kind of bad record, planted among good ones while the flow runs.
        sp0 = envelope.staging_partition(topic, 0, STAGING_PARTITIONS)
        real = read_all(dst, staging_topic)[sp0][0]
        planted = _hostile_copies(real, STAGING_PARTITIONS)
        _plant(dst, [(sp, key, value) for _, sp, key, value in planted], staging_topic)
        more = produce_sequences(source_cluster.bootstrap_servers, topic, PARTITIONS, PER_ROUND, start=PER_ROUND)
        for p, values in more.items():
            expected[p].extend(values)

        want: dict[str, int] = {}
        for reason, *_ in planted:
            want[reason] = want.get(reason, 0) + 1
        wait_until(lambda: _status_counts(pair) == want, COPY_TIMEOUT_S, message=f"bad envelopes {want} in status")
        # The destination holds each source record once, in order, and nothing of the planted records.
        assert_sequences(read_all(dst, dst_topic, expected=2 * PARTITIONS * PER_ROUND, timeout_s=60), expected)

        # Each planted record is in the dead-letter topic once, byte for byte, with its reason and coordinates.
        dead = [r for rs in read_all(dst, dlq_topic, expected=len(planted)).values() for r in rs]
        assert len(dead) == len(planted)
        by_value = {r.value: r for r in dead}
        for reason, sp, key, value in planted:
            letter = by_value[value]
            headers = dict(letter.headers)
            assert headers[quarantine.HEADER_REASON] == reason.encode()
            assert letter.key == key
            assert letter.partition == sp
            assert headers[quarantine.HEADER_TOPIC] == staging_topic.encode()
            assert headers[quarantine.HEADER_PARTITION] == str(sp).encode()
            offset = int(headers[quarantine.HEADER_OFFSET] or b"-1")
            staged = read_all(dst, staging_topic)[sp]
            assert [r.value for r in staged if r.offset == offset] == [value]
        assert pair.deduper.alive
        # Logged once per episode: one error line for the first bad record of each staging partition.
        log = pair.deduper.output()
        assert log.count("quarantined to") - log.count("flows again") == 2, log[-3000:]
    finally:
        pair.stop()


def _envelope_of(
    source: envelope_pb2.SourcePartition, previous: int, records: list[ConsumedRecord], *, corrupt: bool
) -> bytes:
    """An envelope of source records as a wrapper writes it; corrupt flips a bit in its records after the CRC."""
    run = envelope.RecordRun(
        offsets=[r.offset for r in records],
        timestamps_ms=[r.timestamp_ms for r in records],
        timestamp_types=[envelope.TIMESTAMP_TYPES[r.timestamp_type] for r in records],
        keys=[r.key for r in records],
        values=[r.value for r in records],
    )
    raw = envelope.encode(source, previous, run, wrapper_id="test", wrapper_epoch=1)
    if not corrupt:
        return raw
    env = envelope_pb2.Envelope.FromString(raw)
    env.records = env.records[:-1] + bytes([env.records[-1] ^ 0x01])
    return env.SerializeToString()


def test_a_partition_heals_from_a_resend_after_a_corrupt_copy(
    source_cluster: KafkaCluster,
    destination_cluster: KafkaCluster,
    unique_name: Callable[[str], str],
    tmp_path: Path,
) -> None:
    """A corrupt envelope, then a good one after it: a gap, held; the wrapper's resend after its restart heals it."""
    topic = unique_name("heal")
    flow = unique_name("flow")
    staging_topic = f"ferryman.{flow}.staging.internal"
    dst_topic = f"src.{topic}"
    src, dst = source_cluster.bootstrap_servers, destination_cluster.bootstrap_servers
    create_topic(src, topic, 1)
    expected = produce_sequences(src, topic, 1, PER_ROUND)
    pair = start_linked_pair(
        tmp_path,
        source_cluster,
        destination_cluster,
        flow=flow,
        topics=[topic],
        staging_partitions=STAGING_PARTITIONS,
        wrapper={"envelope_max_records": ENVELOPE_RECORDS},
    )
    try:
        assert_sequences(read_all(dst, dst_topic, expected=PER_ROUND, timeout_s=COPY_TIMEOUT_S), expected)
        assert pair.wrapper.terminate() == 0

        # While the wrapper is down: 40 new source records, staged as a corrupt envelope and a good one after it.
        more = produce_sequences(src, topic, 1, 40, start=PER_ROUND)
        expected[0].extend(more[0])
        fresh = read_all(src, topic, expected=PER_ROUND + 40)[0][PER_ROUND:]
        sp = envelope.staging_partition(topic, 0, STAGING_PARTITIONS)
        coords = envelope.decode(read_all(dst, staging_topic)[sp][0].value).source
        key = f"{topic}/0".encode()
        first, second = fresh[:20], fresh[20:]
        _plant(
            dst,
            [
                (sp, key, _envelope_of(coords, PER_ROUND - 1, first, corrupt=True)),
                (sp, key, _envelope_of(coords, first[-1].offset, second, corrupt=False)),
            ],
            staging_topic,
        )
        wait_until(
            lambda: _status_counts(pair) == {"checksum_mismatch": 1} and pair.await_deduper_status().gaps_detected,
            COPY_TIMEOUT_S,
            message="the corrupt copy quarantined and the gap after it seen",
        )
        # Held, not skipped: nothing after the corrupt copy reached the destination.
        assert sum(len(r) for r in read_all(dst, dst_topic).values()) == PER_ROUND

        pair.wrapper.start()  # it reads again from its last commit and resends: the gap heals
        assert_sequences(read_all(dst, dst_topic, expected=PER_ROUND + 40, timeout_s=COPY_TIMEOUT_S), expected)
        assert pair.deduper.alive
    finally:
        pair.stop()
