"""The bench's compiled reader (``bench._readcols``) on a real broker.

What it reports must not depend on the path: per partition, the same records'
headers in the same order as ``consume()`` read through ``columns_of``, the same
tally, latencies from the same timestamps, and read_committed's view (aborted
records never). And it must be safe to hold: a consumer it does not take is
refused, and closing in either order does not crash the process.
"""

from __future__ import annotations

import time
import uuid
from array import array
from collections.abc import Callable

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    Producer,
    TopicPartition,
)

from bench.latency import SOURCE_TOPIC_CONFIG
from bench.readcols import NO_LATENCY, NO_OTHER_TYPE, WHY_NOT, Columns, DirectReader, columns_of
from bench.records import make_value, padding
from bench.verify import Tally
from tests.helpers.bench import micro_benchmark_lines
from tests.helpers.kafka import KafkaCluster, create_topic

pytestmark = pytest.mark.integration

_PARTITIONS = 3
_BUDGET_S = 30.0
_PAD = padding(40)


def test_the_compiled_reader_is_built_and_bound() -> None:
    # A C compiler is part of the install (Cython builds the services' fast paths too).
    assert WHY_NOT is None


def _consumer(bootstrap: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"direct-read-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )


def _mixed_topic(cluster: KafkaCluster, topic: str) -> dict[int, list[bytes | None]]:
    """Bench records with every kind of fault a copy can have, per partition: what was written."""
    create_topic(cluster.bootstrap_servers, topic, _PARTITIONS)
    written: dict[int, list[bytes | None]] = {}
    for p in range(_PARTITIONS):
        values: list[bytes | None] = [make_value(p, s, _PAD) for s in range(300)]
        values[10:12] = [values[11], values[10]]  # out of order
        values.insert(50, values[49])  # a duplicate
        del values[100]  # a gap
        if p == 0:  # the one record of a source partition the topic does not have, copied here
            values.insert(150, make_value(_PARTITIONS, 0, _PAD))
        values.insert(200, None)
        values.insert(201, b"not a bench record")
        values.insert(202, b"000100000000000")  # 15 digits: too short for a header
        values.insert(203, b" 00100000000005:padding")  # int() would take it; not 16 digits
        written[p] = values
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "linger.ms": 5})
    for p, values in written.items():
        for value in values:
            producer.produce(topic, value, key=b"k", partition=p)
    assert producer.flush(_BUDGET_S) == 0
    return written


def _read_all(
    cluster: KafkaCluster, topic: str, total: int, *, direct: bool, latency_type: int = NO_LATENCY
) -> tuple[list[Columns], array[float]]:
    consumer = _consumer(cluster.bootstrap_servers)
    reader = DirectReader(consumer) if direct else None
    latencies = array("d")
    batches: list[Columns] = []
    try:
        if reader is not None:
            reader.attach(topic, range(_PARTITIONS))
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(_PARTITIONS)])
        deadline = time.monotonic() + _BUDGET_S
        while sum(len(c.headers) for c in batches) < total and time.monotonic() < deadline:
            if reader is not None:
                cols = reader.read(500, 0.1, latency_type, latencies)
            else:
                cols = columns_of(consumer.consume(500, 0.1), latency_type, latencies)
            if cols.headers or cols.other_type != NO_OTHER_TYPE:
                batches.append(cols)
            if cols.other_type != NO_OTHER_TYPE:
                break
    finally:
        if reader is not None:
            reader.close()  # and the consumer after it
        else:
            consumer.close()
    return batches, latencies


