"""The envelope codec: source records to staging-record bytes and back.

An envelope carries a run of consecutive records of one source partition (see
``proto/ferryman/v1/envelope.proto`` for the chain contract). Packing a run
into one staging record is what keeps the second hop cheap: the wrapper
produces, and the deduper consumes, one Kafka record per run instead of one
per source record, while every source record keeps its own coordinates.
"""

from __future__ import annotations

import itertools
import operator
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import google_crc32c
from google.protobuf.message import DecodeError

from ferryman._protowire import len_field, varint
from ferryman.errors import CorruptEnvelopeError, EnvelopeError, UnsupportedEnvelopeError
from ferryman.v1 import envelope_pb2

#: The compiled fast path (_batchcodec.pyx), or None when it was not built (no C
#: compiler at install): either way the results are the same, only the cost per
#: record differs.
try:
    from ferryman import _batchcodec
except ImportError:
    _batchcodec = None  # type: ignore[assignment]
batchcodec = _batchcodec  # the public name (tests swap it for None to run the pure-Python path)

#: Which codec this process runs, for the services' start-up log.
CODEC = (
    "pure Python (the compiled fast path was not built)"
    if batchcodec is None
    else "compiled"
    if batchcodec.DIRECT_MESSAGE_READS
    else "compiled, through Message accessors (this confluent-kafka's Message layout is not the one checked)"
)

#: CRC-32C of the records, hardware-accelerated (~20 GB/s here against zlib.crc32's
#: ~3), or None where google-crc32c has only its pure-Python fallback (too slow for a
#: data path): wrappers then write the legacy CRC-32 instead (see wrap_payload).
crc32c: Callable[[bytes], int] | None = google_crc32c.value if google_crc32c.implementation == "c" else None

#: Which checksum this process writes, for the services' start-up log.
CHECKSUM = (
    "CRC-32C"
    if crc32c is not None
    else "CRC-32 (google-crc32c has no C extension here: CRC-32C envelopes verify slowly)"
)

#: The newest envelope layout this reader knows (``Envelope.schema_version``; 0, absent, means 1).
SCHEMA_VERSION = 1

Record = envelope_pb2.Record
SourcePartition = envelope_pb2.SourcePartition

#: confluent-kafka's Message.timestamp() type codes mapped to the proto enum.
TIMESTAMP_TYPES = {
    0: envelope_pb2.TIMESTAMP_TYPE_NOT_AVAILABLE,
    1: envelope_pb2.TIMESTAMP_TYPE_CREATE_TIME,
    2: envelope_pb2.TIMESTAMP_TYPE_LOG_APPEND_TIME,
}
#: The proto enum value is confluent-kafka's code plus this (see TIMESTAMP_TYPES).
TIMESTAMP_TYPE_SHIFT = 1

#: Bytes an envelope adds around its records, generously: source coordinates
#: (topic name up to 249 bytes, cluster id, topic id), wrapper id, trace
#: context and protobuf tags. Staging limits are sized with this headroom.
ENVELOPE_OVERHEAD_BYTES = 4096


Headers = list[tuple[str, bytes | None]]


#: Fixed share of record_size for every record (offset, timestamp, field tags).
RECORD_OVERHEAD_BYTES = 32
#: Fixed share of headers_size for every header (tags, lengths).
HEADER_OVERHEAD_BYTES = 8


def headers_size(headers: Sequence[tuple[str, bytes | None]]) -> int:
    """Approximate encoded size of one record's headers (part of record_size)."""
    return sum(HEADER_OVERHEAD_BYTES + len(k) + (len(v) if v else 0) for k, v in headers)


def record_size(key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes | None]] | None) -> int:
    """Approximate encoded size of one record, for envelope size budgeting."""
    size = RECORD_OVERHEAD_BYTES + (len(key) if key else 0) + (len(value) if value else 0)
    if headers:
        size += headers_size(headers)
    return size


