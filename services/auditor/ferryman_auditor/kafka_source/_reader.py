"""Executor-side reads: one offset span of one partition, as Arrow record batches.

No Python code runs per record. Where the compiled span reader is built and
binds (``_direct``: librdkafka's messages copied straight into Arrow buffers),
it reads. Otherwise a consume() batch is cut at the span's end by bisection,
turned into columns by the compiled envelope codec (``ferryman._batchcodec``:
the messages' fields read in C into one columnar RecordBatch, decoded back into
column lists), and each column becomes an Arrow array in one call; where that
codec is not built either, or leaves a batch (a key of another type), each
column is one C-level ``map`` over the messages. Every path yields the same
batches.
"""

from __future__ import annotations

import bisect
import uuid
from collections.abc import Iterator, Mapping, Sequence
from itertools import chain, repeat
from operator import add, itemgetter
from typing import Any

import numpy as np
import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from ferryman import envelope
from ferryman.envelope import RecordRun

from ferryman_auditor.kafka_source import _direct
from ferryman_auditor.kafka_source._errors import KafkaSourceError, StallWatch
from ferryman_auditor.kafka_source._planning import OffsetSpan
from ferryman_auditor.kafka_source._schema import ARROW_SCHEMA, CONSUME_BATCH, CONSUME_WAIT_S, HEADER_TYPE

__all__ = ["ARROW_SCHEMA", "compiled_path", "consumer_config", "read_span"]

#: The broker answers a fetch at the end of a partition after this long at most
#: (librdkafka's default is 500 ms): the end of a span is often the end of the
#: partition, which only an empty fetch answer (partition EOF) reveals.
_FETCH_WAIT_MS = 50
#: librdkafka stops fetching a partition for ``fetch.queue.backoff.ms`` (1 s by default) whenever its prefetch
#: queue is over ``queued.min.messages`` (100 k). A span read drains that queue in tens of milliseconds, so the
#: default left it idle most of each second: a 5 M-record audit kept 4 task slots ~1 core busy on 2.
_FETCH_QUEUE_BACKOFF_MS = 5

_offset: Any = Message.offset
_key: Any = Message.key
_value: Any = Message.value
_headers: Any = Message.headers
_timestamp: Any = Message.timestamp
_error: Any = Message.error

#: Spark's Kafka source numbers timestamp types as Kafka does: -1 none, 0 create time,
#: 1 log-append time. The envelope codec's values are those plus this.
_TYPE_FROM_CODEC = envelope.TIMESTAMP_TYPE_SHIFT + 1


def consumer_config(kafka_config: Mapping[str, str]) -> dict[str, Any]:
    """Properties of a span reader: the read's librdkafka properties, then what a positioned read needs."""
    conf: dict[str, Any] = {
        "fetch.wait.max.ms": _FETCH_WAIT_MS,
        "fetch.queue.backoff.ms": _FETCH_QUEUE_BACKOFF_MS,
        **kafka_config,
    }
    conf.update(
        {
            # Required by librdkafka, never used: partitions are assigned and nothing is committed.
            "group.id": conf.get("group.id", f"ferryman-kafka-source-{uuid.uuid4().hex[:8]}"),
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            # A span's start deleted by retention after planning is an error, never a silent jump.
            "auto.offset.reset": "error",
        }
    )
    return conf


def compiled_path() -> str | None:
    """None when span reads take the compiled reader, else why not (for logs)."""
    return _direct.WHY_NOT


