"""A partition librdkafka calls unknown is asked for afresh before the next try (``topics.watermark_offsets``).

librdkafka answers ``get_watermark_offsets`` from its metadata cache; after a broker thawed from a freeze a restore
consumer's cache kept the topic without partitions, and every try of a 30 s budget failed the same way (a CI run).
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from ferryman import topics


class _StaleCacheConsumer:
    """Calls the partition unknown until the topic's metadata is asked for."""

    def __init__(self) -> None:
        self.refreshed: list[str] = []

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        if tp.topic not in self.refreshed:
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION))
        return (0, 42)

    def list_topics(self, topic: str, timeout: float) -> Any:
        self.refreshed.append(topic)
        return None


def test_an_unknown_partition_refreshes_the_topics_metadata_and_the_next_try_answers() -> None:
    consumer = _StaleCacheConsumer()
    assert topics.watermark_offsets(consumer, "state", 3, budget_s=5.0) == (0, 42)  # type: ignore[arg-type]
    assert consumer.refreshed == ["state"]
