"""The deduper's direct produce path (``_rdproduce``) on a real broker.

What a read_committed consumer sees must not depend on the path: the same
records, byte for byte (null and empty apart, timestamps, headers with null
values), in the same order, each once. And where the direct path stops (a full
queue, a producer in an error state, an entry of a type it does not take),
``produce()`` must take over with its usual outcome.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from ferryman import _rdproduce, rowproduce

from tests.helpers.bench import micro_benchmark_lines
from tests.helpers.kafka import KafkaCluster, create_topic, recent_create_time_ms

Row = tuple[bytes | None, bytes | None, int, Any]  # value, key, timestamp, headers (as consumed)


def _producer(bootstrap: str, client_id: str, **extra: Any) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "client.id": client_id, "linger.ms": 5, **extra})


def _consume(bootstrap: str, topic: str, partition: int, expected: int) -> list[Row]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        consumer.assign([TopicPartition(topic, partition, 0)])
        rows: list[Row] = []
        for _ in range(60):
            for m in consumer.consume(1000, 1.0):
                assert m.error() is None, m.error()
                rows.append((m.value(), m.key(), m.timestamp()[1], m.headers()))
            if len(rows) >= expected:
                break
        return rows
    finally:
        consumer.close()


def _columns(n: int) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
    """Every shape a consumed record can have: null and empty keys and values, headers with null values."""
    values = [None if i % 7 == 0 else b"" if i % 11 == 0 else b"value-%d" % i * (1 + i % 5) for i in range(n)]
    keys = [None if i % 2 else b"" if i % 9 == 0 else b"key-%d" % i for i in range(n)]
    base_ms = recent_create_time_ms()
    stamps = [base_ms + i for i in range(n)]
    headers: list[list[tuple[str, bytes | None]] | None] = [
        None if i % 3 else [("trace", b"t%d" % i), ("null", None), ("empty", b""), ("ünï", b"\x00\xff")]
        for i in range(n)
    ]
    return values, keys, stamps, headers


def _expected(columns: Sequence[Sequence[Any]], start: int, n: int) -> list[Row]:
    return [(columns[0][i], columns[1][i], columns[2][i], columns[3][i]) for i in range(start, start + n)]


def test_the_direct_path_is_bound_for_the_pinned_confluent_kafka() -> None:
    """A unit of its own: an upgrade that breaks a check fails here, not silently in the benchmark."""
    assert rowproduce.rdproduce is not None, "ferryman._rdproduce is not built"
    assert rowproduce.WHY_NOT is None
    assert _rdproduce.bind() is None  # idempotent


def test_adopts_only_a_plain_producer_with_the_client_id_it_was_built_with(source_cluster: KafkaCluster) -> None:
    class Sub(Producer):
        pass

    producer = _producer(source_cluster.bootstrap_servers, "ferryman-adopt-probe")
    assert rowproduce.adopts(producer, "ferryman-adopt-probe")
    assert not rowproduce.adopts(producer, "ferryman-adopt")  # a prefix of the name is not the name
    assert not rowproduce.adopts(producer, "someone-else")
    assert not rowproduce.adopts(Sub({"client.id": "ferryman-adopt-probe"}), "ferryman-adopt-probe")
    assert not rowproduce.adopts(object(), "ferryman-adopt-probe")  # type: ignore[arg-type]


@pytest.mark.parametrize(("start", "n"), [(0, 500), (37, 400)], ids=["whole", "from-a-watermark"])
def test_direct_rows_arrive_as_produce_would_write_them(
    source_cluster: KafkaCluster, unique_name: Callable[[str], str], start: int, n: int
) -> None:
    topic = unique_name("direct")
    create_topic(source_cluster.bootstrap_servers, topic, 2)
    columns = _columns(start + n)
    producer = _producer(source_cluster.bootstrap_servers, "ferryman-direct-test")
    assert rowproduce.adopts(producer, "ferryman-direct-test")
    assert _rdproduce.produce_rows(producer, topic, 1, *columns, start, n) == n
    rowproduce.produce_run(producer, topic, 0, columns, start=start, n=n, direct=False)
    assert producer.flush(30) == 0
    direct = _consume(source_cluster.bootstrap_servers, topic, 1, n)
    through_produce = _consume(source_cluster.bootstrap_servers, topic, 0, n)
    assert direct == _expected(columns, start, n)
    assert direct == through_produce


def test_a_full_queue_is_waited_out_and_every_row_arrives_once_in_order(
    source_cluster: KafkaCluster, unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("direct-full")
    create_topic(source_cluster.bootstrap_servers, topic, 1)
    columns = _columns(300)
    producer = _producer(source_cluster.bootstrap_servers, "ferryman-full-test", **{"queue.buffering.max.messages": 16})
    assert rowproduce.adopts(producer, "ferryman-full-test")
    assert _rdproduce.produce_rows(producer, topic, 0, *columns, 0, 300) == 16
    rowproduce.produce_run(producer, topic, 0, columns, start=16, n=284, direct=True)
    assert producer.flush(30) == 0
    assert _consume(source_cluster.bootstrap_servers, topic, 0, 300) == _expected(columns, 0, 300)


def test_entries_the_direct_path_does_not_take_go_through_produce(
    source_cluster: KafkaCluster, unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("direct-mixed")
    create_topic(source_cluster.bootstrap_servers, topic, 1)
    values: list[Any] = [b"a", "text", b"c", b"d", b"e", b"f"]
    keys: list[Any] = [b"k", b"k", "str-key", b"k", b"k", b"k"]
    t = recent_create_time_ms()
    stamps: list[Any] = [t + 1, t + 2, t + 3, t + 4, 2**70, t + 6]
    many = [(f"h{i}", b"x") for i in range(80)]
    headers: list[Any] = [None, None, None, many, None, [("s", "str-value")]]
    producer = _producer(source_cluster.bootstrap_servers, "ferryman-mixed-test")
    assert rowproduce.adopts(producer, "ferryman-mixed-test")
    assert _rdproduce.produce_rows(producer, topic, 0, values, keys, stamps, headers, 0, 6) == 1  # stops at "text"
    with pytest.raises(OverflowError):  # produce() says what is wrong with the 2**70 timestamp
        rowproduce.produce_run(producer, topic, 0, [values, keys, stamps, headers], start=1, n=5, direct=True)
    stamps[4] = t + 5
    rowproduce.produce_run(producer, topic, 0, [values, keys, stamps, headers], start=4, n=2, direct=True)
    assert producer.flush(30) == 0
    rows = _consume(source_cluster.bootstrap_servers, topic, 0, 6)
    assert [(v, k, t) for v, k, t, _ in rows] == [
        (b"a", b"k", t + 1),
        (b"text", b"k", t + 2),
        (b"c", b"str-key", t + 3),
        (b"d", b"k", t + 4),
        (b"e", b"k", t + 5),
        (b"f", b"k", t + 6),
    ]
    assert rows[3][3] == many
    assert rows[5][3] == [("s", b"str-value")]


def test_a_producer_in_an_error_state_refuses_through_produce(
    destination_cluster: KafkaCluster, unique_name: Callable[[str], str]
) -> None:
    """No open transaction: librdkafka refuses the row, and produce() raises what it always raised."""
    topic = unique_name("direct-state")
    create_topic(destination_cluster.bootstrap_servers, topic, 1)
    producer = _producer(
        destination_cluster.bootstrap_servers, "ferryman-state-test", **{"transactional.id": unique_name("txn")}
    )
    producer.init_transactions(30)
    columns = _columns(5)
    assert rowproduce.adopts(producer, "ferryman-state-test")
    assert _rdproduce.produce_rows(producer, topic, 0, *columns, 0, 5) == 0
    with pytest.raises(KafkaException) as refused:
        rowproduce.produce_run(producer, topic, 0, columns, start=0, n=5, direct=True)
    with pytest.raises(KafkaException) as by_produce:
        producer.produce(topic, b"v", partition=0)
    assert refused.value.args[0].code() == by_produce.value.args[0].code()
    producer.begin_transaction()
    rowproduce.produce_run(producer, topic, 0, columns, start=0, n=5, direct=True)
    producer.commit_transaction(30)
    assert _consume(destination_cluster.bootstrap_servers, topic, 0, 5) == _expected(columns, 0, 5)


def test_a_header_name_utf8_cannot_encode_raises_after_the_rows_before_it(
    source_cluster: KafkaCluster, unique_name: Callable[[str], str]
) -> None:
    """produce() would crash the process on it (confluent-kafka 2.16.1); the direct path raises instead."""
    topic = unique_name("direct-utf8")
    create_topic(source_cluster.bootstrap_servers, topic, 1)
    producer = _producer(source_cluster.bootstrap_servers, "ferryman-utf8-test")
    headers: list[Any] = [None, [("\udc80", b"v")]]
    stamp = recent_create_time_ms()
    with pytest.raises(UnicodeEncodeError):
        _rdproduce.produce_rows(producer, topic, 0, [b"a", b"b"], [None, None], [stamp, stamp], headers, 0, 2)
    assert producer.flush(30) == 0
    # The row before it was queued (len(producer) would also count librdkafka's pending events).
    assert _consume(source_cluster.bootstrap_servers, topic, 0, 1) == [(b"a", None, stamp, None)]


def test_rows_out_of_the_columns_are_refused() -> None:
    producer = Producer({"client.id": "ferryman-range-test"})
    columns = _columns(3)
    with pytest.raises(IndexError):
        _rdproduce.produce_rows(producer, "t", 0, *columns, 1, 3)
    with pytest.raises(IndexError):
        _rdproduce.produce_rows(producer, "t", 0, *columns, -1, 1)


def test_the_produce_path_micro_benchmark_runs_as_documented(source_cluster: KafkaCluster) -> None:
    """``python -m bench.produce_path`` (a smoke run: its figures come from full runs)."""
    lines = micro_benchmark_lines("bench.produce_path", source_cluster.bootstrap_servers)
    assert lines[0].startswith("pair 1: produce ") and " direct " in lines[0]
    assert lines[-1].startswith("median: produce() ") and "direct / produce() = " in lines[-1]
