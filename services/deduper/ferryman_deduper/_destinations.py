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
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import NewTopic
from ferryman import topics
from ferryman.config import FlowConfig
from ferryman.errors import ConfigError, FerrymanError, KafkaOperationError
from ferryman.naming import NamingPolicy
from ferryman.renewing_admin import RenewingAdmin
from ferryman.state import read_compacted
from ferryman.v1 import envelope_pb2, state_pb2

_log = logging.getLogger(__name__)


class SpecMissingError(FerrymanError):
    """An envelope arrived for a source topic whose spec was never published."""


class DestinationTopicError(ConfigError):
    """A destination topic this flow did not make is not fit for it (too few partitions, someone else's records)."""


#: Budget for looking for a committed record in a destination partition this flow never wrote.
_FOREIGN_CHECK_BUDGET_S = 10.0
#: Topics named in one error or log line; the rest are counted (a batch may hold thousands).
_NAMED_TOPICS = 5

_Ident = tuple[str, str]
"""A source topic: (cluster id, topic name)."""


@dataclass
class _Ready:
    name: str
    partitions: int
    topic_id: bytes = b""
    """The incarnation made ready (DescribeTopics' id); a topic deleted or re-created since has another or none."""


@dataclass(frozen=True)
class _Want:
    """A destination topic a source topic needs, with at least ``partitions`` partitions."""

    ident: _Ident
    spec: state_pb2.TopicSpec
    name: str
    partitions: int


#: One CreateTopics or CreatePartitions request's budget, shorter than the calls' ``timeout_s``: the
#: controller answers once the topics are in its metadata (0.04-0.08 s here for 4 to 1,000 partitions in
#: one request), so a long silence means a request lost with a broker handle librdkafka gave up on. A CI run
#: (2026-11-28) sent a CreateTopics as the destination broker thawed from a 9 s freeze: no answer for
#: 30 s, then the next attempt was answered at once. A create that did go through before its timeout is
#: found by the next attempt (TOPIC_ALREADY_EXISTS, taken as ours).
REQUEST_TIMEOUT_S = 10.0


