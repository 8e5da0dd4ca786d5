"""Read topics back in full and compare them record for record.

Used by the demo (and mirrored by the tests' helpers): a
replica is exact when, per partition, it holds the same records in the same
order (key, value, headers, timestamp), none missing, none duplicated. With
tracing on, a traced record's copy carries a ``traceparent`` header of the
deduper's (README "Operations: tracing"): ``without_header`` leaves that
header out on both sides first, so every other byte is still compared.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

Record = tuple[bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...], int]


def read_topic(bootstrap: str, topic: str, *, timeout_s: float = 60.0) -> dict[int, list[Record]]:
    """Every record of every partition, read_committed, from the beginning to the end."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "ferryman-verify",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    try:
        md = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if md is None or md.error is not None:
            return {}
        parts = sorted(md.partitions)
        out: dict[int, list[Record]] = {p: [] for p in parts}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        pending = set(parts)
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=10_000, timeout=0.5):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(m.partition() or 0)
                        continue
                    raise KafkaException(err)
                headers = tuple(m.headers() or ())
                out[m.partition() or 0].append((m.key(), m.value(), headers, m.timestamp()[1]))  # type: ignore[arg-type]
        return out
    finally:
        consumer.close()


def without_header(records: dict[int, list[Record]], name: str) -> tuple[dict[int, list[Record]], int]:
    """The records with every header called name left out, and how many records had one."""
    had = 0
    out: dict[int, list[Record]] = {}
    for p, rows in records.items():
        kept = out[p] = []
        for key, value, headers, ts in rows:
            stripped = tuple(h for h in headers if h[0] != name)
            had += len(stripped) != len(headers)
            kept.append((key, value, stripped, ts))
    return out, had


@dataclass(frozen=True)
class Verdict:
    """Outcome of comparing a source topic with its replica."""

    source_records: int
    destination_records: int
    missing: int
    duplicated: int
    out_of_order_partitions: int

    @property
    def exact(self) -> bool:
        """True when the replica is exact."""
        return (
            self.missing == 0
            and self.duplicated == 0
            and self.out_of_order_partitions == 0
            and self.source_records == self.destination_records
        )

    def __str__(self) -> str:
        head = "EXACTLY ONCE" if self.exact else "NOT EXACT"
        return (
            f"{head}: {self.source_records} source records, {self.destination_records} at the destination, "
            f"{self.missing} missing, {self.duplicated} duplicated, "
            f"{self.out_of_order_partitions} partitions out of order"
        )


def compare(source: dict[int, list[Record]], destination: dict[int, list[Record]]) -> Verdict:
    """Compare per partition (multiset difference for missing/duplicates, sequence for order)."""
    missing = duplicated = disorder = 0
    for p in set(source) | set(destination):
        src = source.get(p, [])
        dst = destination.get(p, [])
        counts: dict[Record, int] = {}
        for r in src:
            counts[r] = counts.get(r, 0) + 1
        for r in dst:
            counts[r] = counts.get(r, 0) - 1
        missing += sum(c for c in counts.values() if c > 0)
        duplicated += sum(-c for c in counts.values() if c < 0)
        if src != dst and len(src) == len(dst) and not any(counts.values()):
            disorder += 1
    return Verdict(
        source_records=sum(len(v) for v in source.values()),
        destination_records=sum(len(v) for v in destination.values()),
        missing=missing,
        duplicated=duplicated,
        out_of_order_partitions=disorder,
    )