@dataclass(frozen=True, slots=True)
class RecordRun:
    """A run of consecutive records of one source partition, column by column.

    The codec's in-memory form on both sides: the wrapper fills the columns
    straight from consumed messages, the deduper zips them into ``produce()``
    calls. Every column has one entry per record, except ``timestamp_types``
    (one entry when every record has the same type) and ``headers`` (sparse).
    """

    offsets: Sequence[int]
    """Source offsets, strictly increasing (a ``range`` when they are consecutive)."""
    timestamps_ms: Sequence[int]
    """Record timestamps, milliseconds since the epoch."""
    timestamp_types: Sequence[int]
    """``TimestampType`` values: one per record, or one for all."""
    keys: Sequence[bytes | None]
    """Keys, None for a null key."""
    values: Sequence[bytes | None]
    """Values, None for a null value (tombstone)."""
    headers: Sequence[tuple[int, Headers]] = ()
    """(record index, headers) of the records that have headers, by index."""

    def __len__(self) -> int:
        return len(self.offsets)

    def timestamp_type(self, i: int) -> int:
        """Timestamp type of record i."""
        types = self.timestamp_types
        return types[0] if len(types) == 1 else types[i]

    def header_column(self) -> list[Headers | None] | None:
        """Headers as one entry per record (None: no headers), or None when no record has any."""
        if not self.headers:
            return None
        column: list[Headers | None] = [None] * len(self.offsets)
        for i, h in self.headers:
            column[i] = h
        return column


@dataclass(frozen=True)
class DecodedEnvelope:
    """A decoded and checksum-verified envelope."""

    source: envelope_pb2.SourcePartition
    previous_offset: int
    run: RecordRun
    wrapper_id: str
    wrapper_epoch: int
    wrapped_at_ms: int
    trace_context: dict[str, str]
    record_traces: dict[int, tuple[str, str]] = field(default_factory=dict)
    """Traced records: source offset -> (traceparent, tracestate) of the wrapper's span for it."""

    @property
    def first_offset(self) -> int:
        """Offset of the first record."""
        return self.run.offsets[0]

    @property
    def last_offset(self) -> int:
        """Offset of the last record."""
        return self.run.offsets[-1]


def _with_nulls(column: Sequence[bytes], nulls: Sequence[int], n: int) -> list[bytes | None]:
    """One entry per record from a columnar keys/values field (see RecordBatch)."""
    if not column:
        return [None] * n
    out: list[bytes | None] = list(column)
    for i in nulls:
        out[i] = None
    return out


def _null_split(column: Sequence[bytes | None]) -> tuple[Sequence[bytes | None], list[int] | None]:
    """A keys/values column as written: (entries, null indexes), or ([], None) when all are null."""
    if all(column):  # the common case, checked in C: no null and no empty entry
        return column, None
    null_count = column.count(None)  # in C too: topics without keys are common
    if not null_count:
        return column, None
    if null_count == len(column):
        return [], None
    return [b"" if b is None else b for b in column], [i for i, b in enumerate(column) if b is None]


def consecutive(offsets: Sequence[int]) -> bool:
    """Whether strictly increasing offsets have no hole (the two ends tell, in O(1))."""
    return offsets[-1] - offsets[0] == len(offsets) - 1


def batch_of(run: RecordRun) -> envelope_pb2.RecordBatch:
    """The columnar RecordBatch of a run (offsets as base_offset alone when they have no hole)."""
    keys, null_keys = _null_split(run.keys)
    values, null_values = _null_split(run.values)
    offsets = run.offsets
    no_hole = consecutive(offsets)
    batch = envelope_pb2.RecordBatch(
        base_offset=offsets[0] if no_hole else 0,
        offsets=() if no_hole else offsets,
        timestamps_ms=run.timestamps_ms,
        timestamp_types=run.timestamp_types,  # type: ignore[arg-type]  # ints are the enum's values
        keys=keys,  # type: ignore[arg-type]  # no None left: _null_split replaced them
        values=values,  # type: ignore[arg-type]
    )
    if null_keys:
        batch.null_keys.extend(null_keys)
    if null_values:
        batch.null_values.extend(null_values)
    for index, headers in run.headers:
        add_headers(batch.headers.add(index=index), headers)
    return batch


class _DecodedColumns(NamedTuple):
    """A columnar RecordBatch as the compiled codec reads it (fields in decode_columns' order)."""

    base_offset: int
    offsets: list[int]
    timestamps_ms: list[int]
    timestamp_types: list[int]
    keys: list[bytes]
    null_keys: list[int]
    values: list[bytes]
    null_values: list[int]
    headers: list[tuple[int, Headers]]


