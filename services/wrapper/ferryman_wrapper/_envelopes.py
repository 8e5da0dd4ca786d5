"""Turns consumed source records into envelopes, keeping the offset chain."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import cast

from confluent_kafka import Message
from ferryman import envelope
from ferryman.v1 import envelope_pb2


@dataclass(frozen=True)
class BuiltEnvelope:
    """One envelope ready to produce."""

    value: bytes
    last_offset: int
    record_count: int


def build_envelopes(
    messages: Sequence[Message],
    source: envelope_pb2.SourcePartition,
    previous_offset: int,
    *,
    wrapper_id: str,
    wrapper_epoch: int,
    max_records: int,
    max_bytes: int,
) -> Iterator[BuiltEnvelope]:
    """Pack consecutive messages of one source partition into envelopes.

    Each envelope's previous_offset is the last offset of the envelope before
    it (the first uses previous_offset), which is what the chain contract needs:
    the consumer returned every committed record between them.
    """
    prev = previous_offset
    batch = envelope_pb2.RecordBatch()
    add = batch.records.add
    count = size = 0
    last = -1
    ts_types = envelope.TIMESTAMP_TYPES
    # The hot loop (one pass per source record): locals only, no per-record
    # function calls beyond the message accessors and the protobuf add().
    for msg in messages:
        key = msg.key()
        value = msg.value()
        # Consumed messages always carry headers as a list of (str, bytes | None).
        headers = cast("list[tuple[str, bytes | None]] | None", msg.headers())
        rec_size = 32 + (len(key) if key else 0) + (len(value) if value else 0)  # record_size(), inlined
        if headers:
            rec_size += envelope.record_size(None, None, headers)
        if count and (count >= max_records or size + rec_size > max_bytes):
            yield BuiltEnvelope(
                envelope.encode(source, prev, batch, wrapper_id=wrapper_id, wrapper_epoch=wrapper_epoch), last, count
            )
            prev = last
            batch = envelope_pb2.RecordBatch()
            add = batch.records.add
            count = size = 0
        ts_type, ts = msg.timestamp()
        last = cast(int, msg.offset())
        rec = add(offset=last, timestamp_ms=ts, timestamp_type=ts_types.get(ts_type, 0))
        if key is not None:
            rec.key = key
        if value is not None:
            rec.value = value
        if headers:
            envelope.add_headers(rec, headers)
        size += rec_size
        count += 1
    if count:
        yield BuiltEnvelope(
            envelope.encode(source, prev, batch, wrapper_id=wrapper_id, wrapper_epoch=wrapper_epoch), last, count
        )
