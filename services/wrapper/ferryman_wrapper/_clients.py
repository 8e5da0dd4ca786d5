"""The wrapper loop's two Kafka clients: made, watched, rewound and replaced; a failed step recovered.

The source consumer (group member, ``read_committed``, offsets committed by
``_commits``) and the idempotent staging producer are built here with the
callbacks that record their faults; the loop asks ``check_callbacks`` after
every ``consume()``. A rewind resumes every partition just after its
acknowledged prefix. A producer with a fatal error is rebuilt (then a rewind);
a consumer that is fenced, failed, stuck in a commit, left out of its group,
reading a re-created topic or no longer fetching a partition is replaced
(parked, never closed: it rejoins and every partition starts again from its
commit). A fence by a live twin ends the process (``FenceWindow``). A step
that failed with a transient error is retried (``StepRecovery``): a rewind,
with capped backoff while a cluster is away. Loop thread only, except the
client callbacks, which only record.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from ferryman.client_config import connected_producer, data_producer_config, streaming_consumer_config
from ferryman.config import ClusterConfig, FlowConfig, WrapperConfig
from ferryman.errors import FencedError, KafkaOperationError
from ferryman.health import PROBE_INTERVAL_S, PROBE_TIMEOUT_S, ClusterHealth, StuckRecovery
from ferryman.kafka_errors import (
    FenceWindow,
    authorization_error,
    is_authorization_failure,
    is_fatal_client_error,
    is_membership_fence,
)
from ferryman.naming import FlowNames
from ferryman.renewing_admin import answers
from ferryman.state import PartitionKey
from ferryman.watchdog import park

from ferryman_wrapper._assignment import SourcePartitions
from ferryman_wrapper._commits import SYNC_COMMIT_BUDGET_S, SourceCommits
from ferryman_wrapper._specs import SpecPublisher

_log = logging.getLogger(__name__)

#: Slack beyond the loop's longest blocking step (a flush, then a synchronous commit, both in a revoke).
_POLL_INTERVAL_SLACK_S = 30.0
#: A source consumer not in the group again this long after its session timed out, while the source
#: has answered for ORPHANED_ANSWERING_S, is replaced (`_orphaned`): a rejoin once a broker is back takes
#: a few seconds. librdkafka can leave it without a coordinator far longer: after a freeze the first
#: metadata answer may list no broker, and the handle of the only one is decommissioned but held by a
#: pending offset commit until that expires (~60 s; the family of librdkafka #5511). A new client has
#: fresh handles.
ORPHANED_REBUILD_S = 15.0
ORPHANED_ANSWERING_S = 10.0
#: Backoff between recovery attempts while a cluster is away (first quick, then capped).
_RECOVERY_BACKOFF_S = (0.2, 5.0)


class LoopClients:
    """The source consumer and the staging producer of the loop, and their recovery (loop thread only)."""

    def __init__(
        self,
        *,
        source: ClusterConfig,
        target: ClusterConfig,
        wc: WrapperConfig,
        names: FlowNames,
        wrapper_id: str,
        static_id: str | None,
        flow: Callable[[], FlowConfig],
        parts: SourcePartitions,
        commits: SourceCommits,
        specs: Callable[[], SpecPublisher],
        source_health: ClusterHealth,
        target_health: ClusterHealth,
    ) -> None:
        """Prepare (no client is made before start_producer() and start_consumer()).

        Args:
            source: the source cluster (the consumer's).
            target: the destination cluster (the staging producer's).
            wc: the wrapper's settings.
            names: the flow's names (staging topic, wrapper group).
            wrapper_id: this process's identity (client ids).
            static_id: the consumer's group.instance.id (None: a dynamic member).
            flow: the flow as it is now (the store may change it).
            parts: the assigned source partitions (rebalance callbacks, rewind positions).
            commits: the source offset commits (made through the current consumer).
            specs: the topic spec publisher (it writes with the current producer).
            source_health: the source cluster's health (transient consumer errors).
            target_health: the staging cluster's health (transient producer errors).
        """
        self._source = source
        self._target = target
        self._wc = wc
        self._names = names
        self._wrapper_id = wrapper_id
        self._static_id = static_id
        self._flow = flow
        self._parts = parts
        self._commits = commits
        self._specs = specs
        self._source_health = source_health
        self._target_health = target_health
        #: The current clients: made by start_producer() and start_consumer(), replaced by the rebuilds.
        self.producer: Producer
        self.consumer: Consumer
        #: A fatal error recorded by a client's callback, for the loop to act on (rebuild_producer, check_callbacks).
        self.producer_fatal: KafkaError | None = None
        self.consumer_fatal: KafkaError | None = None
        #: The source topics subscribed to (the loop's last discovery).
        self.subscribed: list[str] = []
        # A missing ACL reported by a consumer callback (a fetch or a group refused): a configuration error
        # raised by the loop (check_callbacks), never retried as an outage.
        self._consumer_denied: KafkaError | None = None
        self._fences = FenceWindow()
        self._next_orphan_probe = 0.0
        #: Since when the source's admin client has seen brokers, while the consumer is out of the group.
        self._answering_since: float | None = None
        self.rewinds = 0
        self.producer_rebuilds = 0
        self.consumer_rebuilds = 0

    # ------------------------------------------------------------------ setup
    def _make_producer(self) -> Producer:
        conf = data_producer_config(
            self._target, f"{self._wrapper_id}-staging", max_message_bytes=self._wc.staging_max_message_bytes
        )
        conf.update(
            {
                # Idempotence keeps envelopes of one staging partition in order
                # with up to 5 requests in flight: the max-offset dedup rule
                # relies on it.
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": self._wc.linger_ms,
                "compression.type": self._wc.compression_type,
                "message.max.bytes": self._wc.staging_max_message_bytes,
                "error_cb": self._on_producer_error,
            }
        )
        return connected_producer(conf, self._names.staging_topic)

    def _make_consumer(self) -> Consumer:
        conf = streaming_consumer_config(
            self._source, f"{self._wrapper_id}-source", on_session_timeout=self._fences.consumer_built()
        )
        conf.update(
            {
                "group.id": self._names.wrapper_group,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                # Start positions are chosen explicitly on assignment; an
                # out-of-range committed offset (retention ran ahead of us)
                # must be an error, never a silent jump.
                "auto.offset.reset": "error",
                "partition.assignment.strategy": "cooperative-sticky",
                "topic.metadata.refresh.interval.ms": max(1000, int(self._wc.topic_refresh_interval_s * 1000)),
                "session.timeout.ms": self._wc.session_timeout_ms,
                # A consumer given up (parked) keeps heartbeating from librdkafka's thread and stays in the
                # group until this passes without a poll; every rebalance meanwhile waits for it (librdkafka's
                # default, 5 min, was one chaos run's 5-minute stall). So: the loop's longest blocking step.
                "max.poll.interval.ms": max(
                    self._wc.session_timeout_ms,
                    int((self._wc.shutdown_timeout_s + SYNC_COMMIT_BUDGET_S + _POLL_INTERVAL_SLACK_S) * 1000),
                ),
                "on_commit": self._commits.on_commit,
                "error_cb": self.on_consumer_error,
            }
        )
        if self._static_id:
            conf["group.instance.id"] = self._static_id
        return Consumer(conf)

    def start_producer(self) -> None:
        """Make the staging producer (it waits until the staging topic's metadata is known)."""
        self.producer = self._make_producer()

    def start_consumer(self) -> None:
        """Make a source consumer (not subscribed yet)."""
        self.consumer = self._make_consumer()
        self._parts.rejoin_after_first_assignment = bool(self._static_id)  # see SourcePartitions.on_assign

    def _on_producer_error(self, err: KafkaError) -> None:
        if err.fatal():
            self.producer_fatal = err
        else:
            self._target_health.client_error(err, "staging producer")

    def on_consumer_error(self, err: KafkaError) -> None:
        """The consumer's error callback (and its fatal or authorization error events): recorded for the loop."""
        if is_authorization_failure(err):
            self._consumer_denied = self._consumer_denied or err
            return
        # A fatal consumer error comes as code _FATAL, its cause in the text.
        if is_fatal_client_error(err):
            self.consumer_fatal = err
            _log.error("source consumer: %s", err)
        else:
            self._source_health.client_error(err, "source consumer")

    def subscribe(self, names: list[str]) -> None:
        """Subscribe the consumer to names (none: unsubscribe); the loop's discovery decides them."""
        self.subscribed = names
        if names:
            self._parts.joins.subscribed()
            self.consumer.subscribe(
                names, on_assign=self._on_assign, on_revoke=self._parts.on_revoke, on_lost=self._parts.on_lost
            )
            _log.info("subscribed to %d source topics: %s", len(names), ", ".join(names[:20]))
        else:
            self._parts.joins.unsubscribed()
            self.consumer.unsubscribe()
            _log.warning("no source topic matches flow %s yet", self._flow().name)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._fences.assigned()  # in the group again: a fence from now on is counted
        self._parts.on_assign(consumer, partitions)

    # ---------------------------------------------------------------- faults
    def check_callbacks(self) -> None:
        """Act on what client callbacks recorded: a failed assignment, a fenced or failed consumer."""
        failure = self._parts.callback_failure
        if failure is not None:
            self._parts.callback_failure = None
            raise failure
        denied = self._consumer_denied
        if denied is not None:
            flow = self._flow()
            error = authorization_error(
                KafkaException(denied),
                operation=f"read flows[{flow.name}].topics with group {self._names.wrapper_group}",
                resource=", ".join(flow.topics),
            )
            assert error is not None  # only authorization failures are recorded
            raise error
        err = self.consumer_fatal
        if err is not None:
            self.consumer_fatal = None
            own = self._fences.session_lost
            if is_membership_fence(err) and self._fences.twin():
                raise FencedError(
                    f"the source consumer was fenced twice within {FenceWindow.WINDOW_S:.0f} s by a member with "
                    f"instance id {self._static_id!r} ({err.str()}): two live wrappers must not share it"
                )
            self.rebuild_consumer(
                f"the source consumer failed ({err.str()}); "
                + (FenceWindow.OWN_REJOIN if own else "after a broker restart a fence is our own earlier session")
            )
        elif self._commits.wedged:
            self._commits.wedged = False
            self.rebuild_consumer("a source offset commit never returned")
        elif self._orphaned():
            self.rebuild_consumer(
                f"not assigned again {self._fences.lost_for():.0f} s after its session timed out, though the "
                "source answers (librdkafka can leave a consumer without its coordinator after a broker freeze)"
            )
        elif self._specs().recreated:
            specs = self._specs()
            names = ", ".join(sorted(specs.recreated))
            specs.recreated.clear()
            # librdkafka keeps the topic ids it has seen: after a re-creation an assigned partition may
            # fetch nothing, with no error, until the client is replaced (confluent-kafka-python #1787).
            self.rebuild_consumer(f"source topic {names} was re-created (new topic id)")
        elif self._parts.resubscribe_due:
            _log.info("rejoining the source consumer group: %s", self._parts.resubscribe_due)
            self._parts.resubscribe_due = ""
            self.consumer.unsubscribe()
            self.subscribe(self.subscribed)

    def _orphaned(self) -> bool:
        """The consumer is out of the group ORPHANED_REBUILD_S after its session timed out; the source answers.

        The source must have answered for ORPHANED_ANSWERING_S, through the admin client, whose broker
        handles are its own. While the source is away nothing is replaced (an outage is waited out), and
        once it is back the consumer gets the time of a rejoin first.
        """
        lost_for = self._fences.lost_for()
        if not lost_for:
            self._answering_since = None
            return False
        now = time.monotonic()
        if now >= self._next_orphan_probe:
            self._next_orphan_probe = now + PROBE_INTERVAL_S
            admin = self._specs().source_admin
            if not answers(admin.client, PROBE_TIMEOUT_S):
                admin.suspect()  # the source away, or the admin client stuck (then a new one is tried)
                self._answering_since = None
            elif self._answering_since is None:
                self._answering_since = now
        since = self._answering_since
        return lost_for >= ORPHANED_REBUILD_S and since is not None and now - since >= ORPHANED_ANSWERING_S

    # -------------------------------------------------------- rewinds, rebuilds
    def rewind(self, why: str) -> None:
        """Resume every partition just after its acknowledged prefix."""
        self.rewinds += 1
        _log.warning("rewinding the wrapper: %s", why)
        self.producer.flush(self._wc.shutdown_timeout_s)
        self._commits.commit()
        for key, (nxt, logical) in self._parts.tracker.rewind_positions().items():
            self._parts.restart(key, nxt, logical)
            try:
                self.consumer.seek(TopicPartition(key.topic, key.partition, nxt if logical is None else logical))
            except KafkaException as exc:
                if exc.args[0].code() == KafkaError._STATE:
                    self._replace_unfetching_consumer(key, exc)
                    return
                raise KafkaOperationError(f"seeking source partition {key} to {nxt}", exc) from exc

    def _replace_unfetching_consumer(self, key: PartitionKey, exc: KafkaException) -> None:
        """A rewind found a partition no longer fetched: the consumer lost it with no rebalance callback.

        It failed: fenced while the loop backed off, which does not consume, so its
        fatal error (an event of the next batch) is still unread. Every seek would
        fail the same way, a transient error for ever. The batch's error events are
        taken first, so that a fence is counted (a twin stops the wrapper); the
        consumer is replaced either way, and every partition starts again from its
        commit (the records of that batch with it).
        """
        for msg in self.consumer.consume(num_messages=self._wc.consume_batch_size, timeout=0):
            err = msg.error()
            if err is not None and is_fatal_client_error(err):
                self.on_consumer_error(err)
        if self.consumer_fatal is not None:
            self.check_callbacks()
        else:
            self.rebuild_consumer(f"source partition {key} is no longer fetched ({exc.args[0].str()})")

    def rebuild_producer(self) -> None:
        """Replace the staging producer after its fatal error, then rewind every partition."""
        err = self.producer_fatal
        _log.error("staging producer hit a fatal error (%s); rebuilding it and rewinding", err)
        self.producer_rebuilds += 1
        self.producer_fatal = None
        # Whatever was acknowledged before the error stays acknowledged.
        self.producer.purge()
        self.producer.flush(1.0)
        self.producer = self._make_producer()
        self._specs().producer = self.producer
        for key in list(self._parts.chain):
            self._parts.tracker.failed(key)
        self.rewind("producer rebuilt")

    def rebuild_consumer(self, why: str) -> None:
        """Replace the source consumer: it rejoins the group and every partition starts again from its commit.

        Nothing is committed first: the old consumer is fenced, failed or stuck in a commit, so a commit
        through it would fail or hang too; the deduper drops what the new one re-sends.
        """
        _log.warning("replacing the source consumer: %s", why)
        self.consumer_rebuilds += 1
        self._commits.wedged = False
        self._parts.drop_all()
        # Never closed: a consumer in a fatal state does not return from close() (see ferryman.watchdog.park).
        # A parked member leaves the group by max.poll.interval.ms, or at once when the new one has its
        # group.instance.id; the new one's first assignment is followed by a rejoin (SourcePartitions.on_assign).
        park(self.consumer)
        self.start_consumer()
        self.subscribe(self.subscribed)

    def both_answer(self, timeout_s: float) -> None:
        """Metadata from both clusters (raises KafkaException while one does not answer)."""
        admin = self._specs().source_admin
        try:
            admin.client.list_topics(timeout=timeout_s)
        except KafkaException:
            admin.suspect()
            raise
        self.producer.list_topics(self._names.staging_topic, timeout=timeout_s)


class StepRecovery:
    """A loop step that failed with a transient fault: why, the backoff, and the net for one stuck (loop thread)."""

    def __init__(self, *, clients: LoopClients, stop: threading.Event, health_changed: Callable[[], None]) -> None:
        """Prepare.

        Args:
            clients: the loop's clients (the consumer is replaced when a recovery stays stuck).
            stop: set by shutdown(): a backoff ends early.
            health_changed: told when the wrapper's health may have changed (recovering or recovered).
        """
        self._clients = clients
        self._stop = stop
        self._health_changed = health_changed
        #: Why the last step failed, while the loop is recovering from it.
        self.reason: str = ""
        self._backoff_s = _RECOVERY_BACKOFF_S[0]
        #: A recovery failing while both clusters answer: the source consumer is replaced.
        self.stuck = StuckRecovery()

    def failed(self, exc: BaseException) -> None:
        """A step failed with a transient fault: back off, then rewind (from the loop, retried)."""
        what = f"{type(exc).__name__}: {exc}"
        if not self.reason:
            _log.warning("wrapper step failed (%s); rewinding to the acknowledged offsets", what)
        self.reason = what
        self._health_changed()
        self._stop.wait(self.next_backoff())
        failing_s = self.stuck.failed(self._clients.both_answer)
        if failing_s:
            self._clients.rebuild_consumer(
                f"the recovery has failed for {failing_s:.0f} s while both clusters answer ({what})"
            )

    def next_backoff(self) -> float:
        """The wait before the next attempt: doubled each time, up to the cap, until recovered()."""
        backoff = self._backoff_s
        self._backoff_s = min(_RECOVERY_BACKOFF_S[1], self._backoff_s * 2)
        return backoff

    def reset_backoff(self) -> None:
        """The next wait is the first, short one again (a retried step passed)."""
        self._backoff_s = _RECOVERY_BACKOFF_S[0]

    def recovered(self) -> None:
        """The rewind after a failed step passed."""
        _log.info("wrapper recovered from: %s", self.reason)
        self.reason = ""
        self.stuck.recovered()
        self.reset_backoff()
        self._health_changed()
