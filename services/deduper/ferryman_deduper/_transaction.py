"""The deduper's destination transaction: pending state, commit, abort, recovery, watchdog.

One object owns the transactional producer and everything the open
transaction holds (the source partitions' new states, the offset-map slices,
the staging offsets to commit with it). Each blocking producer call runs under
the watchdog (``ferryman.watchdog``) with a deadline that holds, so a call
librdkafka never returns from (librdkafka #5511) cannot stop the deduper: the
producer is abandoned and replaced, and the new producer's
``init_transactions`` (same ``transactional.id``) fences the old one and
resolves its open transaction.

Recovery by class (``ferryman.kafka_errors``):

* abortable: ``abort_transaction``; if that fails, rebuild;
* fatal, retriable past its budget (outcome unknown), wedged: rebuild;
* fenced by a live twin (our transaction is younger than
  ``transaction.timeout.ms``): ``FencedError``, the process exits with 3;
* fenced within ``transaction.timeout.ms`` of replacing our own producer: most
  likely that producer's late epoch bump (an abandoned or replaced producer is
  not destroyed at once, and librdkafka bumps the epoch of a transaction that
  failed with "requires epoch bump"), so rebuild once; a second fence without a
  replacement in between is a twin.

The caller rewinds its consumer to the last commit after any recovery.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from ferryman.config import DeduperConfig
from ferryman.errors import FencedError, KafkaOperationError, WedgedCallError
from ferryman.health import ClusterHealth
from ferryman.kafka_errors import (
    ErrorClass,
    authorization_error,
    classify,
    is_stale_generation,
    kafka_error_of,
    record_refused,
    refusal_told,
    retry_retriable,
)
from ferryman.kafka_log import RepeatFilter
from ferryman.metrics import LatencyHistogram
from ferryman.state import PartitionKey
from ferryman.v1 import control_pb2, envelope_pb2
from ferryman.watchdog import GRACE_S, Watchdog

from ferryman_deduper._decide import PartitionState
from ferryman_deduper._timings import RecentDurations

_log = logging.getLogger(__name__)
#: How many error texts `Transaction.refused_at` keeps between commits (the refusal's, the purges').
_REFUSALS_KEPT = 64

T = TypeVar("T")

#: librdkafka timeout of one attempt of a transactional call. A commit takes
#: 25-45 ms here even at 350 k rec/s (its records are flushed before it), so
#: 3 s is generous; a call that times out is retried within
#: operation_timeout_s. Short, so that a call that never returns is noticed
#: soon: the watchdog's deadline is this plus GRACE_S. With 10 s deadlines, work
#: resumed 11-13 s after a restarted broker was back when a commit met the
#: restart (the call in flight then hung, librdkafka #5511); the goal is 30 s.
CALL_TIMEOUT_S = 3.0
#: Two failed commits in a row pause the wrappers (backpressure) until this long after the last failure,
#: unless a commit passes first. Longer than a recovery's rebuild and rewind (seconds), so commits that keep
#: failing keep the pause on; bounded, because a deduper whose partitions have nothing left to write makes
#: no commit to end it: a long chaos run paused both wrappers 16 min that way (2026-11-29, docs/notes.md).
FAILED_COMMITS_PAUSE_S = 15.0


@dataclass
class Slice:
    """Records of one envelope written in the open transaction (for the offset map)."""

    key: PartitionKey
    source: envelope_pb2.SourcePartition
    destination_topic: str
    source_offsets: Sequence[int]
    first_destination_offset: int = -1
    last_destination_offset: int = -1


@dataclass
class TransactionStats:
    """Counters since start."""

    committed: int = 0
    aborted: int = 0
    producer_rebuilds: int = 0
    wedged_calls: int = 0


class Transaction:
    """The open destination transaction and the producer that writes it (loop thread only)."""

    def __init__(
        self,
        *,
        make_producer: Callable[[], tuple[Producer, bool]],
        dc: DeduperConfig,
        exactly_once: bool,
        transactional_id: str,
        health: ClusterHealth,
    ) -> None:
        self._make_producer = make_producer
        self._dc = dc
        self.exactly_once = exactly_once
        self.transactional_id = transactional_id
        self._health = health
        self._watchdog = Watchdog("destination-producer")
        self.stats = TransactionStats()
        self.producer: Producer  # made by start()
        self._producer_made = False
        self.direct = False
        """Whether rows go to librdkafka directly (``rowproduce.adopts``) for the current producer."""
        self.open = False
        self.started = 0.0
        self.records = 0
        self.pending: dict[PartitionKey, PartitionState] = {}
        self.slices: list[Slice] = []
        #: (source timestamps, first index written) of each run written in the open transaction:
        #: counted into ``latency`` when it commits (one append per envelope on the write path).
        self.timestamps: list[tuple[Sequence[int], int]] = []
        self.latency = LatencyHistogram()
        """End-to-end latency of every committed record (source timestamp to commit)."""
        self.next_offsets: dict[int, int] = {}
        self.delivery_error: KafkaError | None = None
        self.producer_fatal: KafkaError | None = None
        #: Why the last failed transaction failed when the destination refused a record (too large, its
        #: timestamp, no key for a compacted topic: every transaction holding it fails, so the flow waits for an
        #: operator), until a commit succeeds.
        self.refused_record = ""
        #: Where records failed, by the error's text: the first (topic, partition) each text was told for, by
        #: the producer's log or a produce() or delivery error (`refused_at`), until a commit succeeds. By text,
        #: not the last told: a rebuild purges the rest of the transaction, and those reports ("Local: Purged
        #: in queue", other partitions) came after the refusal's and hid its partition (under load, in CI).
        self._refused_at: dict[str, tuple[str, int]] = {}
        #: The status's `RefusedRecord` of refused_record (None with it "").
        self._refused_status: control_pb2.RefusedRecord | None = None
        self._refusals = RepeatFilter()
        self.consecutive_failures = 0
        #: When the last of them failed (monotonic), for `commits_failing`.
        self._failed_at = 0.0
        self.commit_times = RecentDurations()
        self.flush_times = RecentDurations()
        #: Set while a rebuild is due and not yet done (a failed init_transactions is retried by recover()).
        self._rebuild_due = False
        #: When a producer of ours was last replaced (monotonic), until a fence is forgiven for it.
        self._replaced_at: float | None = None
        #: When the loop last went round (`note_alive`), and when it last found itself frozen for longer than
        #: transaction.timeout.ms (SIGSTOP, a stalled VM): a fence soon after that is our own expiry's.
        self._alive_at = time.monotonic()
        self._stalled_at: float | None = None

    def commits_failing(self) -> int:
        """Consecutive failed commits, while the last failed under FAILED_COMMITS_PAUSE_S ago (else 0).

        A deduper with nothing to write commits nothing, so only a commit resets the count: unbounded, a
        pause of the wrappers for failed commits would outlive its cause, and no data would come to end it.
        """
        if time.monotonic() - self._failed_at >= FAILED_COMMITS_PAUSE_S:
            return 0
        return self.consecutive_failures

    # ------------------------------------------------------------- producer
    def start(self) -> None:
        """Build the producer and initialise its transactions (exactly-once): one attempt.

        Repeatable: start-up runs it as a step that waits out transient faults within
        ``deduper.startup_timeout_s`` (a destination broker down as the deduper starts), not within the
        call's own budget. A producer the last attempt left unusable (a fatal error, a call the watchdog
        abandoned) is replaced first.
        """
        if self._rebuild_due or not self._producer_made:
            self._new_producer()
        try:
            self._init_transactions(budget_s=None)
        except KafkaException as exc:
            if classify(exc) is not ErrorClass.RETRIABLE:  # retried on the same producer, as librdkafka allows
                self._rebuild_due = True
            raise
        self._rebuild_due = False

    def on_producer_error(self, err: KafkaError) -> None:
        """error_cb: keep a fatal error's real cause (later calls report a generic _FATAL)."""
        if err.fatal():
            self.producer_fatal = err
            _log.error("destination producer: %s", err)
        else:
            self._health.client_error(err, "producer")

    def call(self, fn: Callable[[], T], what: str) -> T:
        """Run a blocking producer call under the watchdog (deadline CALL_TIMEOUT_S + GRACE_S)."""
        try:
            return self._watchdog.call(fn, what=what, deadline_s=CALL_TIMEOUT_S + GRACE_S, client=self.producer)
        except WedgedCallError:
            self.stats.wedged_calls += 1
            self._rebuild_due = True
            raise
        except SystemError as exc:
            # confluent-kafka's flush() once raised "<class 'str'> returned a result with an exception set"
            # while a twin's fence failed the records in flight (a clean-clone CI run): the exception
            # escaped every handler and the process died with a traceback instead of exit code 3. The
            # client is unusable either way: recovery classifies it by its fatal error (a fence stops us).
            raise KafkaOperationError(what, exc) from exc

    def _retrying(self, fn: Callable[[float], T], what: str, budget_s: float) -> T:
        """fn(timeout) under the watchdog, retriable errors retried within budget_s."""
        return retry_retriable(lambda: self.call(lambda: fn(CALL_TIMEOUT_S), what), what=what, budget_s=budget_s)

    def _init_transactions(self, *, budget_s: float | None) -> None:
        """init_transactions, retried within budget_s (None: one attempt; the caller retries)."""
        if not self.exactly_once:
            return
        try:
            if budget_s is None:
                self.call(lambda: self.producer.init_transactions(CALL_TIMEOUT_S), "init_transactions")
            else:
                self._retrying(self.producer.init_transactions, "init_transactions", budget_s)
        except KafkaException as exc:
            # Before the fencing check: librdkafka files a missing transactional-id ACL under fencing.
            denied = authorization_error(exc, operation="use transactional id", resource=self.transactional_id)
            if denied is not None:
                raise denied from exc
            if classify(exc) is ErrorClass.FENCED:
                raise FencedError(f"{self.transactional_id}: {exc}") from exc
            raise

    @property
    def settled(self) -> bool:
        """No transaction open and no producer rebuild due: nothing for a recovery to resolve."""
        return not self.open and not self._rebuild_due

    def fence_may_be_ours(self, exc: BaseException) -> bool:
        """Whether exc, a fence, may be of our own making rather than a twin's; such a fence goes to `recover`.

        Ours: a producer of ours replaced less than transaction.timeout.ms ago (its late epoch bump; forgiven
        once per replacement), or the open transaction has outlived transaction.timeout.ms, so the coordinator
        may have aborted it and bumped our epoch (transaction.version 2 does; seen in a chaos run at load ~98,
        where a commit's flush took seconds: the deduper exited as if a twin had fenced it). The
        coordinator's clock starts at the transaction's first partition, after ours: younger than the timeout
        by our clock, it cannot have expired.
        """
        now, timeout_s = time.monotonic(), self._dc.transaction_timeout_ms / 1000
        recent = self._replaced_at is not None and now - self._replaced_at < timeout_s
        outlived = self.open and now - self.started >= timeout_s
        return (recent or outlived or self.stalled()) and isinstance(exc, (KafkaException, KafkaOperationError))

    def note_alive(self) -> None:
        """The loop goes round (called once per iteration): notes a freeze longer than transaction.timeout.ms."""
        now = time.monotonic()
        if now - self._alive_at >= self._dc.transaction_timeout_ms / 1000:
            self._stalled_at = now
        self._alive_at = now

    def stalled(self) -> bool:
        """Whether this process was frozen longer than transaction.timeout.ms, now or less than that ago.

        A process frozen that long (a zombie pause: SIGSTOP, a stalled VM) has had its transaction
        expired by the coordinator, which bumps the epoch (transaction.version 2), whether or not it
        still counts a transaction as open: a fence in the next transaction.timeout.ms is its own (a CI
        chaos run: a deduper paused 14 s against a 10 s timeout was fenced at its next AddPartitionsToTxn
        and exited as if a twin had taken over).
        """
        now, timeout_s = time.monotonic(), self._dc.transaction_timeout_ms / 1000
        return now - self._alive_at >= timeout_s or (
            self._stalled_at is not None and now - self._stalled_at < timeout_s
        )

    def rebuild(self, *, after_own_fence: bool = False) -> None:
        """Replace the producer; init_transactions resolves whatever the old one left open."""
        self._replaced_at = None if after_own_fence else time.monotonic()
        self.stats.producer_rebuilds += 1
        self._rebuild_due = True
        _log.warning("rebuilding the destination producer (%s)", self.transactional_id)
        began = time.monotonic()
        self._new_producer()
        self._init_transactions(budget_s=self._dc.operation_timeout_s * 4)
        self._rebuild_due = False
        _log.info("the new destination producer is ready after %.1f s", time.monotonic() - began)

    def _new_producer(self) -> None:
        """Replace the producer (the first: make it); the old one is purged unless the watchdog abandoned it."""
        if self._producer_made:
            old = self.producer
            if not any(client is old for _w, client, _f in self._watchdog.abandoned):
                old.purge()  # an abandoned producer is never touched again: a call of its may still be running
        if self._watchdog.exhausted:
            raise KafkaOperationError(
                "destination producer",
                RuntimeError(f"{len(self._watchdog.abandoned)} producers abandoned; restart to reclaim them"),
            )
        self.producer_fatal = None
        self.producer, self.direct = self._make_producer()
        self._producer_made = True

    # ------------------------------------------------------------ lifecycle
    def begin(self) -> None:
        """Open a transaction if none is open."""
        if self.open:
            return
        if self.exactly_once:
            self.producer.begin_transaction()
        self._refused_at = {}  # what the log tells from now on is this transaction's (`_told_cause`)
        self.open = True
        self.started = time.monotonic()
        self.records = 0

    def due(self, min_age_s: float) -> bool:
        """The open transaction is old enough, or big enough, to commit."""
        return self.open and (
            self.records >= self._dc.transaction_max_records or time.monotonic() - self.started >= min_age_s
        )

    def clear(self) -> None:
        """Forget the open transaction's work (after its commit or abort)."""
        self.pending.clear()
        self.slices.clear()
        self.timestamps.clear()
        self.next_offsets.clear()
        self.open = False
        self.records = 0
        self.delivery_error = None

    def commit(
        self,
        *,
        staging_topic: str,
        group_metadata: Callable[[], object],
        write_state: Callable[[], None],
        commit_consumer_offsets: Callable[[list[TopicPartition]], object],
        offsets_metadata: str = "",
        in_callback: bool = False,
    ) -> dict[PartitionKey, PartitionState]:
        """Commit: records, then write_state() (watermarks, offset map), staging offsets, EndTxn.

        Args:
            staging_topic: the topic of next_offsets.
            group_metadata: the staging consumer's group metadata (exactly-once: sent with the offsets).
            write_state: produces the state and offset-map records of the transaction.
            commit_consumer_offsets: at-least-once: commits the staging offsets on the consumer.
            offsets_metadata: committed with each staging offset (``staging_offsets_metadata``).
            in_callback: called from the consumer's rebalance callback (inside its ``consume()``): the
                staging offsets are committed on this thread. confluent-kafka-python (2.16) makes a call
                on the consumer from another thread, the watchdog's, wait for the callback to return.

        Returns:
            The states the transaction committed.

        Raises:
            KafkaException, KafkaOperationError, WedgedCallError: the caller recovers (``recover``).
        """
        budget = self._dc.operation_timeout_s
        started = time.monotonic()
        if self.slices or not self.exactly_once:
            # The offset map needs destination offsets, known once delivered. And without a
            # transaction, the watermarks written next must not move past a record that is not
            # delivered: they are visible (and restored from) as soon as they are written.
            self._flush_delivered()
            self.flush_times.add(time.monotonic() - started)
        elif self.delivery_error is not None:
            raise KafkaException(self.delivery_error)
        write_state()
        offsets = [
            TopicPartition(staging_topic, sp, nxt, metadata=offsets_metadata) for sp, nxt in self.next_offsets.items()
        ]
        if self.exactly_once:
            if offsets:
                group = group_metadata()
                self._retrying(
                    lambda t: self.producer.send_offsets_to_transaction(offsets, group, t),
                    "send_offsets_to_transaction",
                    budget,
                )
            self._retrying(self.producer.commit_transaction, "commit_transaction", budget)
        else:
            self._flush_delivered()  # the watermarks and the offset map
            if offsets:
                what = "committing staging offsets"
                retry_retriable(
                    (lambda: commit_consumer_offsets(offsets))
                    if in_callback
                    else lambda: self.call(lambda: commit_consumer_offsets(offsets), what),
                    what=what,
                    budget_s=budget,
                )
        self.latency.observe(self.timestamps, time.time_ns() // 1_000_000)
        committed = dict(self.pending)
        self.clear()
        self.consecutive_failures = 0
        if self.refused_record:
            _log.info("a commit succeeded: the destination takes the record it refused now")
            self.refused_record = ""
        self._refused_at = {}
        self._refused_status = None
        self.stats.committed += 1
        self.commit_times.add(time.monotonic() - started)
        self._health.up()
        return committed

    def _flush_delivered(self) -> None:
        """Flush the producer; raise the first failed delivery, or a timeout with records left.

        Flushed in CALL_TIMEOUT_S attempts for up to operation_timeout_s: a
        partition leader moving to another broker holds deliveries back for
        5-13 s (three local brokers), and the transaction need not be aborted
        for that (a single 5 s attempt aborted one per leader change).
        """
        deadline = time.monotonic() + self._dc.operation_timeout_s
        while True:
            remaining = self.call(lambda: self.producer.flush(CALL_TIMEOUT_S), "flushing destination records")
            if self.delivery_error is not None:
                raise KafkaException(self.delivery_error)
            if not remaining:
                return
            if time.monotonic() >= deadline:
                raise KafkaOperationError("flushing destination records", TimeoutError(f"{remaining} left"))

    # ------------------------------------------------------------- recovery
    def recover(self, exc: BaseException, what: str) -> None:
        """Handle a failed transactional step by class; the caller then rewinds to the last commit.

        Raises:
            FencedError: a live twin took our transactional.id over.
            KafkaException, KafkaOperationError, WedgedCallError: the recovery itself
                failed (the cluster is still away); call again later.
        """
        if self._rebuild_due:
            self.clear()
            self.rebuild()
            return
        cls, exc = self._class_of(exc)
        own_fence = False
        replaced_s = time.monotonic() - self._replaced_at if self._replaced_at is not None else None
        if cls is ErrorClass.FENCED and replaced_s is not None and replaced_s * 1000 < self._dc.transaction_timeout_ms:
            _log.warning(
                "%s: fenced %.1f s after this deduper replaced its own producer: most likely that producer's late "
                "epoch bump, not a twin; rebuilding (another fence before the next replacement stops the deduper)",
                what,
                replaced_s,
            )
            cls, own_fence = ErrorClass.FATAL, True
        if cls is ErrorClass.FENCED:
            # A replacement's fence was taken above; what is left is ours only if the transaction outlived
            # its timeout or the process was frozen past it (`fence_may_be_ours`, the one rule for both paths).
            if not self.fence_may_be_ours(exc):
                raise FencedError(
                    f"{what}: transactional.id {self.transactional_id} was taken over by another deduper "
                    f"instance ({exc}); two live processes must not share an instance id"
                ) from exc
            cls = ErrorClass.FATAL  # ours: expired by the coordinator
        # A refused record is told as an ERROR once per 30 s (`_note_refused`), not per try.
        level = logging.DEBUG if record_refused(exc) is not None else logging.WARNING
        _log.log(level, "%s failed (%s, %s): rewinding to the last commit", what, cls.value, exc)
        self._note_refused(exc)
        self.stats.aborted += 1
        if not is_stale_generation(exc):
            # A rebalance or a fence of the staging consumer is the group's business: the wrappers pause
            # for failed commits only when the destination itself refuses them.
            self.consecutive_failures += 1
            self._failed_at = time.monotonic()
        if cls is ErrorClass.ABORTABLE and self.exactly_once:
            try:
                self._retrying(self.producer.abort_transaction, "abort_transaction", self._dc.operation_timeout_s)
            except (KafkaException, KafkaOperationError, WedgedCallError) as abort_exc:
                # A fence at the abort is a twin's unless it may be ours: a zombie pause past
                # transaction.timeout.ms loses the staging partitions (abortable) and, meanwhile, the
                # coordinator expired the transaction and bumped our epoch (a CI chaos run: SIGSTOP 14 s
                # against a 10 s timeout, and the deduper exited as fenced with no twin alive).
                if (
                    isinstance(abort_exc, KafkaException)
                    and classify(abort_exc) is ErrorClass.FENCED
                    and not self.fence_may_be_ours(abort_exc)
                ):
                    raise FencedError(f"abort: {abort_exc}") from abort_exc
                cls = ErrorClass.FATAL
        self.clear()
        if cls is not ErrorClass.ABORTABLE or not self.exactly_once:
            self.rebuild(after_own_fence=own_fence)

    def _told_cause(self, exc: BaseException) -> BaseException:
        """A produce() refused with ``_STATE`` in a transaction a refused record failed: that refusal, else exc.

        Asked once the producer's events are served: confluent-kafka hands log lines (the TXNERR line) over in poll().

        Classified as the refusal (abortable: aborted, not rebuilt) and named (`_note_refused`). Before, the
        ``_STATE`` read as fatal, the producer was rebuilt, and the refusal went unnamed: with other partitions
        written beside a held one, a probe failed that way four or five times in a row before one failure told
        the refusal (the wrappers paused meanwhile for failed commits).
        """
        err = kafka_error_of(exc)
        if err is None or err.code() != KafkaError._STATE:
            return exc
        told = refusal_told(list(self._refused_at))
        return KafkaException(told) if told is not None else exc

    def refused_at(self, topic: str, partition: int, reason: str) -> None:
        """Where a record failed: the producer's log (any thread), produce() or a delivery report said so.

        The exception the commit raises names no partition; `_note_refused` names this one when its text
        is the refusal's.
        """
        if len(self._refused_at) < _REFUSALS_KEPT:  # bounded: one text per cause, a purge adds one more
            self._refused_at.setdefault(reason, (topic, partition))  # atomic under the GIL (any thread)

    def _note_refused(self, exc: BaseException) -> None:
        """A record the destination refuses: name the cause and the remedy (ERROR, once per 30 s with a count)."""
        err = record_refused(exc)
        if err is None:
            return
        where = self._refused_at.get(err.str(), ("", -1))
        at = f" for {where[0]} partition {where[1]}" if where[0] else ""
        self._refused_status = control_pb2.RefusedRecord(topic=where[0], partition=where[1], error=err.name())
        if err.code() == KafkaError.INVALID_TIMESTAMP:
            remedy = (
                "its timestamp is outside what the destination topic takes: widen its message.timestamp.before.max.ms "
                "and message.timestamp.after.max.ms (message.timestamp.difference.max.ms before Kafka 3.6) to the "
                "source topic's"
            )
        elif err.code() == KafkaError.INVALID_RECORD:
            remedy = (
                "the destination topic's configuration does not take it: a compacted topic (cleanup.policy compact) "
                "takes no record without a key; make the topic's configuration match the source topic's"
            )
        else:
            remedy = (
                "it is too large: raise that destination topic's max.message.bytes (and the brokers' "
                f"message.max.bytes, or deduper.max_message_bytes = {self._dc.max_message_bytes} if the record "
                "is larger)"
            )
        self.refused_record = (
            f"the destination refuses a record{at} ({err.name()}: {err.str()}): {remedy}; nothing past it is skipped"
        )
        repeats = self._refusals.admit(err.code())
        if repeats is not None:
            held = f" ({repeats[0]} more such failures in the last {repeats[1]:.0f} s)" if repeats[0] else ""
            _log.error("%s%s", self.refused_record, held)

    def refusal(self) -> tuple[control_pb2.RefusedRecord, str] | None:
        """The refused record the last failure named a partition for, and the refusal's text; None otherwise."""
        status = self._refused_status
        if not self.refused_record or status is None or not status.topic:
            return None
        return status, self.refused_record

    def refusal_held(self) -> None:
        """The caller holds the refused record's staging partition: the flow no longer waits for it here.

        Nor is the failure counted as a failing commit (which pauses the wrappers): the destination answers.
        """
        self.refused_record = ""
        self._refused_status = None
        self.consecutive_failures = 0

    def _class_of(self, exc: BaseException) -> tuple[ErrorClass, BaseException]:
        """The failure's class, and its cause (`_told_cause`) for the caller to name."""
        if isinstance(exc, WedgedCallError):
            return ErrorClass.FATAL, exc
        # Serve pending events: a fatal error reaches error_cb only through poll(), and until then calls
        # fail with a generic _FATAL; the producer's log lines (a refusal's TXNERR) come the same way.
        self._serve_events()
        exc = told = self._told_cause(exc)
        if self.producer_fatal is not None:
            exc = KafkaException(self.producer_fatal)  # the real reason behind a generic _FATAL
        cls = classify(exc) if isinstance(exc, KafkaException) else ErrorClass.FATAL
        if cls is ErrorClass.RETRIABLE:
            cls = ErrorClass.FATAL  # retries exhausted: the outcome is unknown
        if cls is ErrorClass.FATAL and self.exactly_once:
            real = self._fatal_cause()
            if real is not None:
                cls = classify(real)
        return cls, told

    def _serve_events(self) -> None:
        """Serve the producer's pending events (error_cb, delivery reports, log lines) to classify a failure."""
        try:
            self.call(lambda: self.producer.poll(0), "serving producer events")
        except KafkaException as served:
            # poll() itself can raise the producer's fatal error instead of handing it to error_cb (a
            # deduper frozen past transaction.timeout.ms, on real brokers): it is the cause being classified,
            # never a failure of the recovery (it escaped as a twin's fence and the deduper exited).
            served_err = kafka_error_of(served)
            if served_err is None or not served_err.fatal():
                raise
            if self.producer_fatal is None:
                self.producer_fatal = served_err

    def _fatal_cause(self) -> KafkaError | None:
        """The producer's own fatal error, if it is in a fatal state.

        Failed produce/flush calls report generic codes (_FATAL, _PURGE_QUEUE)
        and error_cb may not have run yet; a transactional call on a producer in
        a fatal state returns the fatal error itself. Only asked when the
        producer is about to be replaced anyway, so the abort it may do is moot.
        """
        try:
            self.call(lambda: self.producer.abort_transaction(1.0), "abort_transaction (probe)")
        except KafkaException as exc:
            err = kafka_error_of(exc)
            if err is not None and err.fatal():
                return err
        except WedgedCallError:
            pass
        return None

    def abort_quietly(self) -> None:
        """Abort at shutdown; a failure is left to the coordinator's transaction timeout."""
        if self.exactly_once and self.open:
            try:
                self.call(lambda: self.producer.abort_transaction(CALL_TIMEOUT_S), "abort_transaction")
            except (KafkaException, WedgedCallError) as exc:
                _log.warning("abort at shutdown failed (%s); the coordinator aborts it on timeout", exc)
        self.clear()

    def close(self) -> None:
        """Flush what is left (bounded) and stop the watchdog's worker."""
        try:
            self.call(lambda: self.producer.flush(CALL_TIMEOUT_S), "flushing the destination producer at shutdown")
        except (KafkaException, WedgedCallError) as exc:
            _log.warning("flushing the destination producer at shutdown: %s", exc)
        self._watchdog.shutdown()

    def status_fields(self) -> dict[str, Any]:
        """Commit timings and a refused record, for the status RPC."""
        return {
            "commit_p50_ms": self.commit_times.median_ms(),
            "commit_max_ms": self.commit_times.max_ms(),
            "commit_flush_p50_ms": self.flush_times.median_ms(),
            "commit_seconds_total": self.commit_times.total_s(),
            "commit_flush_seconds_total": self.flush_times.total_s(),
            "refused_record": self._refused_status,
        }
