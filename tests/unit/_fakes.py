"""Shared helpers of the pure-logic unit tests: source records, what must survive of them, random inputs."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ferryman.envelope import Headers, RecordRun
from ferryman.v1 import envelope_pb2

if TYPE_CHECKING:
    from confluent_kafka import Message

#: confluent-kafka's Message.timestamp() type codes.
TS_NOT_AVAILABLE, TS_CREATE_TIME, TS_LOG_APPEND_TIME = 0, 1, 2
ALL_TS_TYPES = (TS_NOT_AVAILABLE, TS_CREATE_TIME, TS_LOG_APPEND_TIME)


@dataclass(frozen=True)
class FakeMessage:
    """A consumed source record with confluent-kafka's Message accessors."""

    offset_: int
    key_: bytes | None = b"k"
    value_: bytes | None = b"v"
    headers_: Headers | None = None
    timestamp_ms: int = 1_700_000_000_000
    timestamp_type: int = TS_CREATE_TIME

    def offset(self) -> int:
        return self.offset_

    def key(self) -> bytes | None:
        return self.key_

    def value(self) -> bytes | None:
        return self.value_

    def headers(self) -> Headers | None:
        return self.headers_

    def timestamp(self) -> tuple[int, int]:
        return self.timestamp_type, self.timestamp_ms


def as_messages(msgs: Sequence[FakeMessage], *, topic: str = "orders", partition: int = 3) -> list[Message]:
    """Real confluent-kafka Message objects with the fakes' contents (the wrapper reads them with C accessors)."""
    from confluent_kafka import Message as KafkaMessage  # noqa: PLC0415 (tests that only need fakes skip the import)

    return [
        KafkaMessage(
            topic=topic,
            partition=partition,
            offset=m.offset_,
            key=m.key_,
            value=m.value_,
            # A fresh list, typed as the wider element type Message accepts (list is invariant).
            headers=None if m.headers_ is None else list(m.headers_),
            timestamp=(m.timestamp_type, m.timestamp_ms),
        )
        for m in msgs
    ]


@dataclass(frozen=True)
class Seen:
    """Everything a destination record must reproduce of its source record."""

    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers = field(default_factory=list)
    timestamp_ms: int = 0
    timestamp_type: int = 0
    """A ``TimestampType`` value."""

    @classmethod
    def of_message(cls, msg: FakeMessage) -> Seen:
        ts_type = {
            TS_NOT_AVAILABLE: envelope_pb2.TIMESTAMP_TYPE_NOT_AVAILABLE,
            TS_CREATE_TIME: envelope_pb2.TIMESTAMP_TYPE_CREATE_TIME,
            TS_LOG_APPEND_TIME: envelope_pb2.TIMESTAMP_TYPE_LOG_APPEND_TIME,
        }[msg.timestamp_type]
        return cls(msg.offset_, msg.key_, msg.value_, list(msg.headers_ or []), msg.timestamp_ms, ts_type)

    @classmethod
    def of_run(cls, run: RecordRun) -> list[Seen]:
        """What a decoded run says of each of its records."""
        headers = run.header_column() or [None] * len(run)
        return [
            cls(o, k, v, list(h or []), ts, run.timestamp_type(i))
            for i, (o, k, v, h, ts) in enumerate(
                zip(run.offsets, run.keys, run.values, headers, run.timestamps_ms, strict=True)
            )
        ]


def run_of_seen(records: Sequence[Seen]) -> RecordRun:
    """The run holding records, one timestamp type per record (the inverse of Seen.of_run)."""
    return RecordRun(
        offsets=[r.offset for r in records],
        timestamps_ms=[r.timestamp_ms for r in records],
        timestamp_types=[r.timestamp_type for r in records],
        keys=[r.key for r in records],
        values=[r.value for r in records],
        headers=[(i, list(r.headers)) for i, r in enumerate(records) if r.headers],
    )


def wire_batch(envelope_bytes: bytes) -> envelope_pb2.RecordBatch:
    """The RecordBatch an envelope carries, as written (no checks)."""
    return envelope_pb2.RecordBatch.FromString(envelope_pb2.Envelope.FromString(envelope_bytes).records)


def _maybe_bytes(rng: random.Random, max_len: int, null_rate: float, empty_rate: float) -> bytes | None:
    r = rng.random()
    if r < null_rate:
        return None
    if r < null_rate + empty_rate:
        return b""
    return rng.randbytes(rng.randint(1, max_len))


def sparse_offsets(rng: random.Random, n: int, *, start: int = 0) -> list[int]:
    """Offsets of n readable records: mostly consecutive, with the holes a
    read_committed consumer sees (commit/abort markers, aborted records,
    compacted-away records)."""
    out: list[int] = []
    o = start - 1
    for _ in range(n):
        r = rng.random()
        if r < 0.75:
            o += 1
        elif r < 0.9:
            o += 2  # a transaction marker
        else:
            o += rng.randint(3, 50)  # an aborted transaction or compaction
        out.append(o)
    return out


def random_messages(
    rng: random.Random,
    offsets: Sequence[int],
    *,
    max_len: int = 40,
    null_rate: float = 0.1,
    empty_rate: float = 0.1,
    header_rate: float = 0.3,
    timestamp_types: Sequence[int] = ALL_TS_TYPES,
) -> list[FakeMessage]:
    """Source records at offsets with random keys, values, headers and timestamps.

    Args:
        rng: the source of randomness.
        offsets: one record per offset.
        max_len: longest key or value (header values are at most 8 bytes).
        null_rate: share of null keys, values and header values.
        empty_rate: share of empty (not null) keys, values and header values.
        header_rate: share of records with a headers list (possibly empty).
        timestamp_types: confluent-kafka type codes to draw from.
    """
    msgs = []
    for o in offsets:
        headers: Headers | None = None
        if rng.random() < header_rate:
            headers = [
                (rng.choice(["a", "b", "trace", ""]), _maybe_bytes(rng, 8, null_rate, empty_rate))
                for _ in range(rng.randint(0, 4))
            ]
        msgs.append(
            FakeMessage(
                o,
                _maybe_bytes(rng, max_len, null_rate, empty_rate),
                _maybe_bytes(rng, max_len, null_rate, empty_rate),
                headers,
                rng.randint(-1, 2**41),
                rng.choice(timestamp_types),
            )
        )
    return msgs