def run_of(batch: envelope_pb2.RecordBatch) -> RecordRun:
    """The run a RecordBatch holds, in either form (columnar, or rows from 0.1 wrappers).

    Raises:
        EnvelopeError: the batch is empty or its columns are inconsistent.
    """
    if batch.records:
        if batch.offsets or batch.base_offset or batch.timestamps_ms or batch.keys or batch.values or batch.headers:
            raise EnvelopeError("record batch holds both the row and the columnar form")
        return _run_of_rows(batch.records)
    return _run_of_columns(batch)


def run_of_payload(payload: bytes) -> RecordRun:
    """The run a serialized RecordBatch holds (an envelope's records field).

    The compiled codec reads the canonical columnar form; anything else (the
    row form, other encodings of the same fields, malformed bytes) goes to the
    protobuf library. Both paths check the columns the same way (_run_of_columns).

    Raises:
        EnvelopeError: the bytes do not parse, or the batch is empty or inconsistent.
    """
    columns = batchcodec.decode_columns(payload) if batchcodec is not None else None
    if columns is not None and columns[2]:  # timestamps present: columnar, not an empty batch
        return _run_of_columns(_DecodedColumns(*columns))
    batch = envelope_pb2.RecordBatch()
    try:
        batch.ParseFromString(payload)
    except DecodeError as exc:
        raise EnvelopeError(f"envelope records do not parse: {exc}") from exc
    if not batch.records and not batch.timestamps_ms:
        raise EnvelopeError("envelope without records")
    return run_of(batch)


def _run_of_columns(batch: envelope_pb2.RecordBatch | _DecodedColumns) -> RecordRun:
    offsets: Sequence[int]
    if batch.offsets:
        offsets = list(batch.offsets)
        n = len(offsets)
        if batch.base_offset:
            raise EnvelopeError("columnar batch gives both offsets and a base offset")
        if n > 1 and not all(map(operator.lt, offsets, itertools.islice(offsets, 1, None))):
            raise EnvelopeError("columnar batch offsets are not strictly increasing")
    else:
        n = len(batch.timestamps_ms)
        if batch.base_offset < 0:
            raise EnvelopeError(f"columnar batch base offset {batch.base_offset} is negative")
        offsets = range(batch.base_offset, batch.base_offset + n)
    types = list(batch.timestamp_types)
    if (
        not n
        or len(batch.timestamps_ms) != n
        or len(types) not in (1, n)
        or len(batch.keys) not in (0, n)
        or len(batch.values) not in (0, n)
    ):
        raise EnvelopeError(
            f"inconsistent columnar batch: {n} offsets, {len(batch.timestamps_ms)} timestamps, "
            f"{len(types)} timestamp types, {len(batch.keys)} keys, {len(batch.values)} values"
        )
    if any(not 0 <= i < n for i in itertools.chain(batch.null_keys, batch.null_values)):
        raise EnvelopeError("columnar batch null index out of range")
    listed = (
        batch.headers if isinstance(batch, _DecodedColumns) else [(rh.index, headers_of(rh)) for rh in batch.headers]
    )
    headers: list[tuple[int, Headers]] = []
    for index, hs in listed:
        if not 0 <= index < n or (headers and index <= headers[-1][0]):
            raise EnvelopeError(f"columnar batch header index {index} out of order or range")
        headers.append((index, hs))
    return RecordRun(
        offsets=offsets,
        timestamps_ms=list(batch.timestamps_ms),
        timestamp_types=types,
        keys=_with_nulls(batch.keys, batch.null_keys, n),
        values=_with_nulls(batch.values, batch.null_values, n),
        headers=headers,
    )


def _run_of_rows(records: Sequence[envelope_pb2.Record]) -> RecordRun:
    offsets = [r.offset for r in records]
    if not all(map(operator.lt, offsets, itertools.islice(offsets, 1, None))):
        raise EnvelopeError("record batch offsets are not strictly increasing")
    return RecordRun(
        offsets=offsets,
        timestamps_ms=[r.timestamp_ms for r in records],
        timestamp_types=[r.timestamp_type for r in records],
        keys=[r.key if r.HasField("key") else None for r in records],
        values=[r.value if r.HasField("value") else None for r in records],
        headers=[(i, headers_of(r)) for i, r in enumerate(records) if r.headers],
    )


