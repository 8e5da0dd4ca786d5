"""Stand-ins for confluent-kafka objects, for the pure-logic unit tests."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from ferryman.v1 import envelope_pb2

if TYPE_CHECKING:
    from confluent_kafka import Message

Headers = list[tuple[str, bytes | None]]

#: confluent-kafka's Message.timestamp() type codes.
TS_NOT_AVAILABLE, TS_CREATE_TIME, TS_LOG_APPEND_TIME = 0, 1, 2


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


def as_messages(msgs: Sequence[FakeMessage]) -> Sequence[Message]:
    """The fakes, typed as what build_envelopes accepts."""
    return cast("Sequence[Message]", msgs)


@dataclass(frozen=True)
class Seen:
    """Everything a destination record must reproduce of its source record."""

    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers = field(default_factory=list)
    timestamp_ms: int = 0
    timestamp_type: int = 0

    @classmethod
    def of_message(cls, msg: FakeMessage) -> Seen:
        ts_type = {
            TS_NOT_AVAILABLE: envelope_pb2.TIMESTAMP_TYPE_NOT_AVAILABLE,
            TS_CREATE_TIME: envelope_pb2.TIMESTAMP_TYPE_CREATE_TIME,
            TS_LOG_APPEND_TIME: envelope_pb2.TIMESTAMP_TYPE_LOG_APPEND_TIME,
        }[msg.timestamp_type]
        return cls(msg.offset_, msg.key_, msg.value_, list(msg.headers_ or []), msg.timestamp_ms, ts_type)

    @classmethod
    def of_record(cls, rec: envelope_pb2.Record) -> Seen:
        return cls(
            rec.offset,
            rec.key if rec.HasField("key") else None,
            rec.value if rec.HasField("value") else None,
            [(h.key, h.value if h.HasField("value") else None) for h in rec.headers],
            rec.timestamp_ms,
            rec.timestamp_type,
        )


def _maybe_bytes(rng: random.Random, max_len: int) -> bytes | None:
    r = rng.random()
    if r < 0.1:
        return None
    if r < 0.2:
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


def random_messages(rng: random.Random, offsets: Sequence[int], *, max_len: int = 40) -> list[FakeMessage]:
    """Source records at offsets with random keys, values, headers and timestamps."""
    msgs = []
    for o in offsets:
        headers: Headers | None = None
        if rng.random() < 0.3:
            headers = [(rng.choice(["a", "b", "trace", ""]), _maybe_bytes(rng, 8)) for _ in range(rng.randint(0, 4))]
        msgs.append(
            FakeMessage(
                o,
                _maybe_bytes(rng, max_len),
                _maybe_bytes(rng, max_len),
                headers,
                rng.randint(-1, 2**41),
                rng.choice([TS_NOT_AVAILABLE, TS_CREATE_TIME, TS_LOG_APPEND_TIME]),
            )
        )
    return msgs
