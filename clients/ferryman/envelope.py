"""The envelope codec: source records to staging-record bytes and back.

An envelope carries a run of consecutive records of one source partition (see
``proto/ferryman/v1/envelope.proto`` for the chain contract). Packing a run
into one staging record is what keeps the second hop cheap: the wrapper
produces, and the deduper consumes, one Kafka record per run instead of one
per source record, while every source record keeps its own coordinates.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from ferryman.errors import CorruptEnvelopeError, EnvelopeError
from ferryman.v1 import envelope_pb2

Record = envelope_pb2.Record
SourcePartition = envelope_pb2.SourcePartition

#: confluent-kafka's Message.timestamp() type codes mapped to the proto enum.
TIMESTAMP_TYPES = {
    0: envelope_pb2.TIMESTAMP_TYPE_NOT_AVAILABLE,
    1: envelope_pb2.TIMESTAMP_TYPE_CREATE_TIME,
    2: envelope_pb2.TIMESTAMP_TYPE_LOG_APPEND_TIME,
}

#: Bytes an envelope adds around its records, generously: source coordinates
#: (topic name up to 249 bytes, cluster id, topic id), wrapper id, trace
#: context and protobuf tags. Staging limits are sized with this headroom.
ENVELOPE_OVERHEAD_BYTES = 4096


def record_size(key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes | None]] | None) -> int:
    """Approximate encoded size of one record, for envelope size budgeting."""
    size = 32 + (len(key) if key else 0) + (len(value) if value else 0)
    if headers:
        size += sum(8 + len(k) + (len(v) if v else 0) for k, v in headers)
    return size


@dataclass(frozen=True)
class DecodedEnvelope:
    """A decoded and checksum-verified envelope."""

    source: envelope_pb2.SourcePartition
    previous_offset: int
    records: Sequence[envelope_pb2.Record]
    wrapper_id: str
    wrapper_epoch: int
    wrapped_at_ms: int
    trace_context: dict[str, str]

    @property
    def first_offset(self) -> int:
        """Offset of the first record."""
        return self.records[0].offset

    @property
    def last_offset(self) -> int:
        """Offset of the last record."""
        return self.records[-1].offset


def encode(
    source: envelope_pb2.SourcePartition,
    previous_offset: int,
    batch: envelope_pb2.RecordBatch,
    *,
    wrapper_id: str,
    wrapper_epoch: int,
    trace_context: dict[str, str] | None = None,
) -> bytes:
    """Serialize a batch of records of one source partition into an envelope.

    Args:
        source: coordinates of the source partition.
        previous_offset: offset of the record delivered before this batch, or -1.
        batch: the records, in offset order (at least one).
        wrapper_id: identity of the writing wrapper.
        wrapper_epoch: the wrapper's epoch for this partition.
        trace_context: W3C trace context to carry, if any.
    """
    if not batch.records:
        raise ValueError("an envelope needs at least one record")
    payload = batch.SerializeToString()
    env = envelope_pb2.Envelope(
        source=source,
        previous_offset=previous_offset,
        records=payload,
        records_crc32=zlib.crc32(payload),
        record_count=len(batch.records),
        wrapper_id=wrapper_id,
        wrapper_epoch=wrapper_epoch,
        wrapped_at_ms=int(time.time() * 1000),
    )
    if trace_context:
        env.trace_context.update(trace_context)
    return env.SerializeToString()


def decode(data: bytes | None) -> DecodedEnvelope:
    """Parse and verify one staging record value.

    Raises:
        EnvelopeError: the bytes are not an envelope, or hold no records.
        CorruptEnvelopeError: the checksum does not match.
    """
    if not data:
        raise EnvelopeError("empty staging record")
    env = envelope_pb2.Envelope()
    try:
        env.ParseFromString(data)
    except DecodeError as exc:
        raise EnvelopeError(f"staging record is not an envelope: {exc}") from exc
    return verify(env)


def verify(env: envelope_pb2.Envelope) -> DecodedEnvelope:
    """Verify the checksum of a parsed envelope and parse its records.

    Raises:
        EnvelopeError: the envelope holds no records or they do not parse.
        CorruptEnvelopeError: the checksum does not match.
    """
    if zlib.crc32(env.records) != env.records_crc32:
        raise CorruptEnvelopeError(
            f"checksum mismatch in envelope for {env.source.topic}-{env.source.partition} "
            f"after offset {env.previous_offset}"
        )
    batch = envelope_pb2.RecordBatch()
    try:
        batch.ParseFromString(env.records)
    except DecodeError as exc:
        raise EnvelopeError(f"envelope records do not parse: {exc}") from exc
    if not batch.records or not env.source.topic:
        raise EnvelopeError("envelope without records or source topic")
    return DecodedEnvelope(
        source=env.source,
        previous_offset=env.previous_offset,
        records=batch.records,
        wrapper_id=env.wrapper_id,
        wrapper_epoch=env.wrapper_epoch,
        wrapped_at_ms=env.wrapped_at_ms,
        trace_context=dict(env.trace_context),
    )


def headers_of(record: envelope_pb2.Record) -> list[tuple[str, bytes | None]]:
    """Headers of a decoded record in confluent-kafka's form, nulls kept."""
    return [(h.key, h.value if h.HasField("value") else None) for h in record.headers]


def add_headers(record: envelope_pb2.Record, headers: Iterable[tuple[str, bytes | None]]) -> None:
    """Append confluent-kafka-style headers to a record being built."""
    for key, value in headers:
        h = record.headers.add(key=key)
        if value is not None:
            h.value = value


def staging_partition(topic: str, partition: int, staging_partitions: int) -> int:
    """The staging partition that carries every envelope of one source partition.

    Deterministic across processes and versions (CRC-32 of the topic name, not
    Python's salted hash), and consecutive partitions of one topic land on
    consecutive staging partitions so a topic spreads over the deduper group.
    """
    return (zlib.crc32(topic.encode()) + partition) % staging_partitions
