"""Warm the destination broker before the first measured row.

A freshly started broker JIT-compiles its produce, fetch and transaction paths
during its first minute or two on these 2 cores, and the first row measured would
pay for it (the project notes saw p50 latency 3-4x higher on cold brokers). The
source broker warms up during the preload and its read-back; this does the same
for the destination: transactional writes (as the exactly-once rows do) and a
read_committed read of them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import Producer

from bench.errors import BenchError
from bench.records import make_key, make_value, padding, split_counts
from bench.topics import create_topics
from bench.verify import audit

#: Records per warm-up transaction: several commits, each a realistic size.
_RECORDS_PER_TXN = 20_000
#: Budget of one transactional call (init, commit).
_CALL_BUDGET_S = 30.0


@dataclass(frozen=True)
class WarmupResult:
    """How long the warm-up took."""

    records: int
    seconds: float


def warm_up(destination: str, topic: str, partitions: int, records: int, value_bytes: int) -> WarmupResult:
    """Write ``records`` transactionally to a new ``topic`` on ``destination`` and read them back."""
    start = time.monotonic()
    create_topics(destination, [topic], partitions)
    producer = Producer(
        {
            "bootstrap.servers": destination,
            "transactional.id": f"{topic}-warmup",
            "linger.ms": 5,
            "queue.buffering.max.messages": _RECORDS_PER_TXN * 2,
        }
    )
    producer.init_transactions(_CALL_BUDGET_S)
    pad = padding(value_bytes)
    counts = split_counts(records, partitions)
    for i in range(records):
        if i % _RECORDS_PER_TXN == 0:
            if i:
                producer.commit_transaction(_CALL_BUDGET_S)
            producer.begin_transaction()
        seq, p = divmod(i, partitions)
        producer.produce(topic, make_value(p, seq, pad), make_key(seq), p)
        producer.poll(0)
    producer.commit_transaction(_CALL_BUDGET_S)
    result = audit(destination, topic, counts, _CALL_BUDGET_S)
    if not result.tally.complete:
        raise BenchError(f"warm-up read back {result.tally.unique} of {records} records ({result.error})")
    return WarmupResult(records, time.monotonic() - start)
