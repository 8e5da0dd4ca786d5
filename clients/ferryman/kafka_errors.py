"""Classification of librdkafka errors, in one place.

librdkafka already classifies every error (INTRODUCTION.md, "Transactional
Producer - Error handling"); this module turns those flags into one enum and
owns the retry-within-a-deadline policy, so the services handle Kafka errors by
class and never by scattered error-code checks.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from confluent_kafka import KafkaError, KafkaException
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_before_delay,
    wait_exponential,
)

from ferryman.errors import AuthorizationError, ClusterUnreachableError, KafkaOperationError, WedgedCallError

_log = logging.getLogger(__name__)

T = TypeVar("T")

#: A step retried through an outage warns at its first failure and then at most once per this many seconds.
RETRY_WARN_EVERY_S = 10.0

#: Error codes that mean another producer with our transactional.id (or a newer
#: epoch of it) exists. These are fatal for this producer instance.
_FENCING_CODES = frozenset(
    {
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    }
)

#: Authorization failures (a missing ACL), by the kind of resource the broker checked.
_AUTHORIZATION_CODES = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "topic",
    KafkaError.GROUP_AUTHORIZATION_FAILED: "consumer group",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "cluster",
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "transactional id",
    KafkaError.DELEGATION_TOKEN_AUTHORIZATION_FAILED: "delegation token",
}


def is_authorization_failure(err: KafkaError) -> bool:
    """A client's error event (or a message error) that says the cluster refused for lack of an ACL."""
    return err.code() in _AUTHORIZATION_CODES


def authorization_error(exc: BaseException, *, operation: str, resource: str = "") -> AuthorizationError | None:
    """The clear form of an authorization failure, or None when exc is not one.

    Args:
        exc: a KafkaException (or anything else: then None).
        operation: what was being done ("create topic", "join consumer group", ...).
        resource: the resource's name where the caller knows it.
    """
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    if not isinstance(err, KafkaError):
        return None
    kind = _AUTHORIZATION_CODES.get(err.code())
    if kind is None:
        return None
    what = f"{kind} {resource}" if resource else f"a {kind}"
    return AuthorizationError(
        f"not authorized to {operation} ({what}): the cluster refused it with {err.name()}. Grant this "
        f"client's principal that ACL on the {kind}, or fix the cluster's client credentials (client_config)"
    )


#: Consumer-group errors that mean our group generation is stale: a rebalance
#: moved partitions away while we worked, so the transaction must be aborted.
_STALE_GENERATION_CODES = frozenset(
    {
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.UNKNOWN_MEMBER_ID,
        KafkaError.REBALANCE_IN_PROGRESS,
        KafkaError.FENCED_INSTANCE_ID,
    }
)

#: Broker errors that clear by themselves (Kafka's RetriableException family:
#: leadership moving or not yet elected, a topic just created, a coordinator
#: loading). librdkafka flags them retriable on its own requests, but errors
#: returned by a plain call (get_watermark_offsets, list_offsets, ...) carry the
#: code only.
_TRANSIENT_CODES = frozenset(
    {
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        KafkaError.KAFKA_STORAGE_ERROR,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.OFFSET_NOT_AVAILABLE,
        # librdkafka's local states while a coordinator or every broker is away
        # (a broker restart): the request is waiting, nothing failed for good.
        KafkaError._WAIT_COORD,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._RESOLVE,
        # The client's metadata does not show a partition yet (a topic created a
        # moment ago, on a cluster of several brokers).
        KafkaError._UNKNOWN_PARTITION,
    }
)


class ErrorClass(enum.Enum):
    """What a caller must do about a Kafka error."""

    RETRIABLE = "retriable"
    """Retry the same call, within the caller's deadline."""
    ABORTABLE = "abortable"
    """Abort the open transaction, rewind to the committed offsets, go on."""
    FENCED = "fenced"
    """Another instance owns our identity: stop writing for good."""
    FATAL = "fatal"
    """The client instance is unusable: rebuild it and rewind."""


def kafka_error_of(exc: BaseException) -> KafkaError | None:
    """Return the KafkaError carried by exc, if any."""
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None


#: A record (or its batch) larger than the destination accepts: the broker's topic max.message.bytes, or the
#: producer's own message.max.bytes. Not transient in fact: it fails every transaction that holds the record.
_TOO_LARGE_CODES = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE})
#: Records a topic's configuration refuses, as every transaction holding them fails: too large, a timestamp
#: outside ``message.timestamp.before/after.max.ms``, a record without a key for a compacted topic.
_REFUSED_CODES = _TOO_LARGE_CODES | {KafkaError.INVALID_TIMESTAMP, KafkaError.INVALID_RECORD}


def _carried(exc: BaseException) -> KafkaError | None:
    """The KafkaError of exc, or of the KafkaException a KafkaOperationError wraps."""
    err = kafka_error_of(exc)
    if err is None and isinstance(exc, KafkaOperationError) and isinstance(exc.__cause__, BaseException):
        err = kafka_error_of(exc.__cause__)
    return err


