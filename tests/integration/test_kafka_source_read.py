"""The span reader's two paths on a real broker: the compiled one (``_spanread``) and ``consume()``.

Whichever path an executor takes (the compiled reader where it is built, the
``consume()`` path on a cluster whose executors have only the Python sources),
a read must give the same Arrow table: same records, same offsets (sparse
after transaction markers and aborted records), same keys and values with null
told apart from empty, same headers (null values, repeated names, records
without any), same timestamps and types, and the span's bounds kept.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from ferryman_auditor.kafka_source import KafkaSourceError, OffsetSpan, read_span
from ferryman_auditor.kafka_source._reader import compiled_path

from tests.helpers.kafka import KafkaCluster, create_topic

pytestmark = pytest.mark.integration

_BUDGET_S = 30.0
_STALL_MS = 20_000
_TXN_RECORDS = 700  # more than a few fetches' worth, fewer than one consume() batch


def test_the_compiled_reader_is_built_and_bound() -> None:
    # A C compiler is part of the install (Cython builds the services' fast paths too).
    assert compiled_path() is None


def _record(i: int) -> tuple[bytes | None, bytes | None, list[tuple[str, str | bytes | None]] | None]:
    """Record i of the topic: every shape of key, value and headers, mixed."""
    key = None if i % 7 == 0 else b"" if i % 11 == 0 else f"k{i % 13}".encode()
    value = None if i % 5 == 0 else b"" if i % 17 == 0 else f"v{i}".encode() * (1 + i % 9)
    headers: list[tuple[str, str | bytes | None]] | None = None
    if i % 3 == 0:
        headers = [("h", f"{i}".encode()), ("empty", b""), ("null", None)]
    elif i % 4 == 1:
        headers = [("traceparent", b"00-abc-def-01"), ("h", b"x"), ("h", b"again"), ("ü", b"\xff\x00")]
    return key, value, headers


def _write(bootstrap: str, topic: str, base_ms: int) -> None:
    """Partition 0: plain records (timestamps base_ms + i), then committed and aborted transactions; 1 stays empty."""
    create_topic(bootstrap, topic, 2)
    plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(300):
        key, value, headers = _record(i)
        plain.produce(topic, value, key, partition=0, headers=headers, timestamp=base_ms + i)
    assert plain.flush(_BUDGET_S) == 0
    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": topic, "linger.ms": 5})
    txn.init_transactions(_BUDGET_S)
    for n, commit in enumerate((True, False, True, False, True)):
        txn.begin_transaction()
        for i in range(1000 * (n + 1), 1000 * (n + 1) + _TXN_RECORDS):
            key, value, headers = _record(i)
            txn.produce(topic, value, key, partition=0, headers=headers)
        if commit:
            txn.commit_transaction(_BUDGET_S)
        else:
            # Written first: an abort before the records reach the transaction leaves nothing to skip.
            assert txn.flush(_BUDGET_S) == 0
            txn.abort_transaction(_BUDGET_S)


def _end_offset(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex[:8]}"})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), _BUDGET_S)[1])
    finally:
        consumer.close()


def _read(bootstrap: str, span: OffsetSpan, *, compiled: bool) -> pa.Table:
    config = {"bootstrap.servers": bootstrap, "isolation.level": "read_committed"}
    batches = list(read_span(span, config, _STALL_MS, compiled=compiled))
    from ferryman_auditor.kafka_source import ARROW_SCHEMA  # noqa: PLC0415

    return pa.Table.from_batches(batches, schema=ARROW_SCHEMA)


def test_both_paths_read_the_same_table(source_cluster: KafkaCluster, unique_name: Callable[[str], str]) -> None:
    bootstrap = source_cluster.bootstrap_servers
    topic = unique_name("spanread")
    # Recent times: the broker's time retention would delete records from years ago.
    base_ms = int(time.time() * 1000) - 60_000
    _write(bootstrap, topic, base_ms)
    end = _end_offset(bootstrap, topic)
    # Three committed transactions of _TXN_RECORDS each after the 300 plain records; aborted ones never.
    committed = 300 + 3 * _TXN_RECORDS
    spans = [
        OffsetSpan(topic, 0, 0, end),  # the whole partition, ending on a transaction marker
        OffsetSpan(topic, 0, 150, 1500),  # starts mid-way, ends inside the first aborted transaction
        OffsetSpan(topic, 0, 301, 302),  # one record (the first of a transaction)
        OffsetSpan(topic, 0, 1000, 1100),  # only aborted records: nothing
        OffsetSpan(topic, 1, 0, 0),  # empty
    ]
    sizes = []
    for span in spans:
        compiled, fallback = _read(bootstrap, span, compiled=True), _read(bootstrap, span, compiled=False)
        assert compiled.num_rows == fallback.num_rows, span
        assert compiled.equals(fallback), span
        offsets = compiled.column("offset").to_pylist()
        assert all(span.start <= o < span.end for o in offsets)
        sizes.append(compiled.num_rows)
    whole = _read(bootstrap, spans[0], compiled=True)
    assert sizes[0] == committed
    assert sizes[1:] == [850, 1, 0, 0]
    # The records are what was written, field by field (read_committed: aborted transactions left out).
    written = [_record(i) for i in range(300)] + [
        _record(i) for n in (0, 2, 4) for i in range(1000 * (n + 1), 1000 * (n + 1) + _TXN_RECORDS)
    ]
    assert whole.column("key").to_pylist() == [k for k, _v, _h in written]
    assert whole.column("value").to_pylist() == [v for _k, v, _h in written]
    assert whole.column("headers").to_pylist() == [
        None if h is None else [{"key": k, "value": v} for k, v in h] for _k, _v, h in written
    ]
    stamps = whole.column("timestamp").cast(pa.int64()).to_pylist()[:300]
    assert stamps == [(base_ms + i) * 1000 for i in range(300)]
    assert set(whole.column("timestamp_type").to_pylist()) == {0}  # create time
    offsets = whole.column("offset").to_pylist()
    assert offsets == sorted(offsets) and offsets[-1] < end and len(set(offsets)) == committed
    assert offsets[-1] - offsets[0] + 1 > committed  # sparse: markers and aborted records hold offsets


def test_a_start_no_longer_stored_fails_the_read(
    source_cluster: KafkaCluster, unique_name: Callable[[str], str]
) -> None:
    bootstrap = source_cluster.bootstrap_servers
    topic = unique_name("spanread-gone")
    create_topic(bootstrap, topic, 1)
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, b"v", partition=0)
    assert producer.flush(_BUDGET_S) == 0
    for compiled in (True, False):
        with pytest.raises(KafkaSourceError, match="spanread-gone"):
            _read(bootstrap, OffsetSpan(topic, 0, 5, 10), compiled=compiled)