class DestinationTopics:
    """Resolves source partitions to destination topics that exist and are big enough.

    Topics are made in batches: whatever one call needs (a record's topic on the data path, every spec the
    control link brought in one tick, every spec at a periodic sync) costs one describe, one CreateTopics,
    one CreatePartitions and one wait for the producer's metadata for all of its topics, not a round of
    requests per topic. Per topic that was 35-130 ms of the deduper's loop: a minute at the start of a
    flow of a thousand topics.
    """

    def __init__(
        self,
        *,
        admin: RenewingAdmin,
        consumer_config: dict[str, Any],
        specs_topic: str,
        naming: NamingPolicy,
        replicate_configs: bool,
        timeout_s: float,
        flow_wrote: Callable[[Collection[str]], AbstractSet[str]] = lambda _names: frozenset(),
    ) -> None:
        """Create the resolver.

        flow_wrote tells which of some destination topics the flow's committed state names (the flow
        wrote them before): only such a topic is grown when found too small at first sight. It must
        read the state once every transaction begun before the call has ended there (``settled_ends``).
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
        self._specs: dict[_Ident, state_pb2.TopicSpec] = {}
        self._ready: dict[_Ident, _Ready] = {}
        #: Topics forgotten by `forget_vanished` and not made ready again yet, with the id they had.
        self._vanished: dict[str, bytes] = {}
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
        return self._materialize_all([self._want(spec, source.partition + 1)])[ident].name

    def load_specs(self) -> None:
        """Re-read the spec topic."""
        records = read_compacted(self._consumer_config, self._specs_topic, [0], self._timeout_s)
        for value in records[0].values():
            if value is None:
                continue
            spec = state_pb2.TopicSpec()
            spec.ParseFromString(value)
            self._specs[(spec.cluster_id, spec.topic)] = spec

    def add_specs(self, specs: Iterable[state_pb2.TopicSpec]) -> None:
        """Take specs received over the control link; create or grow their topics now, in one batch.

        The specs are kept before the cluster is asked anything: when that fails, the periodic sync (or
        the first record's resolve) makes their topics later. Of two specs of one source topic, the
        later wins.

        Raises:
            DestinationTopicError: a destination topic this flow did not make is not fit for it.
            KafkaOperationError: some topics did not show in time (transient; the others are ready).
            KafkaException: a request failed.
        """
        latest: dict[_Ident, state_pb2.TopicSpec] = {}
        for spec in specs:
            latest[(spec.cluster_id, spec.topic)] = spec
        self._specs.update(latest)
        self._materialize_all(self._needing_work(latest.values()))

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
        """Create or grow the destination topic of every known spec (partition growth), in one batch.

        Raises:
            As ``add_specs``.
        """
        self._tail_specs()
        self._materialize_all(self._needing_work(self._specs.values()))

    def _want(self, spec: state_pb2.TopicSpec, min_partitions: int) -> _Want:
        return _Want(
            (spec.cluster_id, spec.topic), spec, self.name_of(spec.topic), max(spec.partitions, min_partitions)
        )

    def _needing_work(self, specs: Iterable[state_pb2.TopicSpec]) -> list[_Want]:
        """The specs whose destination topic is not ready, or not as big as the source now."""
        wants = []
        for spec in specs:
            ready = self._ready.get((spec.cluster_id, spec.topic))
            if ready is None or ready.partitions < spec.partitions:
                wants.append(self._want(spec, spec.partitions))
        return wants

    def _materialize_all(self, wants: Sequence[_Want]) -> dict[_Ident, _Ready]:
        """Make the destination topics of wants exist, fit and big enough, with a few requests for them all.

        In order: one describe of every topic; the checks of those that exist at first sight (before
        anything is created, so a misfit stops the flow without leaving new topics behind); one
        CreateTopics for the missing ones and one wait until they are described; one CreatePartitions for
        those to grow; one wait until the producer's metadata shows every partition. The topics that got
        through are recorded ready before an error is raised for the others: one slow topic does not hold
        back the rest of its batch.

        Two source topics named alike at the destination (the same topic of two cluster ids) share a
        topic, made with the larger partition count and the configs of the first.

        Returns:
            The ready destination topic of each want's source topic.

        Raises:
            DestinationTopicError: a topic that exists at first sight is not fit for the flow
                (``_check_existing``); nothing was created or grown.
            KafkaOperationError: created or grown topics did not show in time (transient: the next sync
                or resolve takes them).
            KafkaException: a request failed.
        """
        if not wants:
            return {}
        started = time.monotonic()
        partitions: dict[str, int] = {}
        for want in wants:
            partitions[want.name] = max(partitions.get(want.name, 0), want.partitions)
        existing = topics.describe_topics(self._admin.client, partitions, self._timeout_s)
        first_sight = [w for w in wants if w.name in existing and w.ident not in self._ready]
        self._check_existing([(w.name, existing[w.name].partitions, w.spec) for w in first_sight])
        missing: dict[str, _Want] = {}
        for want in wants:
            if want.name not in existing:
                missing.setdefault(want.name, want)
        unseen: list[str] = []
        self._say_vanished([w for w in wants if w.name in self._vanished], missing.keys(), existing)
        if missing:
            topics.create_topics(
                self._admin.client,
                [self._new_topic(w.name, partitions[w.name], w.spec) for w in missing.values()],
                min(self._timeout_s, REQUEST_TIMEOUT_S),
            )
            # Created by another deduper of the flow first (already there): taken as it is, as ours.
            found = topics.await_topics(self._admin.client, dict.fromkeys(missing, 1), self._timeout_s)
            # Transient: a broker creates every partition's log before it describes the topic (over 30 s
            # for 256 partitions on a loaded machine here). The next resolve or sync finds the topic,
            # empty, and takes it.
            unseen = [name for name in missing if name not in found]
            existing.update(found)
        grow = {name: n for name, n in partitions.items() if name in existing and existing[name].partitions < n}
        if grow:
            topics.grow_topics(self._admin.client, grow, min(self._timeout_s, REQUEST_TIMEOUT_S))
            # What did not show here does not show in the producer's metadata below either: reported there.
            topics.await_topics(self._admin.client, grow, self._timeout_s)
        final = {name: max(n, existing[name].partitions) for name, n in partitions.items() if name in existing}
        shown = self._await_metadata(final)
        ready: dict[_Ident, _Ready] = {}
        for want in wants:
            if want.name in shown:
                ready[want.ident] = self._ready[want.ident] = _Ready(
                    want.name, final[want.name], existing[want.name].topic_id
                )
        _log.info(
            "destination topics of %d source topics ready in %.2f s: %d created, %d grown, %d found and checked%s",
            len(ready),
            time.monotonic() - started,
            len(missing) - len(unseen),
            len(grow),
            len(first_sight),
            f"; {len(wants) - len(ready)} not yet" if len(ready) < len(wants) else "",
        )
        if unseen:
            raise KafkaOperationError(
                f"creating destination topics {_some(unseen)}",
                TimeoutError(f"created, but not in the cluster's metadata after {self._timeout_s:.0f} s"),
            )
        lagging = sorted(final.keys() - shown)
        if lagging:
            raise KafkaOperationError(
                f"waiting for destination topics {_some(lagging)}",
                TimeoutError(f"partitions not in the producer's metadata after {self._timeout_s:.0f} s"),
            )
        return ready

    def ready_names(self) -> list[str]:
        """The destination topics made ready so far."""
        return sorted({ready.name for ready in self._ready.values()})

    def forget_vanished(self, found: Mapping[str, topics.TopicInfo | None]) -> list[str]:
        """Forget the ready topics found gone from the cluster, or re-created, since they were made ready.

        A destination topic deleted under a running flow fails every transaction that writes it (the
        producer waits for a partition that no longer exists, then times out), and with them every other
        topic's records: forgotten, it is made again by the next record of its source topic (``resolve``).
        The deduper describes every ready topic after a failed transaction (``TopicWatch``); found holds
        what that describe answered, None for a topic the cluster does not know. Topics it has no answer
        for are kept.

        Returns:
            The names forgotten.
        """
        gone = {
            ident: ready
            for ident, ready in self._ready.items()
            if ready.name in found
            and ((info := found[ready.name]) is None or (ready.topic_id and info.topic_id != ready.topic_id))
        }
        for ident in gone:
            del self._ready[ident]
        self._vanished.update({ready.name: ready.topic_id for ready in gone.values()})
        return sorted({ready.name for ready in gone.values()})

    def _say_vanished(
        self, wants: Sequence[_Want], missing: Collection[str], existing: Mapping[str, topics.TopicInfo]
    ) -> None:
        """Name the topics forgotten by `forget_vanished` as they are made ready again: deleted, or re-created.

        A topic found again as it was (a broker that did not know it yet answered the describe) is not news.
        """
        for name in sorted({w.name for w in wants}):
            was = self._vanished.pop(name)
            if name not in missing and existing[name].topic_id == was:
                _log.info("destination topic %s is there after all (same topic id)", name)
                continue
            source = next(w.spec.topic for w in wants if w.name == name)
            _log.error(
                "destination topic %s was %s while flow records were written to it: %s. The records of source "
                "topic %s copied into it before are not at the destination any more (audits report them "
                "missing); replication goes on from where the flow was, exactly once",
                name,
                "deleted" if name in missing else "deleted and re-created by someone else",
                "creating it again" if name in missing else "writing the new topic",
                source,
            )

    def _new_topic(self, name: str, partitions: int, spec: state_pb2.TopicSpec) -> NewTopic:
        """A destination topic as created: the source's replicable configs, less the flow's exclusions."""
        configs = {
            k: v
            for k, v in (spec.configs.items() if self._replicate_configs else ())
            if not any(p.fullmatch(k) for p in self._configs_exclude)
        }
        return NewTopic(name, num_partitions=partitions, replication_factor=self._replication_factor, config=configs)

    def _check_existing(self, found: Sequence[tuple[str, int, state_pb2.TopicSpec]]) -> None:
        """Destination topics that exist at first sight must be the flow's, or empty and big enough.

        found holds each topic's name, partition count and source spec. One pass of ListOffsets
        requests finds the partitions that hold anything; one read of the flow's state tells which
        topics the flow wrote; only the others' non-empty partitions are read.

        The destinations are asked first and the state after, never the other way round: another
        deduper of the flow (a rebalance, scale-out) may commit a transaction into one of these topics
        at any moment, and its records and its state become visible together only to a reader that
        reads the records first and the state once it has settled (``flow_wrote``). State first, a
        commit between the two reads made the flow's own records look foreign: a deduper exited with
        a configuration error in a scale-out run (2026-11-30).

        Raises:
            DestinationTopicError: the flow never wrote one, and it has fewer partitions than the
                source, or committed records in any partition (someone else writes it).
        """
        if not found:
            return
        ranges = topics.committed_ranges(
            self._admin.client, {name: partitions for name, partitions, _ in found}, self._timeout_s
        )
        ours = self._flow_wrote({name for name, _, _ in found})  # grown by the caller if the source grew since
        source_of = {name: spec.topic for name, _, spec in found if name not in ours}
        for name, partitions, spec in found:
            if name in source_of and partitions < spec.partitions:
                self._too_small(name, partitions, spec)
        for (name, partition), (low, high) in sorted(ranges.items()):
            if name in source_of and high > low:
                self._check_unwritten(name, partition, low, high, source_of[name])

    @staticmethod
    def _too_small(name: str, partitions: int, spec: state_pb2.TopicSpec) -> None:
        raise DestinationTopicError(
            f"destination topic {name} has {partitions} partitions, fewer than the {spec.partitions} of source "
            f"topic {spec.topic} (records keep their partition number), and this flow never wrote it. Grow it to "
            f"{spec.partitions} partitions, delete it to let Ferryman create it, or map {spec.topic} to another "
            f"name (flows[].naming)"
        )

    def _check_unwritten(self, name: str, partition: int, low: int, high: int, source: str) -> None:
        """Raise DestinationTopicError if destination partition name-partition holds a committed record.

        For a topic the flow's state never names, whose partition is not empty (offsets low..high-1,
        high its last stable offset): whatever committed record is there was written by someone else
        (aborted records of an earlier attempt of ours are skipped by the read_committed read).
        """
        if self._checker is None:  # one for the process: a partition costs an assignment, not a consumer
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

    def _await_metadata(self, partitions: Mapping[str, int]) -> set[str]:
        """The topics of which the producer's metadata shows every partition, waiting for all up to the timeout.

        Producing to a partition the producer does not know yet fails the delivery (and so the
        transaction). One request for the whole cluster's metadata answers for every topic of a batch
        (a request per topic was the cost of a batch); it is repeated until all show or the time is up.
        """
        if self.producer is None or not partitions:
            return set(partitions)
        deadline = time.monotonic() + self._timeout_s
        while True:
            md = self.producer.list_topics(timeout=self._timeout_s)
            shown = set()
            for name, n in partitions.items():
                t = md.topics.get(name)
                if t is not None and t.error is None and len(t.partitions) >= n:
                    shown.add(name)
            if len(shown) == len(partitions) or time.monotonic() >= deadline:
                return shown
            time.sleep(0.1)  # metadata propagation after CreateTopics: poll with a short interval


def _some(names: Sequence[str]) -> str:
    """Names for a message: the first few, and how many more."""
    more = len(names) - _NAMED_TOPICS
    return ", ".join(names[:_NAMED_TOPICS]) + (f" and {more} more" if more > 0 else "")
