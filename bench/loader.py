"""The producer the bench's load generators share (the preload and the latency phase's offered load)."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Mapping
from itertools import count, repeat
from operator import length_hint
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from ferryman import rowproduce

from bench.records import keys_of, values_of

_client_ids = count()
#: The load's batches go to the source uncompressed, librdkafka's default and what a source application
#: writes unless told otherwise. A replicator running next to the destination fetches them as they are:
#: its own producer's compression applies to the destination's side only (bench.crossing).
LOAD_COMPRESSION = "none"


class LoadProducer:
    """An idempotent producer that reports only failed deliveries, and raises the first one at the end.

    Args:
        bootstrap: the cluster to write to.
        direct: hand the records to librdkafka without a ``produce()`` call each, where
            ``ferryman.rowproduce`` can (the deduper's path): about half the CPU per record,
            which the latency phase's generator leaves to what it measures. A failed
            delivery of such a record is not reported here (librdkafka reports it to
            no one): the latency phase finds it missing at the destination instead.
        settings: librdkafka properties of the load (linger, batch and queue sizes).
    """

    def __init__(self, bootstrap: str, settings: Mapping[str, Any] | None = None, *, direct: bool = False) -> None:
        self.errors: list[KafkaError] = []
        client_id = f"ferryman-bench-load-{os.getpid()}-{next(_client_ids)}"
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "client.id": client_id,
                "enable.idempotence": True,
                # Delivery reports only for failures: no per-record callback on the hot path.
                "delivery.report.only.error": True,
                "on_delivery": self._on_delivery,
                "compression.type": LOAD_COMPRESSION,
                **(settings or {}),
            }
        )
        self.direct = direct and rowproduce.adopts(self.producer, client_id)
        self._zeros: list[int] = []  # the timestamps column of direct runs: 0 is "now", as produce() sends

    def _on_delivery(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self.errors.append(err)

    def produce_run(
        self, topic: str, partition: int, seqs: range, pad: bytes, *, header_partition: int | None = None
    ) -> int:
        """Queue records ``seqs`` of ``partition`` (the ``bench.records`` format) in one C-level loop.

        No Python code runs per record: ``map`` formats the values and keys and drives
        ``produce()`` (about 1 us per record less than a Python loop, which matters when
        the offered load shares 2 cores with what it measures).

        ``header_partition``: the partition number the values' headers carry, when it is
        not ``partition`` (one of several source topics: ``bench.records``).

        Returns:
            How many records were queued: all of them, or those before the first one
            librdkafka's full queue refused (``BufferError``); the caller polls and resumes.
        """
        numbered = partition if header_partition is None else header_partition
        if self.direct:
            return self._produce_direct(topic, partition, numbered, seqs, pad)
        value_seqs = iter(seqs)
        values, keys = values_of(numbered, value_seqs, pad), keys_of(iter(seqs))
        calls = map(self.producer.produce, repeat(topic), values, keys, repeat(partition))
        try:
            deque(calls, maxlen=0)
        except BufferError:
            # map had taken the refused record's sequence number from value_seqs too.
            return len(seqs) - length_hint(value_seqs) - 1
        return len(seqs)

    def _produce_direct(self, topic: str, partition: int, numbered: int, seqs: range, pad: bytes) -> int:
        """``produce_run`` through ``ferryman.rowproduce``'s direct path (headers carry partition ``numbered``)."""
        if len(self._zeros) < len(seqs):
            self._zeros = [0] * len(seqs)
        columns: list[list[Any]] = [list(values_of(numbered, seqs, pad)), list(keys_of(seqs)), self._zeros]
        return rowproduce.produce_run(
            self.producer, topic, partition, columns, start=0, n=len(seqs), direct=True, wait=False
        )

    def finish(self, budget_s: float) -> None:
        """Wait for every record to be delivered.

        Raises:
            KafkaException: a record was not delivered, or not within budget_s.
        """
        left = self.producer.flush(budget_s)
        if self.errors or left:
            raise KafkaException(
                self.errors[0] if self.errors else KafkaError(KafkaError._TIMED_OUT, f"{left} records unsent")
            )
