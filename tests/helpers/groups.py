"""Consumer groups in tests: a group reading at the source and committing, a member at the destination."""

from __future__ import annotations

import time
from collections.abc import Mapping

from confluent_kafka import Consumer, TopicPartition


def consume_at_source(
    bootstrap: str, topic: str, group: str, counts: Mapping[int, int], to_end: frozenset[int] = frozenset()
) -> dict[int, int]:
    """Read counts[p] records of each partition as group, commit the positions (to_end: the end); return them."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in counts])
        positions: dict[int, int] = {}
        seen = dict.fromkeys(counts, 0)
        deadline = time.monotonic() + 60
        while any(seen[p] < counts[p] for p in counts) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            p = int(msg.partition() or 0)
            if seen[p] < counts[p]:
                seen[p] += 1
                positions[p] = int(msg.offset() or 0) + 1
        assert seen == dict(counts), seen
        for p in to_end:  # as a Java consumer at the end commits: its position, past the last transaction's marker
            _low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            assert high > positions[p], (high, positions[p])  # the marker is there: offset - 1 is no record
            positions[p] = high
        consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in positions.items()], asynchronous=False)
        return positions
    finally:
        consumer.close()


def destination_member(bootstrap: str, topic: str, group: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",  # a group without committed offsets would read everything again
        }
    )


def read_as_member(consumer: Consumer, topic: str, expected: int, quiet_s: float = 3.0) -> dict[int, list[bytes]]:
    """What a member of the group reads from where the group stands: until expected, then quiet_s of nothing."""
    consumer.subscribe([topic])
    got: dict[int, list[bytes]] = {}
    deadline = time.monotonic() + 60
    quiet_from: float | None = None
    while time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            got.setdefault(int(msg.partition() or 0), []).append(bytes(msg.value() or b""))
            quiet_from = None
            continue
        if sum(len(v) for v in got.values()) >= expected and consumer.assignment():
            quiet_from = quiet_from or time.monotonic()
            if time.monotonic() - quiet_from >= quiet_s:
                return got
    raise AssertionError(f"read {sum(len(v) for v in got.values())} of {expected} records")
