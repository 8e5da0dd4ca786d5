"""Source topic discovery and topic-spec publication.

The wrapper is the only half with credentials for the source cluster, so it
describes the selected source topics (partitions, topic id, replicable configs)
and publishes them to the flow's compacted topic-spec topic on the destination
cluster before it sends any envelope of a topic or a new partition of it. The
deduper creates and grows destination topics from those specs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from ferryman import topics
from ferryman.errors import KafkaOperationError
from ferryman.naming import TopicFilter
from ferryman.state import spec_key
from ferryman.v1 import state_pb2

_log = logging.getLogger(__name__)


@dataclass
class SpecPublisher:
    """Keeps the destination's view of the source topics up to date."""

    source_admin: AdminClient
    producer: Producer
    specs_topic: str
    cluster_id: str
    topic_filter: TopicFilter
    replicate_configs: bool
    timeout_s: float

    def __post_init__(self) -> None:
        self.published: dict[str, state_pb2.TopicSpec] = {}
        self.on_change: Callable[[list[state_pb2.TopicSpec]], None] | None = None

    def discover(self) -> list[str]:
        """Selected source topics now; publishes specs of new or changed ones."""
        names = [t for t in topics.list_topic_names(self.source_admin, self.timeout_s) if self.topic_filter.matches(t)]
        self.refresh(names)
        return sorted(self.published.keys() & set(names))

    def refresh(self, names: list[str]) -> None:
        """Describe names at the source and publish every spec that changed."""
        infos = topics.describe_topics(self.source_admin, names, self.timeout_s)
        configs = (
            topics.replicable_configs(self.source_admin, infos.keys(), self.timeout_s) if self.replicate_configs else {}
        )
        changed = []
        errors: list[str] = []

        def on_delivery(err: object, _msg: object) -> None:
            if err is not None:
                errors.append(str(err))

        for name, info in infos.items():
            spec = state_pb2.TopicSpec(
                cluster_id=self.cluster_id,
                topic=name,
                topic_id=info.topic_id,
                partitions=info.partitions,
                configs=configs.get(name, {}),
            )
            old = self.published.get(name)
            if (
                old is not None
                and old.topic_id == spec.topic_id
                and old.partitions == spec.partitions
                and dict(old.configs) == dict(spec.configs)
            ):
                continue
            spec.observed_at_ms = int(time.time() * 1000)
            self.producer.produce(
                self.specs_topic,
                key=spec_key(self.cluster_id, name),
                value=spec.SerializeToString(),
                on_delivery=on_delivery,
            )
            changed.append(spec)
        if not changed:
            return
        remaining = self.producer.flush(self.timeout_s)
        if remaining or errors:
            raise KafkaOperationError(
                f"publishing topic specs to {self.specs_topic}",
                TimeoutError(f"{remaining} not acknowledged, errors: {errors}"),
            )
        for spec in changed:
            self.published[spec.topic] = spec
            _log.info(
                "published spec of source topic %s: %d partitions, configs %s",
                spec.topic,
                spec.partitions,
                dict(spec.configs) or "{}",
            )
        if self.on_change is not None:
            self.on_change(changed)