def encode(
    source: envelope_pb2.SourcePartition,
    previous_offset: int,
    run: RecordRun,
    *,
    wrapper_id: str,
    wrapper_epoch: int,
    trace_context: dict[str, str] | None = None,
) -> bytes:
    """Serialize a run of records of one source partition into an envelope (columnar form).

    Args:
        source: coordinates of the source partition.
        previous_offset: offset of the record delivered before this run, or -1.
        run: the records, in offset order (at least one).
        wrapper_id: identity of the writing wrapper.
        wrapper_epoch: the wrapper's epoch for this partition.
        trace_context: W3C trace context to carry, if any.
    """
    if not len(run):
        raise ValueError("an envelope needs at least one record")
    return wrap_payload(
        source,
        previous_offset,
        payload_of(run),
        len(run),
        wrapper_id=wrapper_id,
        wrapper_epoch=wrapper_epoch,
        trace_context=trace_context,
    )


def payload_of(run: RecordRun) -> bytes:
    """The serialized columnar RecordBatch of a run: what an envelope's records field holds."""
    return batch_of(run).SerializeToString()


def encode_batch(
    source: envelope_pb2.SourcePartition,
    previous_offset: int,
    batch: envelope_pb2.RecordBatch,
    *,
    wrapper_id: str,
    wrapper_epoch: int,
    trace_context: dict[str, str] | None = None,
) -> bytes:
    """Serialize an envelope around a RecordBatch in either form (see encode)."""
    count = len(batch.records) or len(batch.timestamps_ms)
    if not count:
        raise ValueError("an envelope needs at least one record")
    return wrap_payload(
        source,
        previous_offset,
        batch.SerializeToString(),
        count,
        wrapper_id=wrapper_id,
        wrapper_epoch=wrapper_epoch,
        trace_context=trace_context,
    )


#: Envelope.records (3, length-delimited) and Envelope.records_crc32c (10, fixed32): their wire tags.
_RECORDS_TAG = b"\x1a"
_CRC32C_TAG = b"\x55"


def wrap_payload(
    source: envelope_pb2.SourcePartition,
    previous_offset: int,
    payload: bytes,
    record_count: int,
    *,
    wrapper_id: str,
    wrapper_epoch: int,
    trace_context: dict[str, str] | None = None,
    record_traces: bytes = b"",
) -> bytes:
    """Serialize an envelope around an already serialized RecordBatch of record_count records.

    The checksum is CRC-32C where it is hardware-accelerated, else the legacy CRC-32
    (both verify in ``verify``); it is the one per-byte pass either service makes over
    the records besides copying them. record_traces: bytes of ``record_traces_suffix``.

    The small fields go through the protobuf library and the records are joined to
    them as wire bytes, in one copy: set into an Envelope and serialized, a 512 KB
    payload cost ~300 us (upb's encoder; ~6 us per 10 KB record), joined ~30.
    Parsers see an ordinary envelope (field order is free in protobuf).
    """
    env = envelope_pb2.Envelope(
        source=source,
        previous_offset=previous_offset,
        record_count=record_count,
        wrapper_id=wrapper_id,
        wrapper_epoch=wrapper_epoch,
        wrapped_at_ms=int(time.time() * 1000),
    )
    if crc32c is not None:
        check = _CRC32C_TAG + crc32c(payload).to_bytes(4, "little")
    else:
        env.records_crc32 = zlib.crc32(payload)
        check = b""
    if trace_context:
        env.trace_context.update(trace_context)
    return b"".join((env.SerializeToString(), _RECORDS_TAG, varint(len(payload)), payload, check, record_traces))


def decode(data: bytes | None) -> DecodedEnvelope:
    """Parse and verify one staging record value.

    Raises:
        EnvelopeError: the bytes are not an envelope, or hold no records.
        CorruptEnvelopeError: the checksum does not match.
        UnsupportedEnvelopeError: the envelope's schema version is unknown here.
    """
    if not data:
        raise EnvelopeError("empty staging record")
    env = envelope_pb2.Envelope()
    try:
        env.ParseFromString(data)
    except DecodeError as exc:
        raise EnvelopeError(f"staging record is not an envelope: {exc}") from exc
    # Record traces read from the bytes in C where built (the parsed ones cost a Python object per field).
    traces = batchcodec.record_traces(data) if env.record_traces and batchcodec is not None else None
    return verify(env, record_traces=traces)


