"""The compiled codec on Messages a real consumer returned (not constructed ones).

librdkafka-built Messages differ from constructed ones where the codec reads
them directly: their error slot holds None rather than NULL, and their headers
stay in C until the first headers() call. Unit tests cannot make such Messages.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable

from confluent_kafka import Consumer, Message, Producer, TopicPartition
from ferryman import _batchcodec, envelope

from tests.helpers.kafka import KafkaCluster, create_topic, recent_create_time_ms

PARTITIONS = 3
PER_PARTITION = 200


def _consume_all(bootstrap: str, topic: str, expected: int) -> list[Message]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        msgs: list[Message] = []
        for _ in range(100):
            msgs += consumer.consume(1000, 1.0)
            if len(msgs) >= expected:
                break
        return msgs
    finally:
        consumer.close()


def test_consumed_messages_are_read_directly_and_encode_as_their_accessors_say(
    source_cluster: KafkaCluster, unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("consumed")
    create_topic(source_cluster.bootstrap_servers, topic, PARTITIONS)
    producer = Producer({"bootstrap.servers": source_cluster.bootstrap_servers})
    base_ts = recent_create_time_ms()  # explicit create times the retention keeps
    for i, p in itertools.product(range(PER_PARTITION), range(PARTITIONS)):
        headers: list[tuple[str, str | bytes | None]] | None = [("h", b"%d" % i), ("n", None)] if i % 3 == 0 else None
        producer.produce(
            topic,
            value=None if i % 7 == 0 else b"v%d" % i,
            key=b"k" if i % 2 else None,
            partition=p,
            headers=headers,
            timestamp=base_ts + i,
        )
    assert producer.flush(30) == 0
    msgs = _consume_all(source_cluster.bootstrap_servers, topic, PER_PARTITION * PARTITIONS)
    assert len(msgs) == PER_PARTITION * PARTITIONS

    assert not _batchcodec.has_error_events(msgs)
    assert _batchcodec.batch_flags(msgs) == _batchcodec.BATCH_HEADERS  # headers still in C count
    without_headers = [m for m in msgs if not m.headers()]  # headers() made them Python objects
    assert _batchcodec.batch_flags(without_headers) == 0
    assert _batchcodec.batch_flags(msgs) == _batchcodec.BATCH_HEADERS
    chunks = _batchcodec.partition_chunks(msgs)
    assert chunks is not None, "consumed records fell back to the accessors"
    by_accessors = [(t, p, len(list(g))) for (t, p), g in itertools.groupby(msgs, lambda m: (m.topic(), m.partition()))]
    assert [(t, p, hi - lo) for t, p, lo, hi in chunks] == by_accessors

    for _, _, lo, hi in chunks:
        encoded = _batchcodec.encode_messages(msgs, lo, hi)  # headers still in C: read through headers()
        assert encoded is not None
        run = envelope.run_of_payload(encoded[0])
        part = msgs[lo:hi]
        assert list(run.offsets) == [m.offset() for m in part]
        assert list(run.keys) == [m.key() for m in part]
        assert list(run.values) == [m.value() for m in part]
        assert [run.timestamp_type(i) - envelope.TIMESTAMP_TYPE_SHIFT for i in range(len(part))] == [
            m.timestamp()[0] for m in part
        ]
        assert list(run.timestamps_ms) == [m.timestamp()[1] for m in part]
        assert list(run.headers) == [(i, m.headers()) for i, m in enumerate(part) if m.headers()]
        assert sum(map(len, filter(None, map(operator.methodcaller("headers"), part)))) == encoded[1]


def test_an_error_event_among_consumed_messages_is_seen(
    source_cluster: KafkaCluster, unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("eof")
    create_topic(source_cluster.bootstrap_servers, topic, 1)
    producer = Producer({"bootstrap.servers": source_cluster.bootstrap_servers})
    producer.produce(topic, value=b"only", partition=0)
    assert producer.flush(30) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": source_cluster.bootstrap_servers,
            "group.id": "unused",
            "enable.partition.eof": True,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        msgs: list[Message] = []
        for _ in range(100):
            msgs += consumer.consume(10, 0.5)
            if any(m.error() is not None for m in msgs):
                break
    finally:
        consumer.close()
    assert any(m.error() is not None for m in msgs), "no end-of-partition event arrived"
    assert _batchcodec.has_error_events(msgs)
    assert _batchcodec.batch_flags(msgs) == _batchcodec.BATCH_ERRORS
    assert _batchcodec.partition_chunks(msgs) is None
