"""Producing a run of column rows: through librdkafka directly where possible, else ``produce()``.

The deduper's per-record cost was mostly ``Producer.produce()`` itself: argument
parsing, a topic lookup by name, and a per-message state allocated and freed
for a delivery report nobody asked for. The compiled ``_rdproduce`` hands the
same records to the same librdkafka producer without those (its docstring says
how, and what is checked first). This module chooses between the two paths and
gives both the same contract: :func:`produce_run` produces rows
``start..start+n-1`` of the columns, in order, each exactly once, or raises
what ``produce()`` raises; a full local queue is waited out, serving delivery
reports meanwhile.
"""

from __future__ import annotations

import collections
import itertools
import operator
from collections.abc import Sequence
from typing import Any

from confluent_kafka import Producer

#: The compiled path, or None when it was not built (no C compiler at install).
try:
    from ferryman import _rdproduce
except ImportError:
    _rdproduce = None  # type: ignore[assignment]
rdproduce = _rdproduce  # the public name (tests swap it for None to run the produce() path)

#: Why rows cannot bypass produce() in this process, or None when they can.
WHY_NOT: str | None = "the compiled path was not built" if rdproduce is None else rdproduce.bind()


def describe(direct: bool) -> str:
    """The produce path a producer runs, for the deduper's start-up log."""
    if direct:
        return "direct to librdkafka"
    return f"produce() per record ({WHY_NOT or 'this producer was not adopted'})"


#: Wait between retries of a row refused because librdkafka's local queue is full.
_QUEUE_FULL_POLL_S = 0.05
#: An endless column of None: the callback and on_delivery slots of produce() calls.
_NONES = itertools.repeat(None)


def adopts(producer: Producer, client_id: str) -> bool:
    """Whether :func:`produce_run` may bypass ``produce()`` for this producer (built with ``client_id``)."""
    return rdproduce is not None and bool(rdproduce.adopts(producer, client_id))  # False when not bound


def produce_run(
    producer: Producer,
    topic: str,
    partition: int,
    columns: Sequence[Sequence[Any]],
    *,
    start: int,
    n: int,
    direct: bool,
    wait: bool = True,
) -> int:
    """Produce rows start..start+n-1 of the columns to topic's partition.

    Args:
        producer: where the rows go (inside its open transaction, if any).
        topic: the destination topic.
        partition: the destination partition.
        columns: values, keys, timestamps and, when any row has headers, headers (None: none).
        start: the first row.
        n: how many rows.
        direct: the producer was adopted (:func:`adopts`); the columns must then
            be lists for the direct path to take them, else ``produce()`` does.
        wait: when librdkafka's queue is full, serve deliveries until there is
            room (the deduper); False: stop there (a paced load generator).

    Returns:
        How many rows were produced: n, or with ``wait`` False, those before the
        first one the full queue refused.

    Raises:
        KafkaException: the producer refused a row (error state, fenced, closed...);
            the rows before it were produced.
    """
    lists = _as_lists(columns) if direct else None
    done = 0
    while done < n:
        i = start + done
        if lists is not None:
            done += rdproduce.produce_rows(producer, topic, partition, *lists, i, n - done)
        else:
            done += _produce_calls(producer, topic, partition, columns, start=i, n=n - done)
        if done < n:  # row start + done was refused: produce() says why, or waits for room
            row = tuple(c[start + done] for c in columns)
            if wait:
                produce_row(producer, topic, partition, row, None)
            elif not _produce_once(producer, topic, partition, row):
                return done
            done += 1
    return n


def produce_row(producer: Producer, topic: str, partition: int, row: tuple[Any, ...], callback: Any) -> None:
    """One row (value, key, timestamp[, headers]) with ``produce()``, waiting while the queue is full.

    The callback goes in the ``callback`` slot: a positional on_delivery is
    ignored when callback is None.
    """
    while not _produce_once(producer, topic, partition, row, callback):
        producer.poll(_QUEUE_FULL_POLL_S)


def _produce_once(producer: Producer, topic: str, partition: int, row: tuple[Any, ...], callback: Any = None) -> bool:
    """One row with ``produce()``; False when librdkafka's queue is full."""
    try:
        producer.produce(topic, row[0], row[1], partition, callback, None, *row[2:])
    except BufferError:
        return False
    return True


def _as_lists(columns: Sequence[Sequence[Any]]) -> tuple[list[Any], list[Any], list[Any], list[Any] | None] | None:
    """The columns as the direct path takes them (values, keys, timestamps, headers), or None if one is no list."""
    values, keys, stamps, *rest = columns
    headers = rest[0] if rest else None
    if type(values) is not list or type(keys) is not list or type(stamps) is not list:
        return None
    if headers is None or type(headers) is list:
        return values, keys, stamps, headers
    return None


def _produce_calls(
    producer: Producer, topic: str, partition: int, columns: Sequence[Sequence[Any]], *, start: int, n: int
) -> int:
    """Rows through ``produce()``, all in C; how many were produced before a refusal.

    ``starmap`` feeds ``produce()`` its positional arguments (topic, value,
    key, partition, callback, on_delivery, timestamp[, headers]) zipped from
    the columns, and a zero-length deque drains it: no bytecode runs per
    record. A refused row is found from how far the value column's cursor got.
    """
    cursors = [iter(c) for c in columns]
    if start:
        for cursor in cursors:
            next(itertools.islice(cursor, start, start), None)
    values, keys, *rest = cursors
    left = operator.length_hint(values)
    rows = zip(itertools.repeat(topic), values, keys, itertools.repeat(partition), _NONES, _NONES, *rest)
    try:
        collections.deque(itertools.starmap(producer.produce, itertools.islice(rows, n)), maxlen=0)
    except BufferError:
        return left - operator.length_hint(values) - 1  # the rows zip pulled, less the refused one
    return n