def _checksum_matches(env: envelope_pb2.Envelope, records: bytes) -> bool:
    """The records (env.records) match the envelope's CRC-32C, or its legacy CRC-32 when it has none."""
    if env.HasField("records_crc32c"):
        compute: Callable[[bytes], int] = crc32c or google_crc32c.value
        return compute(records) == env.records_crc32c
    return zlib.crc32(records) == env.records_crc32


def verify(env: envelope_pb2.Envelope, *, record_traces: dict[int, tuple[str, str]] | None = None) -> DecodedEnvelope:
    """Verify the checksum of a parsed envelope and parse its records.

    record_traces: the envelope's record traces when the caller has read them already (``decode``).

    Raises:
        EnvelopeError: the envelope holds no records or they do not parse.
        CorruptEnvelopeError: the checksum does not match.
        UnsupportedEnvelopeError: the envelope has a schema version newer than SCHEMA_VERSION.
    """
    if env.schema_version > SCHEMA_VERSION:
        raise UnsupportedEnvelopeError(
            f"envelope schema version {env.schema_version} is newer than this reader's {SCHEMA_VERSION} "
            "(upgrade dedupers before wrappers)"
        )
    # Read once: each read of a bytes field copies it (the whole payload, ~512 KB with large records).
    records = env.records
    if not _checksum_matches(env, records):
        raise CorruptEnvelopeError(
            f"checksum mismatch in envelope for {env.source.topic}-{env.source.partition} "
            f"after offset {env.previous_offset}"
        )
    if not env.source.topic:
        raise EnvelopeError("envelope without a source topic")
    run = run_of_payload(records)
    if env.record_count and env.record_count != len(run):
        raise EnvelopeError(f"envelope says {env.record_count} records but holds {len(run)}")
    # A copy, not env.source: a sub-message keeps its parent's whole arena alive, records included (~512 KB
    # with large records), and a transaction holds the source of every envelope it writes (its slices) until
    # it commits. Holding the sub-message made the deduper's memory grow with the transaction, not its queues.
    source = envelope_pb2.SourcePartition()
    source.CopyFrom(env.source)
    return DecodedEnvelope(
        source=source,
        previous_offset=env.previous_offset,
        run=run,
        wrapper_id=env.wrapper_id,
        wrapper_epoch=env.wrapper_epoch,
        wrapped_at_ms=env.wrapped_at_ms,
        trace_context=dict(env.trace_context),
        record_traces=record_traces
        if record_traces is not None
        else {t.offset: (t.traceparent, t.tracestate) for t in env.record_traces}
        if env.record_traces
        else {},
    )


def record_traces_suffix(traces: Iterable[tuple[int, str, str]]) -> bytes:
    """Bytes that, appended to a serialized envelope, add these record traces (offset, traceparent, tracestate).

    Protobuf merges a message parsed from concatenated serializations (repeated
    fields append), so the wrapper adds the trace contexts of the sampled
    records to an envelope the codec already built, compiled or not. Written
    as wire bytes (no message object: this runs per traced record).
    """
    out = []
    for offset, traceparent, tracestate in traces:  # RecordTrace: offset = 1, traceparent = 2, tracestate = 3
        trace = (b"\x08" + varint(offset) if offset else b"") + len_field(2, traceparent.encode())  # proto3: 0 left out
        if tracestate:
            trace += len_field(3, tracestate.encode())
        out.append(len_field(11, trace))  # Envelope.record_traces = 11
    return b"".join(out)


def headers_of(record: envelope_pb2.Record | envelope_pb2.RecordHeaders) -> list[tuple[str, bytes | None]]:
    """Headers of a row-form record (or a columnar batch's RecordHeaders) in confluent-kafka's form, nulls kept."""
    return [(h.key, h.value if h.HasField("value") else None) for h in record.headers]


def add_headers(
    record: envelope_pb2.Record | envelope_pb2.RecordHeaders, headers: Iterable[tuple[str, bytes | None]]
) -> None:
    """Append confluent-kafka-style headers to a row-form record (or a RecordHeaders) being built."""
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