def record_too_large(exc: BaseException) -> KafkaError | None:
    """The error of exc when a record was refused as too large (``MSG_SIZE_TOO_LARGE``, ``RECORD_LIST_TOO_LARGE``)."""
    err = _carried(exc)
    return err if err is not None and err.code() in _TOO_LARGE_CODES else None


def record_refused(exc: BaseException) -> KafkaError | None:
    """The error of exc when a topic's configuration refused a record: too large, its timestamp, no key."""
    err = _carried(exc)
    return err if err is not None and err.code() in _REFUSED_CODES else None


#: librdkafka's text of each refusal's error (``KafkaError(code).str()``: "Broker: Message size too large"), as a
#: transactional producer's TXNERR line tells what failed its transaction.
_REFUSED_BY_TEXT = {KafkaError(code).str(): code for code in sorted(_REFUSED_CODES)}


def refusal_told(texts: Iterable[str]) -> KafkaError | None:
    """The refusal among error texts a transactional producer's log told, as the abortable error it is; else None.

    A record the destination refuses fails the transaction when its produce request is answered; the
    next produce() into that transaction raises only ``_STATE`` ("Erroneous state"), and the refusal is
    told in the producer's log alone (``LibrdkafkaLog``'s ``on_produce_failed``).
    """
    for text in texts:
        code = _REFUSED_BY_TEXT.get(text)
        if code is not None:
            return KafkaError(code, text, txn_requires_abort=True)
    return None


def classify(error: KafkaError | BaseException) -> ErrorClass:
    """Classify a librdkafka error (or an exception carrying one).

    Exceptions that carry no KafkaError are FATAL: we do not know what state the
    client is in.
    """
    err = error if isinstance(error, KafkaError) else kafka_error_of(error)
    if err is None:
        return ErrorClass.FATAL
    if err.code() in _FENCING_CODES:
        return ErrorClass.FENCED
    if err.fatal():
        return ErrorClass.FATAL
    if err.txn_requires_abort() or err.code() in _STALE_GENERATION_CODES:
        return ErrorClass.ABORTABLE
    if err.retriable() or err.code() in _TRANSIENT_CODES:
        return ErrorClass.RETRIABLE
    return ErrorClass.FATAL


def is_stale_generation(exc: BaseException) -> bool:
    """Our consumer-group generation is gone (a rebalance, our member fenced): the group's trouble, not a cluster's."""
    err = kafka_error_of(exc)
    return err is not None and err.code() in _STALE_GENERATION_CODES


def is_fatal_client_error(err: KafkaError) -> bool:
    """A client's error event that leaves the client unusable.

    librdkafka raises a consumer's fatal error (a static member fenced) as code
    ``_FATAL`` with ``fatal()`` False on error events, the cause only in the text.
    """
    return err.fatal() or err.code() == KafkaError._FATAL


def is_membership_fence(err: KafkaError) -> bool:
    """A static consumer-group member fenced by another with its ``group.instance.id``."""
    return err.code() in (KafkaError._FENCED, KafkaError.FENCED_INSTANCE_ID) or "fenced" in err.str().lower()


class FenceWindow:
    """Tells our own earlier session from a live twin when a static consumer is fenced.

    Two ways our own consumer gets fenced with our own instance id, both seen on real brokers:

    * its session timed out (the coordinator was away or frozen: ``SESSTMOUT`` in librdkafka's log), and
      its rejoin replaced the member it had been: the fence comes when the coordinator answers again;
    * right after a broker restart, the coordinator fences it with its own retried JoinGroup.

    A fence after the consumer's own session timeout, before it is assigned partitions again, is ours and
    not counted. Of the others, the first in ``WINDOW_S`` replaces the consumer; a second means another
    live process uses the instance id, and the caller stops (exit 3). A twin's fence never follows a
    session timeout of ours: it fences a member in good standing.
    """

    #: How a service's log says that a fence was its own consumer's rejoin after a session timeout.
    OWN_REJOIN = "our own rejoin after our session timed out"

    WINDOW_S = 120.0

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._fences: list[float] = []
        self._consumer = 0
        #: When the consumer's own session timed out (None: in good standing since its last assignment).
        self._lost_at: float | None = None

    def consumer_built(self) -> Callable[[], None]:
        """Follow a new consumer; returns the hook its log calls on a session timeout.

        A replaced consumer is parked, not closed, so its log can still speak: its hook does nothing.
        """
        self._consumer += 1
        self._lost_at = None
        consumer = self._consumer

        def session_lost() -> None:
            if consumer == self._consumer and self._lost_at is None:
                self._lost_at = self._clock()

        return session_lost

    @property
    def session_lost(self) -> bool:
        """The consumer's own session timed out and it has not been assigned partitions since."""
        return self._lost_at is not None

    def lost_for(self) -> float:
        """Seconds since the consumer's own session timed out, if it has not been assigned partitions since; else 0."""
        return 0.0 if self._lost_at is None else self._clock() - self._lost_at

    def assigned(self) -> None:
        """The consumer is in the group again (an assignment): its next fence is counted."""
        self._lost_at = None

    def twin(self) -> bool:
        """Record a fence now; True if another one fell within the window (ours are not recorded)."""
        if self.session_lost:
            return False
        now = self._clock()
        self._fences = [t for t in self._fences if now - t < self.WINDOW_S] + [now]
        return len(self._fences) > 1


