"""The envelope codec (ferryman.envelope): byte-faithful round trips, checksum, malformed input, staging map."""

from __future__ import annotations

import random
import string
import time
import zlib

import pytest
from ferryman import envelope
from ferryman.errors import CorruptEnvelopeError, EnvelopeError
from ferryman.v1 import envelope_pb2

from tests.unit._fakes import Headers

SRC = envelope_pb2.SourcePartition(cluster_id="src-cluster", topic="orders", topic_id=bytes(range(16)), partition=7)


def _record(
    offset: int,
    key: bytes | None = b"k",
    value: bytes | None = b"v",
    headers: Headers | None = None,
    timestamp_ms: int = 1_700_000_000_123,
    timestamp_type: envelope_pb2.TimestampType.ValueType = envelope_pb2.TIMESTAMP_TYPE_CREATE_TIME,
) -> envelope_pb2.Record:
    rec = envelope_pb2.Record(offset=offset, timestamp_ms=timestamp_ms, timestamp_type=timestamp_type)
    if key is not None:
        rec.key = key
    if value is not None:
        rec.value = value
    envelope.add_headers(rec, headers or [])
    return rec


def _encode(
    records: list[envelope_pb2.Record],
    previous_offset: int = -1,
    *,
    wrapper_id: str = "wrapper-1",
    wrapper_epoch: int = 3,
    trace_context: dict[str, str] | None = None,
) -> bytes:
    return envelope.encode(
        SRC,
        previous_offset,
        envelope_pb2.RecordBatch(records=records),
        wrapper_id=wrapper_id,
        wrapper_epoch=wrapper_epoch,
        trace_context=trace_context,
    )


def _key(rec: envelope_pb2.Record) -> bytes | None:
    return rec.key if rec.HasField("key") else None


def _value(rec: envelope_pb2.Record) -> bytes | None:
    return rec.value if rec.HasField("value") else None


# ---------------------------------------------------------------- round trips


def test_round_trip_keeps_coordinates_chain_link_and_metadata() -> None:
    before_ms = int(time.time() * 1000)
    env = envelope.decode(
        _encode(
            [_record(41), _record(45)],
            previous_offset=40,
            wrapper_id="w-9",
            wrapper_epoch=12,
            trace_context={"traceparent": "00-abc-def-01"},
        )
    )
    assert env.source == SRC
    assert env.previous_offset == 40
    assert (env.first_offset, env.last_offset) == (41, 45)
    assert [r.offset for r in env.records] == [41, 45]
    assert (env.wrapper_id, env.wrapper_epoch) == ("w-9", 12)
    assert env.trace_context == {"traceparent": "00-abc-def-01"}
    assert before_ms <= env.wrapped_at_ms <= int(time.time() * 1000)


def test_first_envelope_of_a_partition_links_to_minus_one() -> None:
    env = envelope.decode(_encode([_record(0)], previous_offset=-1))
    assert env.previous_offset == -1
    assert env.first_offset == 0


def test_null_key_and_tombstone_round_trip_as_null() -> None:
    env = envelope.decode(_encode([_record(0, key=None, value=b"v"), _record(1, key=b"k", value=None)]))
    assert (_key(env.records[0]), _value(env.records[0])) == (None, b"v")
    assert (_key(env.records[1]), _value(env.records[1])) == (b"k", None)


def test_empty_bytes_are_not_null() -> None:
    env = envelope.decode(_encode([_record(0, key=b"", value=b""), _record(1, key=None, value=None)]))
    assert (_key(env.records[0]), _value(env.records[0])) == (b"", b"")
    assert (_key(env.records[1]), _value(env.records[1])) == (None, None)


def test_headers_keep_order_repeats_nulls_and_empties() -> None:
    headers: Headers = [
        ("b", b"1"),
        ("a", b"2"),
        ("b", b"3"),  # repeated key, kept in place
        ("n", None),  # null value
        ("e", b""),  # empty, not null
        ("", b"\x00\xff"),  # empty key, binary value
        ("n", None),
    ]
    env = envelope.decode(_encode([_record(0, headers=headers), _record(1)]))
    assert envelope.headers_of(env.records[0]) == headers
    assert envelope.headers_of(env.records[1]) == []


