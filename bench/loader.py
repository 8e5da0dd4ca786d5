"""The producer the bench's load generators share (the preload and the latency phase's offered load)."""

from __future__ import annotations

from collections import deque
from itertools import repeat
from operator import length_hint
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from bench.records import keys_of, values_of


class LoadProducer:
    """An idempotent producer that reports only failed deliveries, and raises the first one at the end.

    Args:
        bootstrap: the cluster to write to.
        settings: librdkafka properties of the load (linger, batch and queue sizes).
    """

    def __init__(self, bootstrap: str, **settings: Any) -> None:
        self.errors: list[KafkaError] = []
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                # Delivery reports only for failures: no per-record callback on the hot path.
                "delivery.report.only.error": True,
                "on_delivery": self._on_delivery,
                **settings,
            }
        )

    def _on_delivery(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self.errors.append(err)

    def produce_run(self, topic: str, partition: int, seqs: range, pad: bytes) -> int:
        """Queue records ``seqs`` of ``partition`` (the ``bench.records`` format) in one C-level loop.

        No Python code runs per record: ``map`` formats the values and keys and drives
        ``produce()`` (about 1 us per record less than a Python loop, which matters when
        the offered load shares 2 cores with what it measures).

        Returns:
            How many records were queued: all of them, or those before the first one
            librdkafka's full queue refused (``BufferError``); the caller polls and resumes.
        """
        value_seqs = iter(seqs)
        values, keys = values_of(partition, value_seqs, pad), keys_of(iter(seqs))
        calls = map(self.producer.produce, repeat(topic), values, keys, repeat(partition))
        try:
            deque(calls, maxlen=0)
        except BufferError:
            # map had taken the refused record's sequence number from value_seqs too.
            return len(seqs) - length_hint(value_seqs) - 1
        return len(seqs)

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
