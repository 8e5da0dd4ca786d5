"""Kafka helpers for tests: create topics, read everything back, compare exactly."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


@dataclass(frozen=True)
class ConsumedRecord:
    """One record as read back, everything byte-faithfulness covers."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int
    timestamp_type: int


def wait_until(
    predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.2, message: str = "condition not met"
) -> None:
    """Poll predicate until true or the deadline passes (then AssertionError)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"{message} within {timeout_s:.0f}s")
        time.sleep(interval_s)


def create_topic(bootstrap: str, name: str, partitions: int, config: Mapping[str, str] | None = None) -> None:
    """Create a topic and wait until its metadata shows every partition."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1, config=dict(config or {}))])[name].result(30)

    def ready() -> bool:
        t = admin.list_topics(name, timeout=10).topics.get(name)
        return t is not None and t.error is None and len(t.partitions) == partitions

    wait_until(ready, 30, message=f"topic {name} not visible")


def _partitions(consumer: Consumer, topic: str) -> list[int]:
    t = consumer.list_topics(topic, timeout=10).topics.get(topic)
    if t is None or t.error is not None:
        return []
    return sorted(t.partitions)


def read_all(
    bootstrap: str,
    topic: str,
    *,
    isolation: str = "read_committed",
    timeout_s: float = 60.0,
    expected: int | None = None,
) -> dict[int, list[ConsumedRecord]]:
    """Read every partition of topic from the beginning to its end.

    With expected, keep re-reading to the (moving) end until at least that many
    records are there or timeout_s passes (AssertionError). A missing topic
    reads as empty unless expected is given.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        out = _read_once(bootstrap, topic, isolation, deadline)
        total = sum(len(v) for v in out.values())
        if expected is None or total >= expected:
            return out
        if time.monotonic() >= deadline:
            raise AssertionError(f"{topic}: {total} records after {timeout_s:.0f}s, expected {expected}")
        time.sleep(0.5)


def _read_once(bootstrap: str, topic: str, isolation: str, deadline: float) -> dict[int, list[ConsumedRecord]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "ferryman-test-reader",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": isolation,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        parts = _partitions(consumer, topic)
        out: dict[int, list[ConsumedRecord]] = {p: [] for p in parts}
        if not parts:
            return out
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        pending = set(parts)
        while pending:
            if time.monotonic() >= deadline:
                raise AssertionError(f"{topic}: partitions {sorted(pending)} not read to the end in time")
            for m in consumer.consume(num_messages=5000, timeout=0.5):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(m.partition())
                        continue
                    raise KafkaException(err)
                ts_type, ts = m.timestamp()
                out[m.partition()].append(
                    ConsumedRecord(
                        partition=m.partition(),
                        offset=m.offset(),
                        key=m.key(),
                        value=m.value(),
                        headers=tuple(m.headers() or ()),
                        timestamp_ms=ts,
                        timestamp_type=ts_type,
                    )
                )
        return out
    finally:
        consumer.close()


def _describe(r: ConsumedRecord) -> str:
    v = r.value
    shown = None if v is None else (v[:40] + (b"..." if len(v) > 40 else b""))
    return f"offset={r.offset} key={r.key!r} value={shown!r} headers={r.headers} ts={r.timestamp_ms}"


def assert_exact_copy(source: dict[int, list[ConsumedRecord]], dest: dict[int, list[ConsumedRecord]]) -> None:
    """Per partition: same records, same order, none missing, none duplicated, byte-faithful.

    Offsets differ by design (source gaps, destination transaction markers);
    everything else must match: key, value, headers (order, duplicates, nulls),
    timestamp.
    """
    for p in sorted(set(source) | set(dest)):
        src = source.get(p, [])
        dst = dest.get(p, [])
        src_keys = [(r.key, r.value, r.headers, r.timestamp_ms) for r in src]
        dst_keys = [(r.key, r.value, r.headers, r.timestamp_ms) for r in dst]
        if src_keys == dst_keys:
            continue
        missing = len(src) - len(set(map(repr, dst_keys)) & set(map(repr, src_keys)))
        dups = len(dst_keys) - len(set(map(repr, dst_keys)))
        first = next(
            (i for i, (a, b) in enumerate(zip(src_keys, dst_keys, strict=False)) if a != b), min(len(src), len(dst))
        )
        detail = (
            f"source[{first}] = {_describe(src[first]) if first < len(src) else '<end>'}; "
            f"destination[{first}] = {_describe(dst[first]) if first < len(dst) else '<end>'}"
        )
        raise AssertionError(
            f"partition {p}: source has {len(src)} records, destination {len(dst)} "
            f"(~{missing} missing, {dups} duplicated); first difference at index {first}: {detail}"
        )
