"""Destination topics: created and grown from the wrapper's topic specs.

The deduper never talks to the source cluster. The wrapper publishes a
TopicSpec (partition count, topic id, replicable configs) of every source topic
to the flow's compacted spec topic before it sends any envelope of it; this
module turns specs into destination topics with the same partition count and
configs, named by the flow's naming policy, and grows them when the source
grows.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from ferryman import topics
from ferryman.config import FlowConfig
from ferryman.errors import ConfigError, FerrymanError, KafkaOperationError
from ferryman.naming import NamingPolicy
from ferryman.state import read_compacted
from ferryman.v1 import envelope_pb2, state_pb2

_log = logging.getLogger(__name__)


class SpecMissingError(FerrymanError):
    """An envelope arrived for a source topic whose spec was never published."""


class DestinationTopicError(ConfigError):
    """A destination topic this flow did not make is not fit for it (too few partitions, someone else's records)."""


#: Budget for looking for a committed record in a destination partition this flow never wrote.
_FOREIGN_CHECK_BUDGET_S = 10.0


@dataclass
class _Ready:
    name: str
    partitions: int


class DestinationTopics:
    """Resolves source partitions to destination topics that exist and are big enough."""

    def __init__(
        self,
        *,
        admin: AdminClient,
        consumer_config: dict[str, Any],
        specs_topic: str,
        naming: NamingPolicy,
        replicate_configs: bool,
        timeout_s: float,
        flow_wrote: Callable[[str], bool] = lambda _name: False,
    ) -> None:
        """Create the resolver.

        flow_wrote tells whether the flow's committed state names a destination topic (the flow
        wrote it before): only such a topic is grown when found too small at first sight.
        """
        self._admin = admin
        self._consumer_config = consumer_config
        self._specs_topic = specs_topic
        self._naming = naming
        self._replicate_configs = replicate_configs
        self._timeout_s = timeout_s
        self._flow_wrote = flow_wrote
        #: Replication factor and configs left out of created topics (live flow settings, `apply_flow`).
        self._replication_factor = -1
        self._configs_exclude: tuple[re.Pattern[str], ...] = ()
        self._specs: dict[tuple[str, str], state_pb2.TopicSpec] = {}
        self._ready: dict[tuple[str, str], _Ready] = {}
        self.producer: Producer | None = None
        self._tail: Consumer | None = None
        self._checker: Consumer | None = None

    def apply_flow(self, flow: FlowConfig) -> None:
        """Take the flow's live settings: renames, and how topics created from now on are made.

        A rename applies to source topics not resolved yet; topics already written keep their name.
        """
        self._naming = NamingPolicy(flow.source, flow.naming)
        self._replication_factor = flow.replication_factor
        self._configs_exclude = tuple(re.compile(p) for p in flow.topic_configs_exclude)

    def name_of(self, topic: str) -> str:
        """Destination topic name of a source topic."""
        return self._naming.destination_topic(topic)

    def resolve(self, source: envelope_pb2.SourcePartition) -> str:
        """Destination topic for source, created or grown first if needed."""
        ident = (source.cluster_id, source.topic)
        ready = self._ready.get(ident)
        if ready is not None and source.partition < ready.partitions:
            return ready.name
        spec = self._specs.get(ident)
        if spec is None or source.partition >= spec.partitions:
            self.load_specs()
            spec = self._specs.get(ident)
        if spec is None:
            raise SpecMissingError(
                f"no topic spec for source topic {source.topic} (cluster {source.cluster_id}) in "
                f"{self._specs_topic}; the wrapper publishes it before any envelope"
            )
        return self._materialize(spec, min_partitions=source.partition + 1).name

    def load_specs(self) -> None:
        """Re-read the spec topic."""
        records = read_compacted(self._consumer_config, self._specs_topic, [0], self._timeout_s)
        for value in records[0].values():
            if value is None:
                continue
            spec = state_pb2.TopicSpec()
            spec.ParseFromString(value)
            self._specs[(spec.cluster_id, spec.topic)] = spec

    def add_spec(self, spec: state_pb2.TopicSpec) -> None:
        """Take a spec received over the control link; create or grow its topic now."""
        ident = (spec.cluster_id, spec.topic)
        self._specs[ident] = spec
        ready = self._ready.get(ident)
        if ready is None or ready.partitions < spec.partitions:
            self._materialize(spec, min_partitions=spec.partitions)

    def _tail_specs(self) -> None:
        """Take spec records published since the last call, without blocking.

        A consumer kept assigned to the spec topic makes this a local queue
        read; re-reading the topic each time would stall the deduper loop for a
        consumer start-up every sync.
        """
        if self._tail is None:
            conf = dict(self._consumer_config)
            conf.update(
                {"group.id": "ferryman-specs", "enable.auto.commit": False, "isolation.level": "read_committed"}
            )
            self._tail = Consumer(conf)
            self._tail.assign([TopicPartition(self._specs_topic, 0, OFFSET_BEGINNING)])
        for msg in self._tail.consume(num_messages=1000, timeout=0):
            value = msg.value()
            if msg.error() is not None or value is None:
                continue
            spec = state_pb2.TopicSpec()
            spec.ParseFromString(value)
            self._specs[(spec.cluster_id, spec.topic)] = spec

    def close(self) -> None:
        """Release the spec-tailing and checking consumers."""
        for consumer in (self._tail, self._checker):
            if consumer is not None:
                consumer.close()
        self._tail = self._checker = None

    def sync_all(self) -> None:
        """Create or grow the destination topic of every known spec (partition growth)."""
        self._tail_specs()
        for ident, spec in list(self._specs.items()):
            ready = self._ready.get(ident)
            if ready is None or ready.partitions < spec.partitions:
                self._materialize(spec, min_partitions=spec.partitions)

    def _materialize(self, spec: state_pb2.TopicSpec, *, min_partitions: int) -> _Ready:
        name = self.name_of(spec.topic)
        wanted = max(spec.partitions, min_partitions)
        existing = topics.describe_topics(self._admin, [name], self._timeout_s).get(name)
        if existing is None:
            configs = {
                k: v
                for k, v in (spec.configs.items() if self._replicate_configs else ())
                if not any(p.fullmatch(k) for p in self._configs_exclude)
            }
            topics.create_topic(
                self._admin, name, wanted, configs, self._timeout_s, replication_factor=self._replication_factor
            )
            existing = topics.await_topic(self._admin, name, self._timeout_s)
            if existing is None:
                # Transient: a broker creates every partition's log before it describes the topic
                # (over 30 s for 256 partitions on a loaded machine here). The next resolve or sync
                # finds the topic, empty, and takes it.
                raise KafkaOperationError(
                    f"creating destination topic {name}",
                    TimeoutError(f"created, but not in the cluster's metadata after {self._timeout_s:.0f} s"),
                )
        elif (spec.cluster_id, spec.topic) not in self._ready:
            self._check_existing(name, existing.partitions, spec)
        if existing.partitions < wanted:
            topics.grow_partitions(self._admin, name, wanted, self._timeout_s)
            topics.await_topic(self._admin, name, self._timeout_s, min_partitions=wanted)
        else:
            wanted = existing.partitions
        self._await_metadata(name, wanted)
        ready = _Ready(name, wanted)
        self._ready[(spec.cluster_id, spec.topic)] = ready
        return ready

    def _check_existing(self, name: str, partitions: int, spec: state_pb2.TopicSpec) -> None:
        """A destination topic that exists at first sight must be the flow's, or empty and big enough.

        Raises:
            DestinationTopicError: the flow never wrote it, and it has fewer partitions than the
                source, or committed records in any partition (someone else writes it).
        """
        if self._flow_wrote(name):
            return  # ours: grown below if the source grew since
        if partitions < spec.partitions:
            self._too_small(name, partitions, spec)
        for partition in range(partitions):
            self._check_unwritten(name, partition, spec.topic)

    @staticmethod
    def _too_small(name: str, partitions: int, spec: state_pb2.TopicSpec) -> None:
        raise DestinationTopicError(
            f"destination topic {name} has {partitions} partitions, fewer than the {spec.partitions} of source "
            f"topic {spec.topic} (records keep their partition number), and this flow never wrote it. Grow it to "
            f"{spec.partitions} partitions, delete it to let Ferryman create it, or map {spec.topic} to another "
            f"name (flows[].naming)"
        )

    def _check_unwritten(self, name: str, partition: int, source: str) -> None:
        """Raise DestinationTopicError if destination partition name-partition holds a committed record.

        For a topic the flow's state never names: whatever is there was written by someone else
        (aborted records of an earlier attempt of ours are skipped by the read_committed read). An
        empty partition costs one offsets request.
        """
        if self._checker is None:  # one for the process: a new partition costs one offsets request
            conf = dict(self._consumer_config)
            conf.update(
                {
                    "group.id": "ferryman-destination-check",
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                    "enable.partition.eof": True,
                }
            )
            self._checker = Consumer(conf)
        consumer = self._checker
        low, high = consumer.get_watermark_offsets(TopicPartition(name, partition), timeout=self._timeout_s)
        if high <= low:
            return
        try:
            consumer.assign([TopicPartition(name, partition, low)])
            deadline = time.monotonic() + _FOREIGN_CHECK_BUDGET_S
            while time.monotonic() < deadline:
                for msg in consumer.consume(num_messages=100, timeout=0.5):
                    err = msg.error()
                    if err is None:
                        raise DestinationTopicError(
                            f"destination topic {name} partition {partition} already holds records (offsets "
                            f"{low}..{high - 1}) that this flow did not write (its state never names the topic, "
                            f"source topic {source}). Another producer or flow writes this topic; map "
                            f"{source} to another name (flows[].naming) or empty the topic"
                        )
                    if err.code() == KafkaError._PARTITION_EOF:
                        return
            _log.warning("could not finish checking %s-%d for foreign records in time; going on", name, partition)
        finally:
            consumer.unassign()

    def _await_metadata(self, name: str, partitions: int) -> None:
        """Wait until the producer's metadata shows the partitions we will write to.

        Producing to a partition the producer does not know yet fails the
        delivery (and so the transaction); waiting here costs one metadata
        round trip per new topic or growth.
        """
        if self.producer is None:
            return
        deadline = time.monotonic() + self._timeout_s
        while time.monotonic() < deadline:
            md = self.producer.list_topics(topic=name, timeout=self._timeout_s)
            t = md.topics.get(name)
            if t is not None and t.error is None and len(t.partitions) >= partitions:
                return
            time.sleep(0.1)  # metadata propagation after CreateTopics: poll with a short interval
        raise KafkaOperationError(  # transient, as a slow creation above
            f"waiting for destination topic {name}",
            TimeoutError(f"{partitions} partitions not in the producer's metadata after {self._timeout_s:.0f} s"),
        )
