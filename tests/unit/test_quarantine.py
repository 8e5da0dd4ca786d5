"""Which staging records the deduper quarantines, and why (pure logic on real confluent_kafka Messages)."""

from __future__ import annotations

import pytest
from confluent_kafka import Message
from ferryman import envelope
from ferryman.v1 import envelope_pb2
from ferryman_deduper._quarantine import Reason, RejectedRecordError, check

STAGING_PARTITIONS = 8
SOURCE = envelope_pb2.SourcePartition(cluster_id="c", topic="orders", partition=2, topic_id=b"\x01" * 16)
SP = envelope.staging_partition("orders", 2, STAGING_PARTITIONS)


def _good() -> bytes:
    run = envelope.RecordRun(
        offsets=range(10, 13), timestamps_ms=[1, 2, 3], timestamp_types=[1], keys=[b"a", None, b"c"], values=[b"x"] * 3
    )
    return envelope.encode(SOURCE, 9, run, wrapper_id="w", wrapper_epoch=1)


def _msg(value: bytes | None, *, key: bytes | None = b"orders/2", partition: int = SP) -> Message:
    return Message(topic="staging", partition=partition, offset=5, key=key, value=value)


def _reason(msg: Message) -> Reason:
    with pytest.raises(RejectedRecordError) as caught:
        check(msg, STAGING_PARTITIONS)
    return caught.value.reason


def test_a_good_envelope_passes() -> None:
    assert check(_msg(_good()), STAGING_PARTITIONS).last_offset == 12


@pytest.mark.parametrize("key", [None, b"", b"order-42", b"orders/x", b"orders/-1", b"orders/02", b"\xff/1"])
def test_a_key_no_wrapper_writes_is_foreign(key: bytes | None) -> None:
    assert _reason(_msg(_good(), key=key)) is Reason.FOREIGN


def test_each_kind_of_damage_has_its_reason() -> None:
    raw = _good()
    env = envelope_pb2.Envelope.FromString(raw)
    assert _reason(_msg(raw[: len(raw) // 2])) is Reason.MALFORMED
    flipped = envelope_pb2.Envelope.FromString(raw)
    flipped.records = env.records[:-1] + bytes([env.records[-1] ^ 1])
    assert _reason(_msg(flipped.SerializeToString())) is Reason.CHECKSUM_MISMATCH
    newer = envelope_pb2.Envelope.FromString(raw)
    newer.schema_version = envelope.SCHEMA_VERSION + 1
    assert _reason(_msg(newer.SerializeToString())) is Reason.UNKNOWN_SCHEMA_VERSION
    assert _reason(_msg(raw, partition=(SP + 1) % STAGING_PARTITIONS)) is Reason.WRONG_STAGING_PARTITION
    assert _reason(_msg(None)) is Reason.MALFORMED


def test_source_coordinates_altered_outside_the_checksum_are_malformed() -> None:
    """The CRC covers the records only: a flipped topic name would write them to another destination topic."""
    env = envelope_pb2.Envelope.FromString(_good())
    env.source.topic = "ordert"
    assert _reason(_msg(env.SerializeToString())) is Reason.MALFORMED
