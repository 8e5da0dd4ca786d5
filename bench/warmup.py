"""Warm both brokers before the first measured row, the same way for every row.

A freshly started broker JIT-compiles its produce, fetch, group and transaction
paths during its first minutes, and on these 2 cores that compilation competes
with whatever runs: the first row measured used to pay for it. The same ferryman
row measured p50 latency 3-5x higher on clusters the bench had just started than
on long-running ones (docs/notes.md), and a warm-up of a few transactional writes
did not close the gap.

So the warm-up runs, for a fixed time, every path the rows use, with none of their
code: a paced idempotent load into a source topic (its own process, as in the
latency phase), a consume→produce relay that reads it ``read_committed`` and
writes the destination in transactions committed every 100 ms together with its
source offsets for a consumer group (``send_offsets_to_transaction``), and a
``read_committed`` reader of the destination that is a member of a consumer
group. Its records are never measured; it fails only if nothing at all made it
across.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from ferryman.client_config import STREAMING_CONSUMER_DEFAULTS

from bench.errors import BenchError
from bench.latency import offer
from bench.topics import create_topics

#: Offered load of the warm-up, records/s: well below every row's maximum here...
_RATE = 50_000
#: ...and in bytes: 50,000 records/s of 100 KB (the large scenario's biggest) is 5 GB/s, which no row
#: reaches; a generator that far behind built each partition's whole backlog of values at once (~20 GB).
_MAX_BYTES_PER_S = 25 * 1024 * 1024
#: Transaction length of the relay (the services' default transaction interval).
_TXN_S = 0.1
#: Records per consume() call of the relay and the reader.
_BATCH = 5_000
#: Longest wait of one consume() call.
_POLL_S = 0.02
#: Budget of one transactional call (init, send offsets, commit).
_CALL_BUDGET_S = 30.0
#: After the load ends, the relay and the reader get this long to copy and read the rest.
_DRAIN_S = 10.0


@dataclass(frozen=True)
class WarmupResult:
    """What the warm-up did."""

    offered: int
    relayed: int
    read: int
    seconds: float


def _relay(source: str, destination: str, src_topic: str, dst_topic: str, group: str, stop: threading.Event) -> int:
    """Copy src_topic to dst_topic exactly once until stop is set; return records copied."""
    consumer = Consumer(
        {
            **STREAMING_CONSUMER_DEFAULTS,
            "bootstrap.servers": source,
            "group.id": group,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    producer = Producer({"bootstrap.servers": destination, "transactional.id": f"{group}-relay", "linger.ms": 5})
    copied = 0
    try:
        producer.init_transactions(_CALL_BUDGET_S)
        # Assigned, not subscribed: no rebalance can fail a transaction's offsets. The
        # offsets still go to the group's coordinator inside each transaction.
        partitions = consumer.list_topics(src_topic, _CALL_BUDGET_S).topics[src_topic].partitions
        consumer.assign([TopicPartition(src_topic, p, OFFSET_BEGINNING) for p in partitions])
        positions: dict[int, int] = {}
        started = time.monotonic()
        producer.begin_transaction()
        while not stop.is_set():
            for msg in consumer.consume(_BATCH, _POLL_S):
                partition, offset = msg.partition(), msg.offset()
                if msg.error() is not None or partition is None or offset is None:
                    continue
                producer.produce(dst_topic, msg.value(), msg.key(), partition, timestamp=msg.timestamp()[1])
                positions[partition] = offset + 1
                copied += 1
            producer.poll(0)
            if time.monotonic() - started >= _TXN_S:
                if positions:
                    offsets = [TopicPartition(src_topic, p, o) for p, o in positions.items()]
                    producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), _CALL_BUDGET_S)
                producer.commit_transaction(_CALL_BUDGET_S)
                positions.clear()
                started = time.monotonic()
                producer.begin_transaction()
        producer.commit_transaction(_CALL_BUDGET_S)
    finally:
        consumer.close()
    return copied


def _read(destination: str, topic: str, target: int, caught_up: threading.Event, stop: threading.Event) -> int:
    """Read topic read_committed in a consumer group (its join warms the group coordinator) until stop is set.

    Sets caught_up once target records were read.
    """
    consumer = Consumer(
        {
            **STREAMING_CONSUMER_DEFAULTS,
            "bootstrap.servers": destination,
            "group.id": f"{topic}-reader",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    read = 0
    try:
        consumer.subscribe([topic])
        while not stop.is_set():
            read += sum(1 for m in consumer.consume(_BATCH, _POLL_S) if m.error() is None)
            if read >= target:
                caught_up.set()
    finally:
        consumer.close()
    return read


def warmup_rate(value_bytes: int) -> float:
    """The warm-up's offered load, records/s: ``_RATE``, or less for records so large that it would pass
    ``_MAX_BYTES_PER_S``."""
    return min(_RATE, _MAX_BYTES_PER_S / max(1, value_bytes))


def warm_up(
    source: str, destination: str, topic: str, partitions: int, seconds: float, value_bytes: int
) -> WarmupResult:
    """Run the warm-up traffic through ``topic`` (source) and ``topic`` (destination) for ``seconds``.

    Raises:
        BenchError: the relay or the reader saw no records at all.
        KafkaException: a client call failed.
    """
    start = time.monotonic()
    create_topics(source, [topic], partitions)
    create_topics(destination, [topic], partitions)
    group = f"{topic}-relay"
    stop_relay, stop_reader, caught_up = threading.Event(), threading.Event(), threading.Event()
    rate = warmup_rate(value_bytes)
    offered = int(rate * seconds)
    with ThreadPoolExecutor(2, thread_name_prefix="warmup") as threads:
        relay = threads.submit(_relay, source, destination, topic, topic, group, stop_relay)
        reader = threads.submit(_read, destination, topic, offered, caught_up, stop_reader)
        try:
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
                pool.submit(offer, source, topic, partitions, offered, rate, value_bytes).result()
            caught_up.wait(_DRAIN_S)  # the last transactions commit and are read
        finally:
            stop_relay.set()
            relayed = relay.result(_CALL_BUDGET_S * 2)
            stop_reader.set()
            read = reader.result(_CALL_BUDGET_S)
    if not relayed or not read:
        raise BenchError(f"warm-up moved nothing: {offered:,} offered, {relayed:,} relayed, {read:,} read")
    return WarmupResult(offered, relayed, read, time.monotonic() - start)
