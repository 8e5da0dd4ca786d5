"""The producer the bench's load generators share (the preload and the latency phase's offered load)."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer


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
