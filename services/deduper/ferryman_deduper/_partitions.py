"""The deduper's staging partitions: the consumer, rebalances, restore and rewind.

Owns the staging consumer and which staging partitions this deduper writes
for, and the committed state restored for them:

* **assign**: new partitions are taken paused; their state is restored from
  the loop (committed staging offsets first, then, once the transactions open
  on the state partition have ended, the state partition to its last stable
  offset: any transaction that committed offsets for the partition has
  finished, so the state read is exactly the committed state), then they are
  resumed;
* **revoke**: the open transaction is committed first (cooperative
  rebalancing), or, if the partitions were lost, recovered from the loop;
* **rewind**: after a failed transaction, owned partitions go back to their
  committed offsets and state;
* **hold** (``_holds``): a partition whose record the destination refuses is
  paused at its committed offset, and a probe seeks it back there and resumes it;
* **a fenced consumer** (``FENCED_INSTANCE_ID``): our static member is fenced
  by our own rejoin after its session timed out, or after a broker restart by
  its own retried JoinGroup. A fence right after our own session timeout is
  ours; of the others, the first in ``FenceWindow.WINDOW_S`` rebuilds the
  consumer and a second stops us as fenced. A live twin with our instance id
  would also have fenced our transactional producer (same ``transactional.id``),
  which stops us at our next commit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, TopicPartition
from ferryman import envelope, topics
from ferryman.errors import FencedError, KafkaOperationError
from ferryman.group_close import JoinTracker, close_group_consumer
from ferryman.health import ClusterHealth
from ferryman.kafka_errors import FenceWindow, is_fatal_client_error, is_membership_fence, retry_retriable
from ferryman.state import PartitionKey, read_compacted
from ferryman.v1 import control_pb2, envelope_pb2, state_pb2
from ferryman.watchdog import park

from ferryman_deduper._decide import PartitionState
from ferryman_deduper._gaps import GapTracker
from ferryman_deduper._holds import RefusalHolds
from ferryman_deduper._timings import SlowSteps

_log = logging.getLogger(__name__)


def staging_offsets_metadata(staging_id: bytes | None) -> str:
    """The metadata of committed staging offsets: the id of the staging topic read ("" when unknown)."""
    return f"staging-topic-id={staging_id.hex()}" if staging_id else ""


#: Budget of the reads a restore makes (committed offsets, the state partitions).
RESTORE_BUDGET_S = 30.0
#: A restore slower than this names the step that took the time (WARNING): each is a call to the cluster.
RESTORE_SLOW_S = 5.0
#: A consumer's close leaves the group (or, static, just stops); longer means it is stuck.
CLOSE_DEADLINE_S = 15.0


class StagingPartitions:
    """Staging partitions owned by this deduper and their committed state (loop thread only)."""

    def __init__(
        self,
        *,
        make_consumer: Callable[[], Consumer],
        staging_topic: str,
        state_topic: str,
        staging_partitions: int,
        instance_id: str,
        restore_config: Callable[[], dict[str, Any]],
        check_state: Callable[[], None],
        commit_for_revoke: Callable[[bool], None],
        health: ClusterHealth,
        gaps: GapTracker,
        staging_id: Callable[[], bytes | None] = lambda: None,
    ) -> None:
        """check_state: called before and after each restore's read of the state topic; raises unless the original.

        gaps: the open gaps, which follow ownership: a restore reopens those its state names, a revoke drops them.
        staging_id: the id of the staging topic read now, which committed offsets name (None: unknown yet).
        """
        self._gaps = gaps
        self._staging_id = staging_id
        self._make_consumer = make_consumer
        self._staging_topic = staging_topic
        self._state_topic = state_topic
        self._n = staging_partitions
        self._instance_id = instance_id
        self._restore_config = restore_config
        self._check_state = check_state
        self._commit_for_revoke = commit_for_revoke
        self._health = health
        self.consumer: Consumer
        self.owned: set[int] = set()
        self.restoring: set[int] = set()
        self.committed: dict[PartitionKey, PartitionState] = {}
        self.cluster_ids: dict[PartitionKey, str] = {}
        self.dest_topics: dict[PartitionKey, str] = {}
        self.last_dest_offset: dict[PartitionKey, int] = {}
        self._consumer_fatal: KafkaError | None = None
        self.fences = FenceWindow()
        """Tells our own consumer's fences from a twin's (``make_consumer`` gives it each new consumer's log)."""
        self.callback_failure: BaseException | None = None
        self.consumer_rebuilds = 0
        self._first_assignment = False
        self._joins = JoinTracker()
        self.rejoin_due = False
        """The loop must rejoin the group (``rejoin``): set by a new consumer's first assignment.

        A new consumer with our ``group.instance.id`` (a restart, or one replacing a fenced one) takes over the
        stored assignment of the member it succeeds without a rebalance. If that member stopped halfway
        through a cooperative rebalance (told to revoke, not yet rejoined: a SIGTERM 1.4 s after a peer
        joined, in a chaos run), the partitions it was to revoke belong to nobody and nothing starts another
        rebalance: they would stall for good. One rejoin after the first assignment assigns them."""
        #: Next staging offset expected per owned partition (from its committed position): a record beyond it
        #: means the consumer skipped ahead, which note_position checks against the log start.
        self.expected: dict[int, int] = {}
        self.staging_losses: list[control_pb2.StagingLoss] = []
        """Staging ranges deleted before this deduper read them, since start (status)."""
        #: Staging partitions whose restores start at the log start, not at the group's committed offset:
        #: the staging topic was made again, and those offsets are the old topic's (``read_anew``), until a
        #: commit of offsets read from the new topic (``positions_committed``).
        self._anew: set[int] = set()
        self.holds = RefusalHolds()
        """Owned partitions held at a record the destination refuses (dropped with the partitions)."""

    # --------------------------------------------------------------- consumer
    def start(self) -> None:
        """Build the consumer and subscribe to staging."""
        self._consumer_fatal = None
        self.consumer = self._make_consumer()
        self._first_assignment = True
        self._subscribe()

    def _subscribe(self) -> None:
        self._joins.subscribed()
        self.consumer.subscribe(
            [self._staging_topic], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )

    def rejoin(self) -> None:
        """Leave the group and join it again (a rebalance follows: every partition is revoked, then assigned)."""
        _log.info("rejoining the staging consumer group once, so that no partition is left without an owner")
        self.rejoin_due = False
        self.consumer.unsubscribe()
        self._subscribe()

    def on_consumer_error(self, err: KafkaError) -> None:
        """error_cb of the staging consumer (a fatal error comes as code _FATAL, the cause in its text)."""
        if is_fatal_client_error(err):
            self._consumer_fatal = err
            _log.error("staging consumer: %s", err)
        else:
            self._health.client_error(err, "staging consumer")

    def note_errors(self, msgs: list[Message]) -> None:
        """Hand a consumed batch's error events to on_consumer_error, before the loop reads or drops the batch.

        A group consumer's fatal error (a static member fenced) comes once, as an event
        of a consume() batch: librdkafka does not give it to error_cb. The loop drops
        a batch when a rebalance callback of the same consume() failed, or while it
        recovers; an event dropped with it would leave the dead consumer in place for
        good (a long chaos run: a session timeout's lost partitions and the fence came
        in one batch, and the deduper owned nothing from then on).
        """
        for msg in msgs:
            err = msg.error()
            if err is not None and err.code() != KafkaError._PARTITION_EOF:
                self.on_consumer_error(err)

    @property
    def consumer_failed(self) -> bool:
        """The consumer hit a fatal error: call check_consumer() from the loop."""
        return self._consumer_fatal is not None

    def check_consumer(self) -> bool:
        """Act on a fatal consumer error, if any; return True if the consumer was rebuilt.

        The caller must abort the open transaction first (its offsets belong to
        the old consumer's generation).

        Raises:
            FencedError: a second fence within FenceWindow.WINDOW_S (a live twin).
        """
        err = self._consumer_fatal
        if err is None:
            return False
        if not is_membership_fence(err):
            _log.warning("staging consumer failed for good (%s); replacing it", err.str())
            self.rebuild_consumer()
            return True
        own = self.fences.session_lost
        if self.fences.twin():
            raise FencedError(
                f"the staging consumer was fenced twice within {FenceWindow.WINDOW_S:.0f} s by a member with "
                f"instance id {self._instance_id!r} ({err.str()}): another live deduper uses it; two live "
                "processes must not share an instance id"
            )
        _log.warning(
            "staging consumer fenced by a member with our instance id %r (%s): %s; rejoining with a new consumer",
            self._instance_id,
            err.str(),
            FenceWindow.OWN_REJOIN
            if own
            else "after a broker restart that is our own earlier session (a live twin would fence our producer "
            "too, and stop us at our next commit)",
        )
        self.rebuild_consumer()
        return True

    def rebuild_consumer(self) -> None:
        """Drop the consumer and every partition it had, with their gaps; a new one rejoins and restores."""
        self.consumer_rebuilds += 1
        # Never closed: a consumer in a fatal state does not return from close() (see ferryman.watchdog.park).
        park(self.consumer)
        self._gaps.clear()
        self.holds.clear()
        self.owned.clear()
        self.restoring.clear()
        self.committed.clear()
        self.start()

    # ----------------------------------------------------------------- state
    def state_of(self, key: PartitionKey) -> PartitionState | None:
        """The committed state of a source partition, if any."""
        return self.committed.get(key)

    def staging_partition(self, key: PartitionKey) -> int:
        """The staging partition of a source partition."""
        return envelope.staging_partition(key.topic, key.partition, self._n)

    def _forget(self, parts: set[int] | list[int]) -> None:
        drop = set(parts)
        for key in [k for k in self.committed if self.staging_partition(k) in drop]:
            del self.committed[key]
        for sp in drop:
            self.expected.pop(sp, None)
        self._gaps.drop(lambda key: self.staging_partition(key) in drop)

    def restore(self, partitions: list[int]) -> dict[int, int]:
        """Committed staging positions, then the state written with them.

        Order matters: committed() under read_committed waits for pending
        transactional offset commits (KIP-447), so every transaction that
        committed these offsets has been decided. Its markers on the state
        partitions may still be on their way, though (they are written partition
        by partition): the state is read once no transaction begun before is
        open there (``read_compacted(settle=True)``). Reading at once restored
        an empty state in a CI chaos run, and the records after it were written
        a second time.
        """
        # Before: a state topic already deleted is named at once, not after the read waits out its budget
        # (an unknown partition is retried for RESTORE_BUDGET_S; twice that stalled a flow too late in a CI run).
        steps = SlowSteps(_log, RESTORE_SLOW_S)
        self._check_state()
        steps.done("describing the state topic")
        tps = [TopicPartition(self._staging_topic, sp) for sp in partitions]
        committed = retry_retriable(
            lambda: self.consumer.committed(tps, timeout=RESTORE_BUDGET_S),
            what="reading committed staging offsets",
            budget_s=RESTORE_BUDGET_S,
        )
        steps.done("reading the committed staging offsets")
        records = read_compacted(self._restore_config(), self._state_topic, partitions, RESTORE_BUDGET_S, settle=True)
        steps.done("reading the state partitions")
        self._check_state()  # the topic read is the one the deduper started on, not one made again (empty)
        steps.done("describing the state topic again")
        steps.report(f"restoring staging partitions {partitions}")
        self._forget(partitions)
        restored = 0
        for recs in records.values():
            for raw_key, raw_value in recs.items():
                if raw_value is None:
                    continue
                cluster_id, key = PartitionKey.decode(raw_key)
                st = state_pb2.WatermarkState()
                st.ParseFromString(raw_value)
                self.committed[key] = PartitionState(
                    watermark=st.watermark, topic_id=st.topic_id, retired_topic_ids=set(st.retired_topic_ids)
                )
                self.cluster_ids[key] = cluster_id
                if st.destination_topic:
                    self.dest_topics[key] = st.destination_topic
                self.last_dest_offset[key] = st.destination_offset
                restored += 1
                if st.HasField("gap_to") and st.gap_to > st.watermark:
                    self._reopen_gap(key, cluster_id, st)
        _log.info("restored %d source-partition watermarks for staging partitions %s", restored, partitions)
        # Kept until the new topic's offsets are committed (positions_committed); with offsets of another topic.
        anew = (self._anew & set(partitions)) | self._of_another_topic(committed)
        for tp in committed:
            if tp.offset >= 0 and tp.partition not in anew:
                self.expected[tp.partition] = tp.offset
        return {
            tp.partition: (tp.offset if tp.offset >= 0 and tp.partition not in anew else OFFSET_BEGINNING)
            for tp in committed
        }

    def _of_another_topic(self, committed: list[TopicPartition]) -> set[int]:
        """Partitions whose committed offsets were read from a staging topic since deleted (and made again).

        Offsets are committed by topic name: a commit that came after the deletion, before this deduper or
        the one before it saw the new topic, names the new one. The broker deletes those committed before.
        """
        now = staging_offsets_metadata(self._staging_id())
        stale = {tp.partition for tp in committed if tp.offset >= 0 and tp.metadata and now and tp.metadata != now}
        if stale:
            _log.warning(
                "committed offsets of staging partitions %s were read from a staging topic since made again (%s): "
                "reading them from the start (records read again are dropped as duplicates)",
                sorted(stale),
                ", ".join(sorted({tp.metadata or "" for tp in committed if tp.partition in stale})),
            )
        return stale

    def _reopen_gap(self, key: PartitionKey, cluster_id: str, st: state_pb2.WatermarkState) -> None:
        """Reopen a gap the restored state names, due at once.

        The envelopes that showed it are not read again (their offsets are committed with it), and a quiet
        source sends no later one that would show it.
        """
        source = envelope_pb2.SourcePartition(
            cluster_id=cluster_id, topic=key.topic, topic_id=st.topic_id, partition=key.partition
        )
        self._gaps.note(key, source, st.watermark + 1, st.gap_to)
        _log.warning(
            "restored an open gap in source partition %s: records %d..%d have not arrived; asking for them again",
            key,
            st.watermark + 1,
            st.gap_to,
        )

    def read_anew(self) -> None:
        """The staging topic was made again: a new consumer, reading each partition from its start.

        librdkafka may never fetch a topic it knew by its old id (the wrapper meets the same with a
        re-created source topic), and the group's committed offsets are the old topic's. Records read
        again are dropped as duplicates by the watermarks; envelopes lost with the old topic show as gaps.
        Each partition is read from its start until offsets read from the new topic are committed for it:
        a restore before that (the new consumer's rejoin comes at once) must not resume at an old offset,
        past envelopes of the new topic that were never read (a CI run lost a resend that way).
        The caller must abort the open transaction first.
        """
        self._anew = set(range(self._n))
        self.rebuild_consumer()

    @property
    def reading_anew(self) -> bool:
        """Some partition still restores from its start (``read_anew``)."""
        return bool(self._anew)

    def positions_committed(self, partitions: Iterable[int]) -> None:
        """Offsets read from the staging topic of now were committed for partitions: restores resume there."""
        self._anew.difference_update(partitions)

    def note_position(self, sp: int, offset: int) -> None:
        """A record at offset was read from staging partition sp: report staging records deleted unread.

        Staging offsets are consecutive (wrappers write without transactions), so a
        record past the expected offset means the consumer skipped ahead: its
        position left the log (retention ran ahead of the deduper) and it restarted
        at the log start (auto.offset.reset). The envelope chain then shows the
        source records those envelopes held as a gap; this names the staging range.
        """
        expected = self.expected.get(sp)
        self.expected[sp] = offset + 1
        if expected is None or offset <= expected:
            return
        low, _high = topics.watermark_offsets(self.consumer, self._staging_topic, sp, budget_s=RESTORE_BUDGET_S)
        if low <= expected:
            return  # a hole of another kind (transaction markers of a foreign writer): nothing deleted
        last = min(low, offset) - 1
        self.staging_losses.append(
            control_pb2.StagingLoss(
                staging_partition=sp, first_offset=expected, last_offset=last, detected_at_ms=int(time.time() * 1000)
            )
        )
        _log.error(
            "STAGING DATA LOST: staging records %s-%d offsets %d..%d were deleted (retention) before this deduper "
            "read them. The source records they held show as a gap and are asked for again from the wrappers; "
            "if the source no longer has them either, the gap is reported as lost",
            self._staging_topic,
            sp,
            expected,
            last,
        )

    def rewind(self) -> None:
        """Resume every owned partition from its last commit (offsets and state); held ones stay paused."""
        if not self.owned:
            return
        positions = self.restore(sorted(self.owned))
        for sp, offset in positions.items():
            if sp not in self.owned:
                continue  # revoked while restoring
            try:
                self.consumer.seek(TopicPartition(self._staging_topic, sp, offset))
            except KafkaException as exc:
                raise KafkaOperationError(f"seeking staging partition {sp} to {offset}", exc) from exc
        self.pause(self.holds.paused & self.owned)  # a failed probe's partition is held again

    def writing_to(self, topic: str, partition: int) -> set[int]:
        """Owned staging partitions whose source partitions are written to destination topic's partition."""
        return {
            sp
            for key, dest in self.dest_topics.items()
            if dest == topic and key.partition == partition and (sp := self.staging_partition(key)) in self.owned
        }

    def held_sources(self, sp: int) -> list[control_pb2.HeldSourcePartition]:
        """The source partitions of staging partition sp this deduper knows, each at its committed watermark.

        Known from the state, or from writing them (a partition whose first records failed has no state yet).
        """
        committed = dict(self.committed)  # copies: the status asks from a gRPC thread
        keys = sorted({*committed, *list(self.dest_topics)})
        return [
            control_pb2.HeldSourcePartition(
                topic=key.topic, partition=key.partition, watermark=committed[key].watermark if key in committed else -1
            )
            for key in keys
            if self.staging_partition(key) == sp
        ]

    def pause(self, parts: set[int]) -> None:
        """Read nothing more of parts (held): a probe seeks them back to their committed offsets."""
        if parts:
            self.consumer.pause([TopicPartition(self._staging_topic, sp) for sp in sorted(parts)])

    def probe(self, sp: int) -> None:
        """Resume held partition sp from its last commit (offsets and state), as a rewind of it alone."""
        positions = self.restore([sp])
        tp = TopicPartition(self._staging_topic, sp, positions[sp])
        try:
            # Resumed first: the seek then restarts the fetch from there (any record fetched before is dropped).
            self.consumer.resume([TopicPartition(self._staging_topic, sp)])
            self.consumer.seek(tp)
        except KafkaException as exc:
            raise KafkaOperationError(f"resuming held staging partition {sp} at {tp.offset}", exc) from exc
        self.holds.probing(sp)

    def finish_restores(self) -> None:
        """Restore state of newly assigned partitions, then let them flow (loop thread)."""
        if not self.restoring:
            return
        parts = sorted(self.restoring)
        self.restore(parts)
        # No seek to the restored positions: the consumer starts a newly assigned
        # partition at its committed offset, which it reads as restore() did (stable
        # offsets, since it is read_committed), or at the log start when there is
        # none (auto.offset.reset). A seek while that start is still being resolved
        # restarts the resolution behind librdkafka's backoff: measured here, the
        # first message came 0.08-0.58 s after resume with a seek to the beginning,
        # 0.08-1.08 s with a seek to an absolute offset, and 0.17 s without a seek.
        # Whatever position it starts from, the watermark drops what is already
        # written and the envelope chain reports anything skipped as a gap.
        tps = [TopicPartition(self._staging_topic, sp) for sp in parts]
        self.consumer.resume(tps)
        self.restoring.difference_update(parts)
        self.owned.update(parts)
        _log.info("staging partitions %s ready (now own %s)", parts, sorted(self.owned))

    def accepts(self, msg: Message) -> bool:
        """A consumed staging record of a partition this deduper owns (and restored)."""
        return msg.partition() in self.owned

    # ------------------------------------------------------------ rebalances
    def _guard(self, what: str, fn: Callable[[list[TopicPartition]], None], partitions: list[TopicPartition]) -> None:
        try:
            fn(partitions)
        except BaseException as exc:  # callbacks must not raise: surfaced from the loop
            _log.exception("%s failed", what)
            self.callback_failure = exc

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._joins.assigned()
        self.fences.assigned()  # in the group again: a fence from now on is counted
        if self._first_assignment:
            self._first_assignment = False
            self.rejoin_due = True  # see rejoin_due
        self._guard("partition assignment", lambda p: self._assign(consumer, p), partitions)

    def _assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Take new staging partitions paused; their state is restored from the loop.

        Blocking calls (committed offsets, reading the state topic) must not run
        inside a rebalance callback: librdkafka may need the very thread that
        runs the callback to complete them, and committed() then times out.
        """
        if not partitions:
            return
        parts = sorted(tp.partition for tp in partitions)
        tps = [TopicPartition(self._staging_topic, sp) for sp in parts]
        consumer.incremental_assign(tps)
        consumer.pause(tps)
        self.restoring.update(parts)
        _log.info("assigned staging partitions %s; restoring their state before processing", parts)

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._joins.revoked()
        self._guard("partition revocation", lambda p: self._revoke(p, lost=False), partitions)

    def _on_lost(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._joins.revoked()
        self._guard("partition loss", lambda p: self._revoke(p, lost=True), partitions)

    def _revoke(self, partitions: list[TopicPartition], *, lost: bool) -> None:
        parts = {tp.partition for tp in partitions}
        self.restoring -= parts
        self._commit_for_revoke(lost)
        self.holds.drop(parts)
        self.owned -= parts
        self._forget(parts)
        _log.info(
            "%s staging partitions %s (now own %s)", "lost" if lost else "revoked", sorted(parts), sorted(self.owned)
        )

    def close(self) -> None:
        """Close the consumer (static member: the group keeps our partitions for a quick restart).

        An assignment on its way is taken first (``ferryman.group_close``); its partitions stay paused.
        """
        if self._consumer_fatal is not None:
            return  # its close() would never return (ferryman.watchdog.park); the process is exiting
        close_group_consumer(
            self.consumer, self._joins, what="closing the staging consumer", deadline_s=CLOSE_DEADLINE_S
        )