def is_transient(exc: BaseException) -> bool:
    """Whether exc is a fault that clears by itself: wait it out and rewind, never exit.

    Retriable Kafka errors (also after their retry budget ran out), abortable
    ones, a fatal error of one client instance (rebuilt), and a call abandoned
    by the watchdog. Fencing and Ferryman's own refusals (configuration, data
    loss, topic shape) are not transient: a restart would not fix them.
    """
    if isinstance(exc, WedgedCallError):
        return True
    if isinstance(exc, KafkaOperationError):
        cause = exc.__cause__
        return cause is None or not isinstance(cause, KafkaException) or classify(cause) is not ErrorClass.FENCED
    if isinstance(exc, KafkaException):
        return classify(exc) is not ErrorClass.FENCED
    return False


def _is_retriable(exc: BaseException) -> bool:
    return classify(exc) is ErrorClass.RETRIABLE


def retry_retriable(op: Callable[[], T], *, what: str, budget_s: float) -> T:
    """Run op, retrying only retriable Kafka errors until budget_s has elapsed.

    Non-retriable errors propagate unchanged on the first occurrence so that the
    caller can act on their class. When the budget runs out the last retriable
    error is wrapped in KafkaOperationError.

    Args:
        op: the call to make; it must be safe to repeat (librdkafka's
            transactional calls are, when they fail with a retriable error).
        what: short description for logs and the error message.
        budget_s: total time allowed, including waits between attempts.
    """
    # 50 ms first: CONCURRENT_TRANSACTIONS clears within tens of ms
    # (KAFKA-5477); capped at 1 s so a long outage is polled, not slept.
    retrying = _retrying(_is_retriable, budget_s, what=what, first_s=0.05, most_s=1.0)
    try:
        return retrying(op)
    except KafkaException as exc:
        if _is_retriable(exc):
            raise KafkaOperationError(f"{what} did not succeed within {budget_s:.0f}s", exc) from exc
        raise


def wait_out_transient(op: Callable[[], T], *, what: str, budget_s: float, setting: str) -> T:
    """Run op, repeating it while it fails on a transient fault (``is_transient``) until budget_s has elapsed.

    For start-up steps after the cluster first answered (making internal topics, describing them): a
    broker restart or a slow cluster then is a wait, not an exit. Other errors propagate at once.

    Raises:
        ClusterUnreachableError: still failing on a transient fault when the budget (the setting named)
            was spent, as when the cluster does not answer at all (exit code 5).
    """
    try:
        return _retrying(is_transient, budget_s, what=what, first_s=0.5, most_s=5.0)(op)
    except Exception as exc:
        if not is_transient(exc):
            raise
        raise ClusterUnreachableError(
            f"{what} did not succeed within {budget_s:g} s at start-up ({setting}): {exc}"
        ) from exc


def _retrying(
    retry: Callable[[BaseException], bool], budget_s: float, *, what: str, first_s: float, most_s: float
) -> Retrying:
    """Retries while retry(error), waits first_s doubling up to most_s; the last error re-raised.

    Each wait is logged: the first as a WARNING, then one WARNING per `RETRY_WARN_EVERY_S` (an outage polled
    once a second for 30 s is three lines, not thirty) and the others at DEBUG.
    """
    started = time.monotonic()
    warned_at: list[float] = []

    def log_wait(state: RetryCallState) -> None:
        # tenacity's own before_sleep_log names the callable (a lambda here); an operator wants the step.
        error = state.outcome.exception() if state.outcome is not None else None
        wait_s = state.next_action.sleep if state.next_action is not None else 0.0
        now = time.monotonic()
        quiet = bool(warned_at) and now - warned_at[-1] < RETRY_WARN_EVERY_S
        if not quiet:
            warned_at.append(now)
        _log.log(
            logging.DEBUG if quiet else logging.WARNING,
            "%s failed (%s); trying again in %.2g s (%.0f s left, attempt %d)",
            what,
            error,
            wait_s,
            budget_s - (now - started),
            state.attempt_number,
        )

    return Retrying(
        retry=retry_if_exception(retry),
        # stop_before_delay: never start a wait that would end past the budget.
        stop=stop_before_delay(budget_s),
        wait=wait_exponential(multiplier=first_s, max=most_s),
        before_sleep=log_wait,
        reraise=True,
    )