def _by_partition(batches: list[Columns]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for cols in batches:
        for partition, start, stop, consecutive in cols.runs:
            run = list(cols.headers[start:stop])
            assert run, "an empty run"
            assert consecutive == (run[0] >= 0 and run == list(range(run[0], run[0] + len(run))))
            out.setdefault(partition, []).extend(run)
        assert sum(stop - start for _p, start, stop, _c in cols.runs) == len(cols.headers)
    return out


def _header(value: bytes | None) -> int:
    head = b"" if value is None else value[:16]
    return int(head) if len(head) == 16 and head.isdigit() else -1


def test_both_paths_report_the_same_records_and_tally(
    source_cluster: KafkaCluster, unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("mixed")
    written = _mixed_topic(source_cluster, topic)
    total = sum(map(len, written.values()))
    seen: dict[bool, dict[int, list[int]]] = {}
    tallies: dict[bool, tuple[int, ...]] = {}
    for direct in (True, False):
        batches, _ = _read_all(source_cluster, topic, total, direct=direct)
        seen[direct] = _by_partition(batches)
        tally = Tally([300] * _PARTITIONS + [1])
        for cols in batches:
            tally.add_columns(cols)
        tallies[direct] = (tally.unique, tally.duplicates, tally.misplaced, tally.disordered, tally.foreign)
    expected = {p: [_header(v) for v in values] for p, values in written.items()}
    assert seen[True] == seen[False] == expected
    # Per partition: 299 distinct of 300 (one dropped), one duplicate, one reordered, four values without a
    # header; and the misplaced record.
    assert tallies[True] == tallies[False] == (299 * _PARTITIONS + 1, _PARTITIONS, 1, _PARTITIONS, 4 * _PARTITIONS)


def test_latencies_come_from_the_timestamps_the_records_carry(
    source_cluster: KafkaCluster, unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("stamped")
    create_topic(source_cluster.bootstrap_servers, topic, _PARTITIONS, SOURCE_TOPIC_CONFIG)
    producer = Producer({"bootstrap.servers": source_cluster.bootstrap_servers, "linger.ms": 5})
    before_ms = time.time() * 1000
    for s in range(200):
        producer.produce(topic, make_value(s % _PARTITIONS, s // _PARTITIONS, _PAD), partition=s % _PARTITIONS)
    assert producer.flush(_BUDGET_S) == 0
    for direct in (True, False):
        batches, latencies = _read_all(
            source_cluster, topic, 200, direct=direct, latency_type=TIMESTAMP_LOG_APPEND_TIME
        )
        assert all(c.other_type == NO_OTHER_TYPE for c in batches)
        assert len(latencies) == 200
        assert all(0 <= lat <= time.time() * 1000 - before_ms for lat in latencies)
        # Asked for another type: the first record says which it carries, and no latency is taken.
        batches, latencies = _read_all(source_cluster, topic, 200, direct=direct, latency_type=TIMESTAMP_CREATE_TIME)
        assert batches[-1].other_type == TIMESTAMP_LOG_APPEND_TIME
        assert len(latencies) == 0


def test_aborted_records_are_never_read(source_cluster: KafkaCluster, unique_name: Callable[[str], str]) -> None:
    topic = unique_name("aborted")
    create_topic(source_cluster.bootstrap_servers, topic, 1)
    producer = Producer({"bootstrap.servers": source_cluster.bootstrap_servers, "transactional.id": topic})
    producer.init_transactions(_BUDGET_S)
    for seqs, commit in ((range(0, 5), True), (range(100, 105), False), (range(5, 10), True)):
        producer.begin_transaction()
        for s in seqs:
            producer.produce(topic, make_value(0, s, _PAD), partition=0)
        if commit:
            producer.commit_transaction(_BUDGET_S)
        else:
            # Written first: an abort before the records (and their partition) reach the
            # transaction would leave nothing to skip, and the coordinator may refuse it as
            # INVALID_TXN_STATE, a fatal error (librdkafka issue #4849).
            assert producer.flush(_BUDGET_S) == 0
            producer.abort_transaction(_BUDGET_S)
    batches, _ = _read_all(source_cluster, topic, 10, direct=True)
    assert _by_partition(batches) == {0: list(range(10))}


def test_a_consumer_it_does_not_take_is_refused(source_cluster: KafkaCluster) -> None:
    producer = Producer({"bootstrap.servers": source_cluster.bootstrap_servers})
    with pytest.raises(ValueError, match=r"not a plain confluent_kafka\.Consumer"):
        DirectReader(producer)  # type: ignore[arg-type]
    consumer = _consumer(source_cluster.bootstrap_servers)
    consumer.close()
    with pytest.raises(ValueError, match="closed"):
        DirectReader(consumer)


def test_closing_the_reader_closes_its_consumer_after_it(
    source_cluster: KafkaCluster, unique_name: Callable[[str], str]
) -> None:
    # The reader first: closing the consumer while records are queued for the reader would block in librdkafka.
    topic = unique_name("closing")
    _mixed_topic(source_cluster, topic)
    consumer = _consumer(source_cluster.bootstrap_servers)
    reader = DirectReader(consumer)
    reader.attach(topic, range(_PARTITIONS))
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(_PARTITIONS)])
    assert len(reader.read(100, _BUDGET_S).headers) == 100  # more records stay queued behind these
    reader.close()
    with pytest.raises(RuntimeError, match="closed"):
        consumer.assignment()
    with pytest.raises(ValueError, match="reader is closed"):
        reader.read(100, 0.1)


def test_the_read_path_micro_benchmark_runs_as_documented(source_cluster: KafkaCluster) -> None:
    """``python -m bench.read_path`` (a smoke run: its figures come from full runs)."""
    lines = micro_benchmark_lines("bench.read_path", source_cluster.bootstrap_servers)
    assert lines[0].startswith("pair 1: consume ") and " direct " in lines[0]
    assert lines[-1].startswith("median: consume() ") and "direct / consume() = " in lines[-1]


def test_latencies_need_an_array_of_doubles(source_cluster: KafkaCluster) -> None:
    consumer = _consumer(source_cluster.bootstrap_servers)
    reader = DirectReader(consumer)
    try:
        for wrong in (None, array("f")):
            with pytest.raises(ValueError, match=r"array\('d'\)"):
                reader.read(10, 0.0, TIMESTAMP_LOG_APPEND_TIME, wrong)
    finally:
        reader.close()
