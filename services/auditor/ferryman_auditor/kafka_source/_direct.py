"""The span reader's compiled path: librdkafka's messages into Arrow buffers (``_spanread``), wrapped as batches.

``_reader.read_span`` takes this path when the extension is built and binds to
the librdkafka confluent-kafka runs; otherwise (no C compiler at install,
another librdkafka layout, a Spark executor with only the Python sources) it
reads through ``consume()``. Both yield the same batches: a test holds them
equal on a real topic with transactions, aborts, headers and null keys and
values.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
from confluent_kafka import Consumer, KafkaException, TopicPartition

from ferryman_auditor.kafka_source._errors import KafkaSourceError, StallWatch
from ferryman_auditor.kafka_source._planning import OffsetSpan
from ferryman_auditor.kafka_source._schema import ARROW_SCHEMA, CONSUME_BATCH, CONSUME_WAIT_S, HEADER_TYPE

_IMPORT_ERROR: str | None = None
try:
    import ferryman_auditor.kafka_source._spanread as _spanread  # noqa: PLR0402 -- names the module when missing
except ImportError as exc:  # not built (no C compiler), or built against another ferryman
    _spanread = None  # type: ignore[assignment]
    _IMPORT_ERROR = f"ferryman_auditor.kafka_source._spanread cannot be imported ({exc})"

#: Why the compiled span reader is not available (None: it is).
WHY_NOT: str | None = _IMPORT_ERROR if _spanread is None else _spanread.bind()

_HEADER_STRUCT = HEADER_TYPE.value_type


def read_span(
    span: OffsetSpan, conf: Mapping[str, Any], stall_timeout_ms: int, wait_s: float = CONSUME_WAIT_S
) -> Iterator[pa.RecordBatch]:
    """``_reader.read_span`` through the compiled reader (``WHY_NOT`` must be None); conf: the consumer's.

    Raises:
        KafkaSourceError: the start is no longer stored, a Kafka error, or no progress for stall_timeout_ms.
    """
    if _spanread is None or WHY_NOT is not None:
        raise KafkaSourceError(f"the compiled span reader is unavailable: {WHY_NOT}")
    consumer = Consumer(dict(conf))
    reader = _spanread.SpanReader(consumer, span.topic, span.partition)
    wait_ms = max(1, round(wait_s * 1000))
    try:
        consumer.assign([TopicPartition(span.topic, span.partition, span.start)])
        stall = StallWatch(span, stall_timeout_ms)
        position = span.start
        while position < span.end:
            # As the consume() path: no more than the offsets left and the partition-end event.
            columns, eof, past_end, error = reader.read(min(CONSUME_BATCH, span.end - position + 1), wait_ms, span.end)
            if error is not None:
                raise KafkaSourceError(f"reading {span.topic}-{span.partition} from {span.start}: {error[1]}")
            if columns is None and eof < 0 and not past_end:
                stall.check(position)
                continue
            stall.progressed()
            if columns is not None:
                batch = _batch(span, columns)
                yield batch
                position = int(np.frombuffer(columns[4], dtype=np.int64)[-1]) + 1
            if past_end:
                return
            if eof >= 0:
                position = max(position, eof)
    except KafkaException as exc:
        raise KafkaSourceError(f"reading {span.topic}-{span.partition} [{span.start}, {span.end}): {exc}") from exc
    finally:
        reader.close()  # first: the consumer's close waits for records still queued for the reader
        consumer.close()


def _binary(parts: tuple[Any, ...], n: int, type_: pa.DataType) -> pa.Array:
    validity, offsets, data, nulls = parts
    return pa.Array.from_buffers(
        type_,
        n,
        [None if validity is None else pa.py_buffer(validity), pa.py_buffer(offsets), pa.py_buffer(data)],
        null_count=nulls,
    )


def _headers(parts: tuple[Any, ...] | None, n: int) -> pa.Array:
    if parts is None:
        return pa.nulls(n, HEADER_TYPE)
    validity, list_offsets, name_offsets, name_data, value_validity, value_offsets, value_data, value_nulls, has = parts
    total = len(name_offsets) // 4 - 1
    names = _binary((None, name_offsets, name_data, 0), total, pa.string())
    names.validate(full=True)  # header names are UTF-8 (confluent-kafka decodes them as such)
    values = _binary((value_validity, value_offsets, value_data, value_nulls), total, pa.binary())
    entries = pa.StructArray.from_arrays([names, values], fields=list(_HEADER_STRUCT))
    return pa.Array.from_buffers(
        HEADER_TYPE,
        n,
        [None if validity is None else pa.py_buffer(validity), pa.py_buffer(list_offsets)],
        null_count=n - has,
        children=[entries],
    )


def _batch(span: OffsetSpan, columns: tuple[Any, ...]) -> pa.RecordBatch:
    n, key, value, headers, offsets, stamps, types = columns
    topic = span.topic.encode()
    return pa.RecordBatch.from_arrays(
        [
            _binary(key, n, pa.binary()),
            _binary(value, n, pa.binary()),
            _headers(headers, n),
            pa.Array.from_buffers(
                pa.string(),
                n,
                [None, pa.py_buffer(np.arange(n + 1, dtype=np.int32) * len(topic)), pa.py_buffer(topic * n)],
            ),
            pa.array(np.full(n, span.partition, dtype=np.int32)),
            pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(offsets)]),
            pa.Array.from_buffers(pa.timestamp("us", tz="UTC"), n, [None, pa.py_buffer(stamps)]),
            pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(types)]),
        ],
        schema=ARROW_SCHEMA,
    )