def read_span(
    span: OffsetSpan, kafka_config: Mapping[str, str], stall_timeout_ms: int, *, compiled: bool | None = None
) -> Iterator[pa.RecordBatch]:
    """Yield the records of span as Arrow batches (ARROW_SCHEMA), in offset order.

    The read ends at the first record at or past ``span.end``, or when the
    partition's end (an EOF event, which carries the fetch position past any
    transaction markers and aborted records) is at or past it; never by
    counting records.

    Args:
        span: what to read.
        kafka_config: the read's librdkafka properties.
        stall_timeout_ms: longest time without progress.
        compiled: take the compiled reader (True), ``consume()`` (False), or the compiled one when it is
            available (None, the default).

    Raises:
        KafkaSourceError: the start is no longer stored, a Kafka error, or no progress for stall_timeout_ms,
            or the compiled reader was asked for and is unavailable.
    """
    if span.empty:
        return
    if compiled or (compiled is None and _direct.WHY_NOT is None):
        yield from _direct.read_span(span, consumer_config(kafka_config), stall_timeout_ms)
        return
    consumer = Consumer(consumer_config(kafka_config))
    try:
        consumer.assign([TopicPartition(span.topic, span.partition, span.start)])
        stall = StallWatch(span, stall_timeout_ms)
        position = span.start
        while position < span.end:
            # No more than the offsets left and the partition-end event: a dense span's last call returns at once.
            msgs = consumer.consume(min(CONSUME_BATCH, span.end - position + 1), CONSUME_WAIT_S)
            if not msgs:
                stall.check(position)
                continue
            stall.progressed()
            records, eof = _split_events(msgs, span)
            if records:
                cut = _cut(records, span.end)
                if cut:
                    yield _batch(span, records, cut)
                    position = _offset(records[cut - 1]) + 1
                if cut < len(records):
                    return  # a record at or past the end: the span is complete
            if eof is not None:
                position = max(position, eof)
    except KafkaException as exc:
        raise KafkaSourceError(f"reading {span.topic}-{span.partition} [{span.start}, {span.end}): {exc}") from exc
    finally:
        consumer.close()


def _split_events(msgs: list[Message], span: OffsetSpan) -> tuple[list[Message], int | None]:
    """The records of a consume() batch and the position of its last EOF event, if any.

    Raises:
        KafkaSourceError: an error event other than the partition's end.
    """
    codec = envelope.batchcodec
    if not (codec.has_error_events(msgs) if codec is not None else any(map(_error, msgs))):
        return msgs, None
    records, eof = [], None
    for m in msgs:
        err = m.error()
        if err is None:
            records.append(m)
        elif err.code() == KafkaError._PARTITION_EOF:
            eof = m.offset()
        else:
            raise KafkaSourceError(f"reading {span.topic}-{span.partition} from {span.start}: {err}")
    return records, eof


def _cut(records: Sequence[Message], end: int) -> int:
    """The number of leading records below end (records are in offset order)."""
    if _offset(records[-1]) < end:
        return len(records)
    return bisect.bisect_left(records, end, key=_offset)


def _batch(span: OffsetSpan, records: list[Message], n: int) -> pa.RecordBatch:
    """Columns of records[:n] as one Arrow batch."""
    run = _columns(records, n)
    types = run.timestamp_types
    type_column = (
        np.full(n, types[0] - _TYPE_FROM_CODEC, dtype=np.int32)
        if len(types) == 1
        else np.asarray(types, dtype=np.int32) - _TYPE_FROM_CODEC
    )
    headers = run.header_column()
    stamps = np.asarray(run.timestamps_ms, dtype=np.int64) * 1000
    return pa.RecordBatch.from_arrays(
        [
            pa.array(run.keys, pa.binary()),
            pa.array(run.values, pa.binary()),
            pa.nulls(n, HEADER_TYPE) if headers is None else pa.array(headers, HEADER_TYPE),
            pa.array([span.topic] * n, pa.string()),
            pa.array(np.full(n, span.partition, dtype=np.int32)),
            pa.array(np.asarray(run.offsets, dtype=np.int64)),
            pa.array(stamps, pa.timestamp("us", tz="UTC")),
            pa.array(type_column),
        ],
        schema=ARROW_SCHEMA,
    )


def _columns(records: list[Message], n: int) -> RecordRun:
    """records[:n] column by column: through the compiled codec when it takes them, else by C-level maps."""
    codec = envelope.batchcodec
    if codec is not None:
        encoded = codec.encode_messages(records, 0, n)
        if encoded is not None:
            return envelope.run_of_payload(encoded[0])
    msgs = records[:n]
    # timestamp() returns (type, ms): flattened once, the two columns are strided slices.
    flat: list[int] = list(chain.from_iterable(map(_timestamp, msgs)))
    return RecordRun(
        offsets=list(map(_offset, msgs)),
        timestamps_ms=flat[1::2],
        timestamp_types=list(map(add, flat[0::2], repeat(envelope.TIMESTAMP_TYPE_SHIFT))),
        keys=list(map(_key, msgs)),
        values=list(map(_value, msgs)),
        headers=list(filter(itemgetter(1), enumerate(map(_headers, msgs)))),
    )