@pytest.mark.parametrize(
    ("timestamp_ms", "timestamp_type"),
    [
        (1_700_000_000_123, envelope_pb2.TIMESTAMP_TYPE_CREATE_TIME),
        (1_700_000_000_456, envelope_pb2.TIMESTAMP_TYPE_LOG_APPEND_TIME),
        (-1, envelope_pb2.TIMESTAMP_TYPE_NOT_AVAILABLE),
        (0, envelope_pb2.TIMESTAMP_TYPE_CREATE_TIME),
        (2**62, envelope_pb2.TIMESTAMP_TYPE_CREATE_TIME),
    ],
)
def test_timestamps_and_types_round_trip(
    timestamp_ms: int, timestamp_type: envelope_pb2.TimestampType.ValueType
) -> None:
    (rec,) = envelope.decode(_encode([_record(9, timestamp_ms=timestamp_ms, timestamp_type=timestamp_type)])).records
    assert (rec.timestamp_ms, rec.timestamp_type) == (timestamp_ms, timestamp_type)


def test_confluent_timestamp_codes_map_to_distinct_proto_types() -> None:
    assert envelope.TIMESTAMP_TYPES == {
        0: envelope_pb2.TIMESTAMP_TYPE_NOT_AVAILABLE,
        1: envelope_pb2.TIMESTAMP_TYPE_CREATE_TIME,
        2: envelope_pb2.TIMESTAMP_TYPE_LOG_APPEND_TIME,
    }


def test_large_and_binary_values_round_trip_byte_for_byte() -> None:
    rng = random.Random(7)
    big = rng.randbytes(3 * 1024 * 1024)
    binary_key = bytes(range(256))
    env = envelope.decode(_encode([_record(5, key=binary_key, value=big), _record(6, value=b"small")]))
    assert _key(env.records[0]) == binary_key
    assert _value(env.records[0]) == big
    assert _value(env.records[1]) == b"small"


def test_many_records_keep_offsets_and_order() -> None:
    offsets = [3, 4, 6, 10, 11, 1000, 1001, 2**40]
    env = envelope.decode(_encode([_record(o, value=str(o).encode()) for o in offsets], previous_offset=1))
    assert [r.offset for r in env.records] == offsets
    assert [_value(r) for r in env.records] == [str(o).encode() for o in offsets]


def test_encode_refuses_an_empty_batch() -> None:
    with pytest.raises(ValueError, match="at least one record"):
        _encode([])


# ---------------------------------------------------------------- corruption and malformed input


def _corrupt_records(data: bytes, mutate: bytes) -> bytes:
    env = envelope_pb2.Envelope.FromString(data)
    env.records = mutate
    return env.SerializeToString()


def test_flipped_bit_in_the_records_is_a_corrupt_envelope() -> None:
    data = _encode([_record(1, value=b"payload-abc"), _record(2)])
    env = envelope_pb2.Envelope.FromString(data)
    for i in range(len(env.records)):
        flipped = bytearray(env.records)
        flipped[i] ^= 0x01
        with pytest.raises(CorruptEnvelopeError, match="checksum mismatch"):
            envelope.decode(_corrupt_records(data, bytes(flipped)))


def test_wrong_checksum_field_is_a_corrupt_envelope() -> None:
    env = envelope_pb2.Envelope.FromString(_encode([_record(1)]))
    env.records_crc32 ^= 0x8000_0000
    with pytest.raises(CorruptEnvelopeError):
        envelope.decode(env.SerializeToString())


def test_corrupt_envelope_is_an_envelope_error() -> None:
    # Callers that catch EnvelopeError (poison staging records) also catch corruption.
    assert issubclass(CorruptEnvelopeError, EnvelopeError)


@pytest.mark.parametrize("data", [None, b""], ids=["none", "empty"])
def test_missing_staging_value_is_an_envelope_error(data: bytes | None) -> None:
    with pytest.raises(EnvelopeError, match="empty staging record"):
        envelope.decode(data)


@pytest.mark.parametrize(
    "data",
    [b"\xff\xff\xff garbage", b"\x0a\xff\xff\xff\xff\x0f", b"\x80", b"not an envelope at all, just text"],
)
def test_garbage_bytes_are_an_envelope_error(data: bytes) -> None:
    with pytest.raises(EnvelopeError):
        envelope.decode(data)


