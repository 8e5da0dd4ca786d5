"""The wrapper's source offset commits: what is safe to commit, and what a failed commit means.

Source offsets are committed (to the source cluster) only up to the last
envelope acknowledged with every envelope before it (``ProgressTracker``). A
failed commit never loses or duplicates anything at the destination: the
deduper drops what a successor re-sends from an older commit. So no commit
failure stops the wrapper, except a fence of its static membership by a live
twin (handled by the consumer's owner). A commit failing for longer than
``STILL_FAILING_S`` marks the source cluster down (health NOT_SERVING, one log
line per state change) until one passes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from ferryman.errors import KafkaOperationError, WedgedCallError
from ferryman.health import ClusterHealth
from ferryman.kafka_errors import ErrorClass, classify, retry_retriable
from ferryman.state import PartitionKey
from ferryman.v1 import envelope_pb2
from ferryman.watchdog import GRACE_S, Watchdog

from ferryman_wrapper._progress import ProgressTracker

_log = logging.getLogger(__name__)

#: Budget of a synchronous commit (shutdown, rewind) including retries.
SYNC_COMMIT_BUDGET_S = 30.0
#: librdkafka has no timeout for a synchronous commit; the watchdog's deadline
#: for one attempt (a commit round trip takes milliseconds; a coordinator
#: moving takes seconds).
_SYNC_ATTEMPT_DEADLINE_S = 10.0 + GRACE_S
#: Commits failing this long mean the source cluster's coordinator is away.
STILL_FAILING_S = 10.0
#: At most one asynchronous commit is in flight. While the group coordinator is
#: away librdkafka holds each commit back, and a rebalance (the session expired
#: meanwhile) waits for every commit in progress before it completes: one
#: commit a second for the length of an outage (43 were seen) kept the wrapper's
#: partitions unassigned, and the wrapper idle, for good after the broker was
#: back. A report that never comes is given up after this long.
ASYNC_REPORT_WAIT_S = 30.0


class SourceCommits:
    """Commits acknowledged source offsets, synchronously or not (loop thread only)."""

    def __init__(
        self,
        *,
        consumer: Callable[[], Consumer],
        tracker: ProgressTracker,
        sources: dict[PartitionKey, envelope_pb2.SourcePartition],
        health: ClusterHealth,
    ) -> None:
        self._consumer = consumer
        self._tracker = tracker
        self._sources = sources
        self._health = health
        self._watchdog = Watchdog("source-commits")
        #: Since when commits have been failing (None: the last one passed).
        self._failing_since: float | None = None
        #: When the asynchronous commit in flight was sent (None: none is).
        self._async_sent_at: float | None = None
        self.wedged = False
        """A synchronous commit was abandoned: the consumer must be replaced."""

    def commit(self, keys: list[PartitionKey] | None = None, *, synchronous: bool = True) -> None:
        """Commit the acknowledged prefix of each partition (of ``keys``, or all).

        Synchronous (shutdown, rewind: the next reader must find it): retriable
        errors are retried within SYNC_COMMIT_BUDGET_S. The periodic commit is
        asynchronous: the loop does not wait for the round trip (7-28 ms at
        250 k rec/s here, every record behind it delayed by as much); its
        outcome arrives in ``on_commit``, and a failed one is covered by the next.
        Neither raises for a failed commit: the next owner re-sends from the last one.
        Never from a rebalance callback (``hand_over``).
        """
        found = self._offsets(keys)
        if found is None:
            return
        positions, offsets = found
        consumer = self._consumer()
        if not synchronous:
            now = time.monotonic()
            if self._async_sent_at is not None and now - self._async_sent_at < ASYNC_REPORT_WAIT_S:
                return  # the last one has not reported yet; the next interval covers this one
            self._async_sent_at = now
            try:
                consumer.commit(offsets=offsets, asynchronous=True)
            except KafkaException as exc:  # refused before it was sent
                self._async_sent_at = None
                self.failed(exc, "committing source offsets")
            return
        try:
            retry_retriable(
                lambda: self._watchdog.call(
                    lambda: consumer.commit(offsets=offsets, asynchronous=False),
                    what="committing source offsets",
                    deadline_s=_SYNC_ATTEMPT_DEADLINE_S,
                    client=consumer,
                ),
                what="committing source offsets",
                budget_s=SYNC_COMMIT_BUDGET_S,
            )
        except WedgedCallError as exc:
            self.wedged = True
            self.failed(KafkaException(KafkaError(KafkaError._TIMED_OUT, str(exc))), "committing source offsets")
            return
        except (KafkaException, KafkaOperationError) as exc:
            cause = exc.__cause__ if isinstance(exc, KafkaOperationError) else exc
            self.failed(
                cause if isinstance(cause, KafkaException) else KafkaException(KafkaError(KafkaError._FAIL)),
                "committing source offsets",
            )
            return
        self._tracker.mark_committed(positions)
        self._passed()

    def _offsets(self, keys: list[PartitionKey] | None) -> tuple[dict[PartitionKey, int], list[TopicPartition]] | None:
        """The acknowledged positions of keys (or all) and their commit offsets; None when there is nothing new."""
        positions = self._tracker.commit_positions(keys)
        if not positions:
            if keys is None:
                # Everything acknowledged is committed: no failure is pending, but nothing was asked of the
                # cluster either, so this says nothing of its health (the partitions may have been lost to
                # a session timeout while the source is down).
                self._settled()
            return None
        # The topic id rides along as commit metadata: after a source topic is
        # deleted and re-created, old offsets are recognised as meaningless.
        offsets = [
            TopicPartition(k.topic, k.partition, nxt, metadata=self._sources[k].topic_id.hex())
            for k, nxt in positions.items()
            if k in self._sources
        ]
        if not offsets:
            return None  # librdkafka refuses an empty commit (_NO_OFFSET)
        return positions, offsets

    def hand_over(self, keys: list[PartitionKey]) -> None:
        """Commit the acknowledged prefix of partitions being revoked (in the rebalance callback), without waiting.

        The callback runs inside the loop's ``consume()``, and confluent-kafka-python (2.16) serialises
        calls on one consumer across threads: a commit on the watchdog's worker thread waited for
        ``consume()`` to return, which waited for the commit, so every revoke stalled the whole deadline
        (13 s) and cost the consumer (Pitfalls). A commit from the callback's own thread is admitted.
        It is asynchronous so that nothing here can wedge: librdkafka completes every commit in progress
        before the incremental unassign is done and the member rejoins, so the partitions' next owner
        starts from it. Its outcome arrives in ``on_commit``; if it fails, the next owner re-sends from
        the last commit, and the deduper drops what it already wrote.
        """
        found = self._offsets(keys)
        if found is None:
            return
        try:
            self._consumer().commit(offsets=found[1], asynchronous=True)
        except KafkaException as exc:  # refused before it was sent
            self.failed(exc, "committing source offsets of revoked partitions")

    def on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """Outcome of an asynchronous commit (consumer callback, on the loop thread)."""
        self._async_sent_at = None
        if err is not None:
            self.failed(err, "committing source offsets")
            return
        done: dict[PartitionKey, int] = {}
        for tp in partitions:
            if tp.error is not None:
                self.failed(tp.error, f"committing source offset of {tp.topic}-{tp.partition}")
            elif tp.offset >= 0:
                done[PartitionKey(tp.topic, tp.partition)] = tp.offset
        if done:
            self._tracker.mark_committed(done)
            if len(done) == len(partitions):
                self._passed()

    def failed(self, error: KafkaError | KafkaException, what: str) -> None:
        """A commit failed: log it (once per state change), mark the cluster down if it lasts."""
        cls = classify(error)
        if cls is ErrorClass.ABORTABLE:
            # A rebalance moved partitions: the new owner resumes from the last commit.
            _log.info("%s skipped during a rebalance: %s", what, error)
            return
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
            _log.warning("%s failed (%s); the next commit covers it", what, error)
        if cls is not ErrorClass.RETRIABLE:
            # Refused (an ACL, say): nothing clears it by itself, but granting it does, without a restart.
            self._health.down(f"source offset commits refused: {error}")
        elif now - self._failing_since >= STILL_FAILING_S:
            self._health.down(f"source offset commits failing for {now - self._failing_since:.0f} s: {error}")

    def _passed(self) -> None:
        """A commit completed: the source answered."""
        self._settled()
        self._health.up()

    def _settled(self) -> None:
        if self._failing_since is not None:
            self._failing_since = None
            _log.info("source offset commits pass again")

    def shutdown(self) -> None:
        """Let the watchdog's worker thread end."""
        self._watchdog.shutdown()
