"""Envelope codec: byte-faithful round trips, checksum, malformed input, staging partition map."""

from __future__ import annotations

import pytest
from ferryman import envelope
from ferryman.errors import CorruptEnvelopeError, EnvelopeError
from ferryman.v1 import envelope_pb2
from ferryman_wrapper._envelopes import build_envelopes

SRC = envelope_pb2.SourcePartition(cluster_id="c1", topic="orders", topic_id=b"\x07" * 16, partition=3)


class FakeMessage:
    def __init__(
        self,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes | None]] | None = None,
        ts: int = 1_700_000_000_000,
        ts_type: int = 1,
    ) -> None:
        self._o, self._k, self._v, self._h, self._ts, self._tt = offset, key, value, headers, ts, ts_type

    def offset(self) -> int:
        return self._o

    def key(self) -> bytes | None:
        return self._k

    def value(self) -> bytes | None:
        return self._v

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        return self._h

    def timestamp(self) -> tuple[int, int]:
        return self._tt, self._ts


def _build(msgs: list[FakeMessage], prev: int = -1, **kw: int) -> list[envelope.DecodedEnvelope]:
    built = build_envelopes(
        msgs,  # type: ignore[arg-type]
        SRC,
        prev,
        wrapper_id="w",
        wrapper_epoch=1,
        max_records=kw.get("max_records", 1000),
        max_bytes=kw.get("max_bytes", 512 * 1024),
    )
    return [envelope.decode(b.value) for b in built]


def test_round_trip_keeps_nulls_empties_headers_and_timestamps() -> None:
    msgs = [
        FakeMessage(0, None, b"v0"),
        FakeMessage(1, b"k1", None),  # tombstone
        FakeMessage(2, b"", b""),  # empty, not null
        FakeMessage(5, b"k5", b"v5", [("h", b"1"), ("h", b"2"), ("n", None), ("e", b"")], ts=42, ts_type=2),
    ]
    (env,) = _build(msgs)
    assert env.previous_offset == -1
    assert env.source == SRC
    got = [
        (
            r.offset,
            r.key if r.HasField("key") else None,
            r.value if r.HasField("value") else None,
            envelope.headers_of(r),
            r.timestamp_ms,
            r.timestamp_type,
        )
        for r in env.records
    ]
    assert got == [
        (0, None, b"v0", [], 1_700_000_000_000, envelope_pb2.TIMESTAMP_TYPE_CREATE_TIME),
        (1, b"k1", None, [], 1_700_000_000_000, envelope_pb2.TIMESTAMP_TYPE_CREATE_TIME),
        (2, b"", b"", [], 1_700_000_000_000, envelope_pb2.TIMESTAMP_TYPE_CREATE_TIME),
        (
            5,
            b"k5",
            b"v5",
            [("h", b"1"), ("h", b"2"), ("n", None), ("e", b"")],
            42,
            envelope_pb2.TIMESTAMP_TYPE_LOG_APPEND_TIME,
        ),
    ]


def test_chunking_links_the_chain_and_keeps_big_records_alone() -> None:
    msgs = [FakeMessage(i * 2, b"k", b"x" * 10) for i in range(10)]
    msgs.append(FakeMessage(20, b"k", b"y" * 5000))
    envs = _build(msgs, prev=-1, max_records=4, max_bytes=2000)
    assert [len(e.records) for e in envs] == [4, 4, 2, 1]
    prevs = [e.previous_offset for e in envs]
    lasts = [e.last_offset for e in envs]
    assert prevs == [-1, *lasts[:-1]]
    assert [r.offset for e in envs for r in e.records] == [m.offset() for m in msgs]


def test_checksum_mismatch_is_detected() -> None:
    batch = envelope_pb2.RecordBatch(records=[envelope_pb2.Record(offset=1, value=b"abc")])
    data = envelope.encode(SRC, 0, batch, wrapper_id="w", wrapper_epoch=1)
    env = envelope_pb2.Envelope.FromString(data)
    env.records = env.records.replace(b"abc", b"abd")
    with pytest.raises(CorruptEnvelopeError):
        envelope.decode(env.SerializeToString())


@pytest.mark.parametrize("data", [None, b"", b"\xff\xff\xff garbage"])
def test_malformed_staging_records_are_rejected(data: bytes | None) -> None:
    with pytest.raises(EnvelopeError):
        envelope.decode(data)


def test_envelope_without_records_is_rejected() -> None:
    with pytest.raises(ValueError, match="at least one record"):
        envelope.encode(SRC, 0, envelope_pb2.RecordBatch(), wrapper_id="w", wrapper_epoch=1)
    empty = envelope_pb2.Envelope(source=SRC, records=b"", records_crc32=0)
    with pytest.raises(EnvelopeError):
        envelope.decode(empty.SerializeToString())


def test_staging_partition_is_deterministic_in_range_and_spreads_a_topic() -> None:
    for n in (1, 6, 12, 50):
        for topic in ("a", "orders", "x" * 200):
            parts = [envelope.staging_partition(topic, p, n) for p in range(n)]
            assert all(0 <= sp < n for sp in parts)
            assert parts == [envelope.staging_partition(topic, p, n) for p in range(n)]
            assert len(set(parts)) == n  # consecutive partitions of one topic never collide
    # Known value: must never change across versions (the map is part of the contract).
    assert envelope.staging_partition("orders", 0, 12) == envelope.staging_partition("orders", 12, 12)
