"""Visible records as the bench's tally and latency need them: columns, not ``Message`` objects.

One contract (``Columns``), two sources:

* ``DirectReader``: the compiled ``bench._readcols``, which pops the consumer's
  fetched messages straight from librdkafka (see that module for why and how);
  the reader of the latency phase and of the bulk copy's visibility timeline;
* ``columns_of``: the same columns from the ``Message`` objects ``consume()``
  returns, where the compiled reader is unavailable (no C compiler, another
  librdkafka layout) and for the audit's read.

A record's header is the 16 ASCII digits its value starts with
(``bench.records``), as a number, or -1 when the value is null, shorter, or
starts otherwise.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter
from typing import Any

from confluent_kafka import Consumer, Message

from bench.records import HEADER_BYTES

_IMPORT_ERROR: str | None = None
try:
    from bench import _readcols
except ImportError as exc:  # not built (python -m bench.build), or built against another ferryman
    _readcols = None  # type: ignore[assignment]
    _IMPORT_ERROR = f"bench._readcols cannot be imported ({exc}); python -m bench.build builds it"

#: ``latency_type`` meaning "take no latencies".
NO_LATENCY = -1
#: ``Columns.other_type`` when every record carried the timestamp type asked for.
NO_OTHER_TYPE = -1

#: Why the compiled reader is not available (None: it is).
WHY_NOT: str | None = _IMPORT_ERROR if _readcols is None else _readcols.bind()

_partition: Any = Message.partition
_value: Any = Message.value
_error: Any = Message.error
_timestamp: Any = Message.timestamp
_head: Any = itemgetter(slice(0, HEADER_BYTES))
_first = itemgetter(0)
_second = itemgetter(1)


def reader_path() -> str:
    """Which path the bench reads visible records through, and why not the compiled one (for its log)."""
    return "compiled (bench._readcols)" if WHY_NOT is None else f"consume() per batch ({WHY_NOT})"


@dataclass(frozen=True)
class Columns:
    """One batch of visible records.

    Attributes:
        headers: each record's header (-1: none), in the order read.
        runs: ``(partition, start, stop)`` of each stretch of records of one partition
            (``headers[start:stop]``), with ``consecutive`` true when every header
            there is the one before it plus one.
        events: error events in the batch (skipped).
        other_type: the first timestamp type other than the one latencies were asked
            for (``NO_OTHER_TYPE``: none); no latency was taken from that record on.
    """

    headers: Sequence[int]
    runs: list[tuple[int, int, int, bool]]
    events: int = 0
    other_type: int = NO_OTHER_TYPE


def columns_of(msgs: list[Message], latency_type: int = NO_LATENCY, latencies: array[float] | None = None) -> Columns:
    """The columns of a batch ``consume()`` returned.

    With ``latency_type`` (a ``confluent_kafka.TIMESTAMP_*``), appends to
    ``latencies`` each record's latency in ms: the wall-clock time now minus its
    timestamp, up to the first record whose timestamp is of another type.
    """
    records = [m for m in msgs if m.error() is None] if any(map(_error, msgs)) else msgs
    headers = _headers(list(map(_value, records)))
    runs: list[tuple[int, int, int, bool]] = []
    start = 0
    for partition, group in groupby(map(_partition, records)):
        stop = start + len(list(group))
        first = headers[start]
        consecutive = first >= 0 and headers[start:stop] == list(range(first, first + stop - start))
        runs.append((partition, start, stop, consecutive))
        start = stop
    other_type = NO_OTHER_TYPE
    if latency_type != NO_LATENCY and records:
        if latencies is None:
            raise ValueError("latencies need an array('d') with a latency type")
        now_ms = time.time() * 1000.0
        stamps = list(map(_timestamp, records))  # (type, ms) of each record
        types = list(map(_first, stamps))
        if any(map(latency_type.__ne__, types)):
            k = next(i for i, t in enumerate(types) if t != latency_type)
            other_type, stamps = types[k], stamps[:k]
        latencies.extend(map(now_ms.__sub__, map(_second, stamps)))
    return Columns(headers, runs, len(msgs) - len(records), other_type)


def _headers(values: list[bytes | None]) -> list[int]:
    """Each value's header; in C when every value starts with one (a correct copy)."""
    try:
        heads: list[bytes] = list(map(_head, values))
    except TypeError:  # a null value
        return list(map(_header_of, values))
    joined = b"".join(heads)
    if len(joined) == HEADER_BYTES * len(heads) and joined.isdigit():
        return list(map(int, heads))
    return list(map(_header_of, values))


def _header_of(value: bytes | None) -> int:
    if value is None:
        return -1
    head = value[:HEADER_BYTES]
    return int(head) if len(head) == HEADER_BYTES and head.isdigit() else -1


class DirectReader:
    """Reads one consumer's partitions through the compiled reader.

    Attach every partition before the consumer assigns it, and read from one
    thread. The reader owns the consumer from here on: ``close()`` closes both,
    in the one safe order. (Closing the consumer first blocks inside librdkafka
    for good: the records still queued for this reader hold references its
    destroy waits for.)
    """

    def __init__(self, consumer: Consumer) -> None:
        if _readcols is None or WHY_NOT is not None:
            raise ValueError(f"the compiled reader is unavailable: {WHY_NOT}")
        self._reader = _readcols.Reader(consumer)
        self._consumer = consumer

    def attach(self, topic: str, partitions: Sequence[int]) -> None:
        """Forward these partitions of ``topic`` to this reader."""
        for p in partitions:
            self._reader.attach(topic, p)

    def read(
        self, max_records: int, timeout_s: float, latency_type: int = NO_LATENCY, latencies: array[float] | None = None
    ) -> Columns:
        """Up to ``max_records`` records, waiting up to ``timeout_s`` for the first; as ``columns_of``."""
        headers, runs, events, other_type = self._reader.read(
            max_records, max(0, round(timeout_s * 1000)), latency_type, latencies
        )
        return Columns(headers, runs, events, other_type)

    def close(self) -> None:
        """Stop reading, then close the consumer."""
        self._reader.close()
        self._consumer.close()
