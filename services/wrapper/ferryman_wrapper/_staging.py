"""The flow's topics in the destination cluster, as the wrapper uses them.

At start the wrapper makes the staging topic and the topic-spec topic if they
are missing (and checks the shape of both). On assignment it reads back the
deduper's state topic: a source partition without a committed offset (offsets
reset or expired) resumes just after the watermark the deduper committed for
it, if that watermark is of the topic's current incarnation.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from confluent_kafka.admin import AdminClient
from ferryman import envelope, topics
from ferryman.advertisement import dedupers_topic
from ferryman.client_config import base_config
from ferryman.config import ClusterConfig, FlowConfig, WrapperConfig
from ferryman.naming import FlowNames
from ferryman.state import COMPACTED_TOPIC_CONFIGS, PartitionKey, decode_watermarks, read_compacted
from ferryman.topics import InternalTopic

from ferryman_wrapper._specs import SpecPublisher

_log = logging.getLogger(__name__)

#: Staging records are kept a week by default: longer than any deduper outage
#: we plan for, and long enough for an audit to look back.
_STAGING_RETENTION_MS = str(7 * 24 * 3600 * 1000)


class StagingTopics:
    """The staging and topic-spec topics made, the deduper's committed watermarks read (loop thread)."""

    def __init__(
        self,
        *,
        target: ClusterConfig,
        wc: WrapperConfig,
        names: FlowNames,
        wrapper_id: str,
        flow: Callable[[], FlowConfig],
        admin: Callable[[], AdminClient],
        cluster_id: Callable[[], str],
        specs: Callable[[], SpecPublisher],
        timeout_s: float,
    ) -> None:
        """Prepare (nothing is read or made before ensure()).

        Args:
            target: the destination cluster.
            wc: the wrapper's settings (staging message size, start-up budget).
            names: the flow's names (staging, topic-spec and state topics).
            wrapper_id: this process's identity (client ids).
            flow: the flow as it is now (the store may change it).
            admin: the destination cluster's admin client (after start-up).
            cluster_id: the source cluster's id (after start-up).
            specs: the topic spec publisher (the current topic ids).
            timeout_s: budget of one admin or metadata call.
        """
        self._target = target
        self._wc = wc
        self._names = names
        self._wrapper_id = wrapper_id
        self._flow = flow
        self._admin = admin
        self._cluster_id = cluster_id
        self._specs = specs
        self._timeout_s = timeout_s

    def ensure(self) -> list[str]:
        """Make the staging, topic-spec and (when discovering) dedupers topics if missing; check their shape.

        Returns:
            The topics made.

        Raises:
            TopicShapeError: a topic exists with another shape.
        """
        flow = self._flow()
        staging_configs = {
            "cleanup.policy": "delete",
            "max.message.bytes": str(self._wc.staging_max_message_bytes),
            "retention.ms": _STAGING_RETENTION_MS,
        }
        wanted = [
            InternalTopic(
                self._names.staging_topic,
                flow.staging_partitions,
                staging_configs,
                "staging",
                f"flows[{flow.name}].staging_partitions",
            ),
            InternalTopic(self._names.specs_topic, 1, COMPACTED_TOPIC_CONFIGS, "topic-spec"),
        ]
        if not self._wc.deduper_addresses and self._wc.discover_dedupers:
            wanted.append(dedupers_topic(self._names))  # followed by the deduper discovery
        return topics.ensure_internal_topics(
            self._admin(), wanted, self._timeout_s, visible_budget_s=self._wc.startup_timeout_s
        )

    def make_again_if_deleted(self) -> list[str]:
        """After a write failed on an unknown topic: make the flow's internal topics again if they are gone.

        Deleted under a running flow, staging failed every write, and the wrapper rewound for good (nothing made
        it again: only start-up did). Envelopes in it that no deduper had read are lost with it; the dedupers
        see them as a gap and ask for them again from the source.

        Returns:
            The topics made again.

        Raises:
            KafkaOperationError, KafkaException: the destination did not answer (transient; asked again at the
                next failure).
        """
        made = self.ensure()
        if made:
            _log.error(
                "internal topics %s were deleted under the running flow: making them again%s",
                ", ".join(made),
                ". Envelopes in staging that no deduper had read are asked for again from the source (a gap at the "
                "deduper)"
                if self._names.staging_topic in made
                else "",
            )
            if self._names.specs_topic in made:
                self._specs().republish()
        return made

    def deduper_watermarks(self, keys: list[PartitionKey]) -> dict[PartitionKey, int]:
        """Watermarks the deduper committed for keys (empty if it never ran)."""
        admin = self._admin()
        if self._names.state_topic not in topics.describe_topics(admin, [self._names.state_topic], self._timeout_s):
            return {}
        parts = {envelope.staging_partition(k.topic, k.partition, self._flow().staging_partitions) for k in keys}
        conf: dict[str, Any] = base_config(self._target, f"{self._wrapper_id}-state")
        records = read_compacted(conf, self._names.state_topic, parts, self._timeout_s * 2)
        out: dict[PartitionKey, int] = {}
        for recs in records.values():
            for key, st in decode_watermarks(recs, self._cluster_id()).items():
                spec = self._specs().published.get(key.topic)
                # A watermark of an earlier incarnation of the topic says nothing about this one.
                same_topic = spec is not None and (not st.topic_id or st.topic_id == spec.topic_id)
                if key in keys and st.watermark >= 0 and same_topic:
                    out[key] = st.watermark
        return out
