"""The wrapper's source partitions: where each starts, its chain and epoch, rebalances.

On assignment each partition starts at its committed offset (ignored if its
commit metadata names an earlier incarnation of the topic), else just after
the deduper's committed watermark (offsets expired or reset), else at the
flow's start position. Every (re)start is a new epoch of the partition, and
its chain restarts just before the first offset read, so the envelope chain
contract (docs/design.md) holds across restarts, rewinds and rebalances.

A failure while preparing an assignment inside the rebalance callback (the
source cluster not answering) is not fatal: the partitions are assigned
paused and ``resubscribe_due`` asks the loop to leave and rejoin the group
with backoff, which assigns them again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, OFFSET_INVALID, Consumer, KafkaException, TopicPartition
from ferryman.errors import FerrymanError
from ferryman.group_close import JoinTracker
from ferryman.kafka_errors import is_transient, retry_retriable
from ferryman.state import PartitionKey
from ferryman.v1 import envelope_pb2

from ferryman_wrapper._progress import ProgressTracker
from ferryman_wrapper._specs import SpecPublisher

_log = logging.getLogger(__name__)

#: Budget of reading committed source offsets on assignment (retries included).
COMMITTED_BUDGET_S = 30.0


class SourcePartitions:
    """Per assigned source partition: its source identity, chain, epoch and progress (loop thread only)."""

    def __init__(
        self,
        *,
        cluster_id: Callable[[], str],
        specs: Callable[[], SpecPublisher],
        start_position: str,
        wrapper_group: str,
        deduper_watermarks: Callable[[list[PartitionKey]], dict[PartitionKey, int]],
        hand_over: Callable[[list[PartitionKey]], None],
        paused: Callable[[], bool],
    ) -> None:
        self._cluster_id = cluster_id
        self._specs = specs
        self._start_position = start_position
        self._wrapper_group = wrapper_group
        self._deduper_watermarks = deduper_watermarks
        self._hand_over = hand_over
        self._paused = paused
        self.tracker = ProgressTracker()
        #: Last offset sent (the chain) and epoch of each assigned partition.
        self.chain: dict[PartitionKey, int] = {}
        self.epoch: dict[PartitionKey, int] = {}
        self.last_epoch = 0
        self.sources: dict[PartitionKey, envelope_pb2.SourcePartition] = {}
        self.staging_keys: dict[PartitionKey, bytes] = {}
        self.callback_failure: BaseException | None = None
        self.resubscribe_due = ""
        """Why the loop must leave and rejoin the group ("" when it need not)."""
        self.joins = JoinTracker()
        """Whether an assign callback is on its way (``ferryman.group_close``): subscribing calls it too."""
        self.rejoin_after_first_assignment = False
        """Set for a new static member: its first assignment is followed by a rejoin (see ``on_assign``)."""

    def restart(self, key: PartitionKey, next_offset: int, logical: int | None = None) -> None:
        """(Re)start reading key at next_offset (or a logical offset) under a new epoch.

        The chain restarts at next_offset - 1: everything before next_offset was
        acknowledged (we commit last offset + 1), or, for a logical start,
        at -1 (the start of replication for the partition).
        """
        self.last_epoch += 1
        self.epoch[key] = self.last_epoch
        self.chain[key] = next_offset - 1 if logical is None else -1
        self.tracker.start(key, next_offset, logical)

    def drop(self, keys: list[PartitionKey]) -> None:
        """Forget partitions (revoked or lost)."""
        for key in keys:
            self.tracker.forget(key)
            self.chain.pop(key, None)
            self.epoch.pop(key, None)

    def drop_all(self) -> None:
        """Forget every partition (the consumer is being replaced)."""
        self.drop(list(self.chain))

    # ------------------------------------------------------------ callbacks
    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Rebalance callback: start the new partitions (callbacks must not raise).

        A new consumer with a ``group.instance.id`` (at start, or replacing one given up) takes over the
        stored assignment of the member it succeeds without a rebalance. If that member stopped halfway
        through a cooperative rebalance (told to revoke, not yet rejoined), the partitions it was to revoke
        belong to nobody, and nothing would ever start another rebalance (a chaos run: 5 minutes of silence
        on half the partitions; for ever in a probe). So its first assignment is followed by one rejoin,
        which assigns them.
        """
        self.joins.assigned()
        if self.rejoin_after_first_assignment:
            self.rejoin_after_first_assignment = False
            self.resubscribe_due = "a new static member rejoins once so that no partition is left without an owner"
        if not partitions:
            return
        try:
            consumer.incremental_assign(self._start_positions(consumer, partitions))
        except BaseException as exc:
            if isinstance(exc, (KafkaException, FerrymanError)) and is_transient(exc):
                _log.warning(
                    "could not prepare %d assigned source partitions (%s): taking them paused and rejoining the group",
                    len(partitions),
                    exc,
                )
                self.resubscribe_due = "rejoining to start the partitions that could not be prepared"
                consumer.incremental_assign(partitions)
                consumer.pause(partitions)
                return
            _log.exception("partition assignment failed")
            self.callback_failure = exc
            return
        if self._paused():
            consumer.pause(partitions)

    def _start_positions(self, consumer: Consumer, partitions: list[TopicPartition]) -> list[TopicPartition]:
        specs = self._specs()
        # Describe the assigned topics afresh: a topic deleted and re-created
        # since we last looked has a new id, and envelopes must carry it.
        specs.refresh(sorted({tp.topic for tp in partitions}))
        committed = retry_retriable(
            lambda: consumer.committed(partitions, timeout=COMMITTED_BUDGET_S / 2),
            what="reading committed source offsets",
            budget_s=COMMITTED_BUDGET_S,
        )
        for tp in committed:
            topic_id = specs.published[tp.topic].topic_id
            if tp.offset >= 0 and tp.metadata and tp.metadata != topic_id.hex():
                _log.error(
                    "source topic %s was re-created (topic id changed): its committed offset %d in partition %d "
                    "belongs to the old topic and is ignored",
                    tp.topic,
                    tp.offset,
                    tp.partition,
                )
                tp.offset = OFFSET_INVALID
        missing = [PartitionKey(tp.topic, tp.partition) for tp in committed if tp.offset < 0]
        watermarks = self._deduper_watermarks(missing) if missing else {}
        start: list[TopicPartition] = []
        for tp in committed:
            key = PartitionKey(tp.topic, tp.partition)
            spec = specs.published[tp.topic]
            self.sources[key] = envelope_pb2.SourcePartition(
                cluster_id=self._cluster_id(), topic=tp.topic, topic_id=spec.topic_id, partition=tp.partition
            )
            self.staging_keys[key] = f"{tp.topic}/{tp.partition}".encode()
            if tp.offset >= 0:
                nxt = tp.offset
            elif key in watermarks:
                nxt = watermarks[key] + 1
                _log.warning(
                    "source partition %s has no committed offset in group %s but the deduper has replicated it up "
                    "to offset %d: resuming at %d (offsets were reset or expired)",
                    key,
                    self._wrapper_group,
                    watermarks[key],
                    nxt,
                )
            else:
                nxt = -1  # never replicated: the flow's start position
            if nxt >= 0:
                self.restart(key, nxt)
                start.append(TopicPartition(tp.topic, tp.partition, nxt))
            else:
                pos = OFFSET_BEGINNING if self._start_position == "earliest" else OFFSET_END
                self.restart(key, 0, pos)
                start.append(TopicPartition(tp.topic, tp.partition, pos))
                _log.info("source partition %s is new to the flow: starting at %s", key, self._start_position)
        return start

    def on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Rebalance callback: hand over cleanly (everything sent acknowledged and committed)."""
        self.joins.revoked()
        keys = [PartitionKey(tp.topic, tp.partition) for tp in partitions]
        try:
            self._hand_over(keys)
        except (KafkaException, FerrymanError) as exc:
            _log.warning("commit on revoke failed (%s): the next owner re-sends from the last commit", exc)
        self.drop(keys)

    def on_lost(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Rebalance callback: the session expired; the next owner (maybe us again) re-sends."""
        self.joins.revoked()
        _log.warning("lost %d source partitions (session expired); the next owner re-sends", len(partitions))
        self.drop([PartitionKey(tp.topic, tp.partition) for tp in partitions])
