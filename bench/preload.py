"""Fill the source topics with the bench's records quickly, from several processes.

One Python producer tops out well below what a broker accepts (the per-record
Python work is the limit), so partitions are split over processes. Each process
writes whole partitions with an idempotent producer, so a retry can never put a
duplicate into the source and spoil the duplicate counts of the rows.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Sequence
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


#: One partition's share of the preload: ``(topic, partition, header partition, records)``; the header
#: partition numbers the partitions of all the source topics (``bench.records``).
Job = tuple[str, int, int, int]


def _write_partitions(bootstrap: str, jobs: list[Job], value_bytes: int, budget_s: float) -> int:
    """Worker: write each job's records to its partition; return records written."""
    load = LoadProducer(
        bootstrap,
        # Big batches: the preload is not timed per record, only its total matters.
        {"linger.ms": 20, "batch.size": 1_000_000, "queue.buffering.max.messages": 1_000_000},
    )
    pad = padding(value_bytes)
    written = 0
    for topic, partition, numbered, count in jobs:
        sent = 0
        while True:
            sent += load.produce_run(topic, partition, range(sent, count), pad, header_partition=numbered)
            if sent == count:
                break
            load.producer.poll(_QUEUE_FULL_POLL_S)  # queue full: serve deliveries, then resume
        load.producer.poll(0)
        written += sent
    load.finish(budget_s)
    return written


def split_jobs(topics: Sequence[str], counts: Sequence[int], processes: int) -> list[list[Job]]:
    """Every partition of ``topics`` with its ``counts`` entry, dealt round-robin to ``processes`` workers.

    ``counts`` holds the records of each partition, topic after topic: entry ``i * P + p`` is
    partition p of ``topics[i]`` (P = ``len(counts) // len(topics)``), and that is the partition
    number its records' headers carry.
    """
    partitions = len(counts) // len(topics)
    jobs: list[list[Job]] = [[] for _ in range(processes)]
    for numbered, count in enumerate(counts):
        i, p = divmod(numbered, partitions)
        jobs[numbered % processes].append((topics[i], p, numbered, count))
    return jobs


def preload(
    bootstrap: str,
    topics: Sequence[str],
    counts: Sequence[int],
    value_bytes: int,
    *,
    processes: int | None = None,
    budget_s: float,
) -> PreloadResult:
    """Write the records ``counts`` gives to every partition of ``topics`` (which must exist).

    Args:
        bootstrap: source cluster.
        topics: the topics to fill, all with the same partition count.
        counts: records per partition, topic after topic (see ``split_jobs``).
        value_bytes: size of every value.
        processes: producer processes; default one per core, at most one per partition.
        budget_s: how long the whole preload may take.

    Returns:
        What was written and how fast.

    Raises:
        ValueError: ``counts`` does not cover the same number of partitions in every topic.
        KafkaException: a record could not be written within the budget.
    """
    if not topics or len(counts) % len(topics):
        raise ValueError(f"{len(counts)} partition counts cannot be split evenly over {len(topics)} topics")
    n = max(1, min(processes or os.cpu_count() or 1, len(counts)))
    jobs = split_jobs(topics, counts, n)
    start = time.monotonic()
    # spawn, not fork: the parent already runs librdkafka and harness threads.
    with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_write_partitions, bootstrap, j, value_bytes, budget_s) for j in jobs]
        written = sum(f.result() for f in futures)
    return PreloadResult(written, time.monotonic() - start, n)
