"""Fill a source topic with the bench's records quickly, from several processes.

One Python producer tops out well below what a broker accepts (the per-record
Python work is the limit), so partitions are split over processes. Each process
writes whole partitions with an idempotent producer, so a retry can never put a
duplicate into the source and spoil the duplicate counts of the rows.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from bench.loader import LoadProducer
from bench.records import padding

#: Waiting for room in librdkafka's queue: serve delivery reports this long, then retry.
_QUEUE_FULL_POLL_S = 0.01


@dataclass(frozen=True)
class PreloadResult:
    """How the preload went."""

    records: int
    seconds: float
    processes: int


def _write_partitions(
    bootstrap: str, topic: str, jobs: list[tuple[int, int]], value_bytes: int, budget_s: float
) -> int:
    """Worker: write ``count`` records to each ``(partition, count)``; return records written."""
    load = LoadProducer(
        bootstrap,
        # Big batches: the preload is not timed per record, only its total matters.
        {"linger.ms": 20, "batch.size": 1_000_000, "queue.buffering.max.messages": 1_000_000},
    )
    pad = padding(value_bytes)
    written = 0
    for partition, count in jobs:
        sent = 0
        while True:
            sent += load.produce_run(topic, partition, range(sent, count), pad)
            if sent == count:
                break
            load.producer.poll(_QUEUE_FULL_POLL_S)  # queue full: serve deliveries, then resume
        load.producer.poll(0)
        written += sent
    load.finish(budget_s)
    return written


def preload(
    bootstrap: str, topic: str, counts: list[int], value_bytes: int, *, processes: int | None = None, budget_s: float
) -> PreloadResult:
    """Write ``counts[p]`` records to each partition ``p`` of ``topic`` (which must exist).

    Args:
        bootstrap: source cluster.
        topic: the topic to fill.
        counts: records per partition.
        value_bytes: size of every value.
        processes: producer processes; default one per core, at most one per partition.
        budget_s: how long the whole preload may take.

    Returns:
        What was written and how fast.

    Raises:
        KafkaException: a record could not be written within the budget.
    """
    n = max(1, min(processes or os.cpu_count() or 1, len(counts)))
    jobs: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    for p, count in enumerate(counts):
        jobs[p % n].append((p, count))
    start = time.monotonic()
    # spawn, not fork: the parent already runs librdkafka and harness threads.
    with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_write_partitions, bootstrap, topic, j, value_bytes, budget_s) for j in jobs]
        written = sum(f.result() for f in futures)
    return PreloadResult(written, time.monotonic() - start, n)