def test_envelope_without_records_is_an_envelope_error() -> None:
    env = envelope_pb2.Envelope(source=SRC, previous_offset=4, records=b"", records_crc32=zlib.crc32(b""))
    with pytest.raises(EnvelopeError, match="without records"):
        envelope.decode(env.SerializeToString())


def test_envelope_without_source_topic_is_an_envelope_error() -> None:
    payload = envelope_pb2.RecordBatch(records=[_record(1)]).SerializeToString()
    env = envelope_pb2.Envelope(
        source=envelope_pb2.SourcePartition(partition=1), records=payload, records_crc32=zlib.crc32(payload)
    )
    with pytest.raises(EnvelopeError):
        envelope.decode(env.SerializeToString())


def test_records_that_do_not_parse_are_an_envelope_error() -> None:
    payload = b"\x0a\xff\xff\xff\xff\x0f"  # a length prefix far beyond the payload
    env = envelope_pb2.Envelope(source=SRC, records=payload, records_crc32=zlib.crc32(payload))
    with pytest.raises(EnvelopeError, match="do not parse"):
        envelope.decode(env.SerializeToString())


def test_random_and_mangled_bytes_only_ever_raise_envelope_errors() -> None:
    """Whatever lands on the staging topic, decode fails with our error or returns records."""
    rng = random.Random(1234)
    good = _encode([_record(5, value=b"abc"), _record(9, key=None)], previous_offset=4)
    for _ in range(3000):
        mode = rng.random()
        if mode < 0.4:
            data = rng.randbytes(rng.randint(1, 80))
        elif mode < 0.7:
            mangled = bytearray(good)
            for _ in range(rng.randint(1, 3)):
                mangled[rng.randrange(len(mangled))] ^= 1 << rng.randrange(8)
            data = bytes(mangled)
        else:
            data = good[: rng.randrange(1, len(good))]
        try:
            env = envelope.decode(data)
        except EnvelopeError:
            continue
        assert env.records
        assert env.source.topic


# ---------------------------------------------------------------- staging partition map


def _topic_names(n: int) -> list[str]:
    rng = random.Random(99)
    alphabet = string.ascii_letters + string.digits + "._-"
    names = ["a", "orders", "__consumer_offsets", "x" * 249, "ünïcode-topic"]
    names += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60))) for _ in range(n)]
    return names


def test_staging_partition_known_values_never_change() -> None:
    # The map is part of the on-disk contract: a change would split one source
    # partition's envelopes over two staging partitions across an upgrade.
    assert envelope.staging_partition("orders", 0, 12) == zlib.crc32(b"orders") % 12
    assert envelope.staging_partition("orders", 5, 12) == (zlib.crc32(b"orders") + 5) % 12
    assert envelope.staging_partition("orders", 0, 1) == 0


@pytest.mark.parametrize("staging_partitions", [1, 2, 3, 12, 50, 997])
def test_staging_partition_is_deterministic_and_in_range(staging_partitions: int) -> None:
    for topic in _topic_names(200):
        for partition in (0, 1, 2, 11, 12, 13, 499, 10_000):
            sp = envelope.staging_partition(topic, partition, staging_partitions)
            assert 0 <= sp < staging_partitions
            assert sp == envelope.staging_partition(topic, partition, staging_partitions)


@pytest.mark.parametrize("staging_partitions", [2, 6, 12, 50])
def test_consecutive_partitions_of_a_topic_spread_over_the_staging_topic(staging_partitions: int) -> None:
    for topic in _topic_names(200):
        first = envelope.staging_partition(topic, 0, staging_partitions)
        for count in (2, staging_partitions // 2, staging_partitions, 3 * staging_partitions):
            parts = [envelope.staging_partition(topic, p, staging_partitions) for p in range(count)]
            # Consecutive source partitions take consecutive staging partitions...
            assert parts == [(first + p) % staging_partitions for p in range(count)]
            # ...so up to staging_partitions of them never share one, and beyond that they balance.
            per_staging = [parts.count(s) for s in range(staging_partitions)]
            assert max(per_staging) - min(per_staging) <= 1


def test_different_topics_start_on_different_staging_partitions() -> None:
    # Many one-partition topics must not all pile onto staging partition 0.
    firsts = {envelope.staging_partition(t, 0, 12) for t in _topic_names(300)}
    assert len(firsts) == 12
