"""Kafka errors by class (ferryman.kafka_errors), on real confluent_kafka.KafkaError objects."""

from __future__ import annotations

import logging
import time

import pytest
from confluent_kafka import KafkaError, KafkaException
from ferryman.errors import (
    AuthorizationError,
    ClusterUnreachableError,
    ConfigError,
    FerrymanError,
    KafkaOperationError,
)
from ferryman.kafka_errors import (
    ErrorClass,
    authorization_error,
    classify,
    kafka_error_of,
    record_refused,
    record_too_large,
    retry_retriable,
    wait_out_transient,
)


def err(code: int, *, fatal: bool = False, retriable: bool = False, txn_requires_abort: bool = False) -> KafkaError:
    return KafkaError(
        code, f"test error {code}", fatal=fatal, retriable=retriable, txn_requires_abort=txn_requires_abort
    )


def test_the_constructor_sets_the_flags_classify_reads() -> None:
    e = err(KafkaError._STATE, fatal=True, retriable=True, txn_requires_abort=True)
    assert (e.code(), e.fatal(), e.retriable(), e.txn_requires_abort()) == (KafkaError._STATE, True, True, True)
    plain = KafkaError(KafkaError._STATE)
    assert (plain.fatal(), plain.retriable(), plain.txn_requires_abort()) == (False, False, False)


# ---------------------------------------------------------------- classify


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        # Another producer owns our transactional.id: fenced, whatever the flags say.
        (err(KafkaError._FENCED, fatal=True), ErrorClass.FENCED),
        (err(KafkaError._FENCED), ErrorClass.FENCED),
        (err(KafkaError.PRODUCER_FENCED), ErrorClass.FENCED),
        (err(KafkaError.PRODUCER_FENCED, fatal=True), ErrorClass.FENCED),
        (err(KafkaError.PRODUCER_FENCED, txn_requires_abort=True), ErrorClass.FENCED),
        (err(KafkaError.INVALID_PRODUCER_EPOCH, fatal=True), ErrorClass.FENCED),
        (err(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, fatal=True), ErrorClass.FENCED),
        # Fatal: rebuild the client; fatal wins over the softer flags.
        (err(KafkaError._FATAL, fatal=True), ErrorClass.FATAL),
        (err(KafkaError._STATE, fatal=True, txn_requires_abort=True), ErrorClass.FATAL),
        (err(KafkaError._TIMED_OUT, fatal=True, retriable=True), ErrorClass.FATAL),
        (err(KafkaError.UNSUPPORTED_VERSION, fatal=True), ErrorClass.FATAL),
        # Abortable: abort, rewind, begin again; abort wins over retriable.
        (err(KafkaError._STATE, txn_requires_abort=True), ErrorClass.ABORTABLE),
        (err(KafkaError.NOT_ENOUGH_REPLICAS, txn_requires_abort=True, retriable=True), ErrorClass.ABORTABLE),
        (err(KafkaError.ILLEGAL_GENERATION), ErrorClass.ABORTABLE),
        (err(KafkaError.UNKNOWN_MEMBER_ID), ErrorClass.ABORTABLE),
        (err(KafkaError.REBALANCE_IN_PROGRESS), ErrorClass.ABORTABLE),
        # Retriable: same call again within the budget.
        (err(KafkaError.COORDINATOR_NOT_AVAILABLE, retriable=True), ErrorClass.RETRIABLE),
        (err(KafkaError.CONCURRENT_TRANSACTIONS, retriable=True), ErrorClass.RETRIABLE),
        (err(KafkaError._TIMED_OUT), ErrorClass.RETRIABLE),
        (err(KafkaError._TRANSPORT), ErrorClass.RETRIABLE),
        # Transient broker errors returned by plain calls carry the code only, no flag.
        (err(KafkaError.NOT_LEADER_FOR_PARTITION), ErrorClass.RETRIABLE),
        (err(KafkaError.LEADER_NOT_AVAILABLE), ErrorClass.RETRIABLE),
        (err(KafkaError.UNKNOWN_TOPIC_OR_PART), ErrorClass.RETRIABLE),
        (err(KafkaError.NOT_COORDINATOR), ErrorClass.RETRIABLE),
        # Anything else we do not understand is fatal.
        (err(KafkaError.TOPIC_AUTHORIZATION_FAILED), ErrorClass.FATAL),
        (err(KafkaError._INVALID_ARG), ErrorClass.FATAL),
    ],
    ids=lambda v: v.name() if isinstance(v, KafkaError) else None,
)
def test_classify(error: KafkaError, expected: ErrorClass) -> None:
    assert classify(error) is expected
    # The same error raised by a client call classifies the same.
    assert classify(KafkaException(error)) is expected


@pytest.mark.parametrize(
    "exc",
    [ValueError("not kafka"), RuntimeError(), KafkaException(), KafkaException("just a string"), BufferError()],
    ids=["ValueError", "RuntimeError", "KafkaException-empty", "KafkaException-str", "BufferError"],
)
def test_exceptions_without_a_kafka_error_are_fatal(exc: BaseException) -> None:
    assert classify(exc) is ErrorClass.FATAL


def test_kafka_error_of() -> None:
    e = err(KafkaError._TIMED_OUT)
    assert kafka_error_of(KafkaException(e)) is e
    assert kafka_error_of(KafkaException("x")) is None
    assert kafka_error_of(ValueError(e)) is None


# ---------------------------------------------------------------- retry_retriable


def test_retriable_errors_are_retried_until_success() -> None:
    calls = 0

    def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise KafkaException(err(KafkaError.COORDINATOR_LOAD_IN_PROGRESS, retriable=True))
        return "done"

    assert retry_retriable(flaky, what="committing", budget_s=5) == "done"
    assert calls == 3


def test_success_at_once_calls_once() -> None:
    calls = 0

    def op() -> int:
        nonlocal calls
        calls += 1
        return 42

    assert retry_retriable(op, what="x", budget_s=5) == 42
    assert calls == 1


def test_retriable_errors_past_the_budget_become_kafka_operation_error() -> None:
    calls = 0
    last = KafkaException(err(KafkaError._TIMED_OUT, retriable=True))

    def always() -> None:
        nonlocal calls
        calls += 1
        raise last

    with pytest.raises(KafkaOperationError, match="flushing the producer did not succeed") as info:
        retry_retriable(always, what="flushing the producer", budget_s=0.15)
    assert calls > 1
    assert info.value.__cause__ is last
    assert isinstance(info.value, FerrymanError)


def test_retrying_stays_within_the_budget() -> None:
    """budget_s is the total time allowed, including waits between attempts."""
    budget_s = 0.4

    def always() -> None:
        raise KafkaException(err(KafkaError._TIMED_OUT, retriable=True))

    started = time.monotonic()
    with pytest.raises(KafkaOperationError):
        retry_retriable(always, what="op", budget_s=budget_s)
    elapsed = time.monotonic() - started
    assert elapsed <= budget_s + 0.1, f"took {elapsed:.2f}s on a {budget_s}s budget"


@pytest.mark.parametrize(
    "error",
    [
        err(KafkaError._FENCED, fatal=True),
        err(KafkaError._FATAL, fatal=True),
        err(KafkaError._STATE, txn_requires_abort=True),
        err(KafkaError.ILLEGAL_GENERATION),
        err(KafkaError.TOPIC_AUTHORIZATION_FAILED),
    ],
    ids=lambda e: e.name(),
)
def test_non_retriable_kafka_errors_pass_through_at_once(error: KafkaError) -> None:
    calls = 0
    raised = KafkaException(error)

    def op() -> None:
        nonlocal calls
        calls += 1
        raise raised

    with pytest.raises(KafkaException) as info:
        retry_retriable(op, what="op", budget_s=5)
    assert info.value is raised
    assert not isinstance(info.value, KafkaOperationError)
    assert calls == 1


def test_foreign_exceptions_pass_through_at_once() -> None:
    calls = 0

    def op() -> None:
        nonlocal calls
        calls += 1
        raise ValueError("bug")

    with pytest.raises(ValueError, match="bug"):
        retry_retriable(op, what="op", budget_s=5)
    assert calls == 1


def test_a_retriable_error_then_a_fatal_one_surfaces_the_fatal_one() -> None:
    errors = [err(KafkaError._TRANSPORT, retriable=True), err(KafkaError._FENCED, fatal=True)]

    def op() -> None:
        raise KafkaException(errors.pop(0))

    with pytest.raises(KafkaException) as info:
        retry_retriable(op, what="op", budget_s=5)
    assert classify(info.value) is ErrorClass.FENCED


# ---------------------------------------------------------- consumer fences


def test_a_consumer_fence_is_recognised_by_code_or_by_the_text_of_a_generic_fatal_error() -> None:
    from ferryman.kafka_errors import is_fatal_client_error, is_membership_fence  # noqa: PLC0415

    generic = KafkaError(KafkaError._FATAL, "Fatal error: Broker: Static consumer fenced by other consumer")
    assert is_fatal_client_error(generic) and is_membership_fence(generic)
    assert is_membership_fence(err(KafkaError.FENCED_INSTANCE_ID))
    assert not is_fatal_client_error(err(KafkaError._TRANSPORT))
    assert not is_membership_fence(KafkaError(KafkaError._FATAL, "Fatal error: out of order sequence"))


def test_one_fence_is_our_own_session_a_second_within_the_window_a_twin() -> None:
    from ferryman.kafka_errors import FenceWindow  # noqa: PLC0415

    now = [0.0]
    window = FenceWindow(clock=lambda: now[0])
    assert not window.twin()
    now[0] += FenceWindow.WINDOW_S  # an old fence is forgotten
    assert not window.twin()
    now[0] += 1
    assert window.twin()


def test_a_fence_after_our_own_session_timeout_is_ours_until_we_are_assigned_again() -> None:
    """Seen in a chaos run: two session timeouts within a minute, each followed by our own rejoin's fence."""
    from ferryman.kafka_errors import FenceWindow  # noqa: PLC0415

    window = FenceWindow(clock=lambda: 0.0)
    session_lost = window.consumer_built()
    session_lost()
    assert not window.twin()  # ours: not counted
    session_lost = window.consumer_built()  # the fenced consumer is replaced
    session_lost()
    assert not window.twin()  # ours again, within the window: still not a twin
    window.consumer_built()
    window.assigned()
    assert not window.twin()  # a fence in good standing: the first is forgiven...
    window.consumer_built()
    window.assigned()
    assert window.twin()  # ...a second within the window is a twin


def test_a_session_timeout_counts_only_until_the_consumer_is_assigned_or_replaced() -> None:
    from ferryman.kafka_errors import FenceWindow  # noqa: PLC0415

    window = FenceWindow(clock=lambda: 0.0)
    first = window.consumer_built()
    assert not window.twin()  # the first fence in the window
    second = window.consumer_built()
    window.consumer_built()
    first()  # replaced consumers are parked, not closed: their logs still speak
    second()
    assert window.twin()  # the current consumer's session never timed out
    window = FenceWindow(clock=lambda: 0.0)
    window.consumer_built()()
    window.assigned()  # rejoined after its session timeout
    assert not window.twin()
    assert window.twin()


def test_the_librdkafka_log_reports_every_session_timeout_even_the_held_back_repeats() -> None:
    from ferryman.kafka_log import LibrdkafkaLog  # noqa: PLC0415

    seen: list[int] = []
    log = LibrdkafkaLog("kafka-b:9092", on_session_timeout=lambda: seen.append(1))
    for _ in range(3):
        log.log(logging.WARNING, "%s [%s] %s", "SESSTMOUT", "c", "Consumer group session timed out after 6004 ms")
    log.log(logging.WARNING, "%s [%s] %s", "REQTMOUT", "c", "Timed out HeartbeatRequest in flight")
    assert len(seen) == 3


def test_the_librdkafka_log_names_the_partition_whose_produce_request_failed_the_transaction() -> None:
    """The commit's exception names no partition; librdkafka's TXNERR line does (text as logged on real brokers)."""
    from ferryman.kafka_log import LibrdkafkaLog  # noqa: PLC0415

    seen: list[tuple[str, int, str]] = []
    log = LibrdkafkaLog("kafka-b:9092", on_produce_failed=lambda *where: seen.append(where))
    failed = (
        "Current transaction failed in state InTransaction: ProduceRequest for src.orders-2 [11] with 201 "
        "message(s) failed: Broker: Broker failed to validate record (broker 1 PID{Id:80,Epoch:2}, base seq 0): "
        "current transaction must be aborted"
    )
    for _ in range(2):  # the second is held back from the log, not from the hook
        log.log(logging.ERROR, "%s [%s] %s", "TXNERR", "ferryman-deduper-d1-producer#producer-6", failed)
    timed_out = "Current transaction failed in state InTransaction: 2 message(s) timed out on src.x [1] (_TIMED_OUT)"
    log.log(logging.ERROR, "%s [%s] %s", "TXNERR", "p", timed_out)
    assert seen == [("src.orders-2", 11, "Broker: Broker failed to validate record")] * 2
    assert KafkaError(KafkaError.INVALID_RECORD).str() == seen[0][2]  # what _note_refused matches it by


# ---------------------------------------------------------------- authorization


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (KafkaError.TOPIC_AUTHORIZATION_FAILED, "topic"),
        (KafkaError.GROUP_AUTHORIZATION_FAILED, "consumer group"),
        (KafkaError.CLUSTER_AUTHORIZATION_FAILED, "cluster"),
        (KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "transactional id"),
    ],
)
def test_an_authorization_failure_becomes_a_configuration_error_naming_the_resource(code: int, kind: str) -> None:
    denied = authorization_error(KafkaException(err(code)), operation="create topic", resource="ferryman.f.x")
    assert isinstance(denied, AuthorizationError)
    assert isinstance(denied, ConfigError)  # the services exit with EXIT_CONFIG on it
    text = str(denied)
    assert text.startswith(f"not authorized to create topic ({kind} ferryman.f.x)")
    assert KafkaError(code).name() in text


def test_other_errors_are_not_authorization_failures() -> None:
    assert authorization_error(KafkaException(err(KafkaError._TRANSPORT)), operation="x") is None
    assert authorization_error(ValueError("no"), operation="x") is None


def test_time_out_of_the_group_runs_from_the_first_session_timeout_until_an_assignment_or_a_new_consumer() -> None:
    from ferryman.kafka_errors import FenceWindow  # noqa: PLC0415

    now = [100.0]
    window = FenceWindow(clock=lambda: now[0])
    session_lost = window.consumer_built()
    assert window.lost_for() == 0.0
    session_lost()
    now[0] += 20
    session_lost()  # librdkafka logs SESSTMOUT again while still out: the clock keeps the first
    now[0] += 10
    assert window.lost_for() == 30.0
    window.assigned()
    assert window.lost_for() == 0.0
    session_lost()
    now[0] += 5
    assert window.lost_for() == 5.0
    old_hook = session_lost
    window.consumer_built()  # replaced: the new consumer starts in good standing
    assert window.lost_for() == 0.0
    old_hook()  # the parked consumer's log speaks still: ignored
    assert window.lost_for() == 0.0


def test_wait_out_transient_repeats_a_start_up_step_through_a_slow_cluster_and_lets_other_errors_through() -> None:
    calls: list[int] = []

    def slow_then_fine() -> str:
        calls.append(1)
        if len(calls) < 3:  # a describe with no answer in time, as at a destination broker's restart
            raise KafkaOperationError("describe topic x: no answer within 30 s", TimeoutError())
        return "made"

    assert (
        wait_out_transient(slow_then_fine, what="making topics", budget_s=30, setting="deduper.startup_timeout_s")
        == "made"
    )
    assert len(calls) == 3

    def refused() -> None:
        calls.append(1)
        raise ConfigError("topic x has 3 partitions, flows[f].staging_partitions says 12")

    calls.clear()
    with pytest.raises(ConfigError):
        wait_out_transient(refused, what="making topics", budget_s=30, setting="deduper.startup_timeout_s")
    assert len(calls) == 1  # never repeated

    def always_slow() -> None:
        raise KafkaOperationError("describe topic x: no answer within 30 s", TimeoutError())

    started = time.monotonic()
    with pytest.raises(ClusterUnreachableError) as spent:  # exit code 5, as when the cluster never answered
        wait_out_transient(always_slow, what="making topics", budget_s=1.0, setting="deduper.startup_timeout_s")
    assert time.monotonic() - started < 5.0  # the budget bounds the wait
    assert str(spent.value) == (
        "making topics did not succeed within 1 s at start-up (deduper.startup_timeout_s): "
        "describe topic x: no answer within 30 s"
    )


def test_each_wait_is_logged_with_the_step_it_repeats(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []

    def slow_once() -> str:
        calls.append(1)
        if len(calls) < 2:
            raise KafkaOperationError("describe topic x: no answer within 30 s", TimeoutError())
        return "made"

    with caplog.at_level(logging.WARNING, logger="ferryman.kafka_errors"):
        assert (
            wait_out_transient(
                slow_once, what="making the internal topics", budget_s=30, setting="deduper.startup_timeout_s"
            )
            == "made"
        )
    [line] = [r.getMessage() for r in caplog.records]
    # The step, the error (a bare TimeoutError adds no ": " of its own), the wait and what is left of the budget.
    assert line.startswith(
        "making the internal topics failed (describe topic x: no answer within 30 s); trying again in 0.5 s ("
    )
    assert line.endswith(" s left, attempt 1)")


def test_an_outage_retried_once_a_second_warns_once_per_interval_and_says_the_rest_at_debug(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))  # tenacity's waits

    def down() -> None:
        raise KafkaException(err(KafkaError.COORDINATOR_NOT_AVAILABLE, retriable=True))

    with caplog.at_level(logging.DEBUG, logger="ferryman.kafka_errors"), pytest.raises(KafkaOperationError):
        retry_retriable(down, what="reading the state offsets", budget_s=30)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    quiet = [r for r in caplog.records if r.levelno == logging.DEBUG]
    # 35 waits (50 ms doubling to 1 s, then 1 s each) over 30 s: a WARNING at 0 s and then one per 10 s.
    assert len(warned) == 3 and len(quiet) > 25, (warned, len(quiet))
    assert "attempt 1)" in warned[0] and all(w.startswith("reading the state offsets failed (") for w in warned)


@pytest.mark.parametrize("code", [KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE])
def test_a_record_refused_as_too_large_is_told_apart_bare_or_wrapped(code: int) -> None:
    bare = KafkaException(err(code, txn_requires_abort=True))
    assert record_too_large(bare) is bare.args[0]
    wrapped = KafkaOperationError("flushing destination records", bare)
    assert record_too_large(wrapped) is bare.args[0]
    for other in (
        KafkaException(err(KafkaError._MSG_TIMED_OUT)),
        RuntimeError("x"),
        KafkaOperationError("y", TimeoutError()),
    ):
        assert record_too_large(other) is None


def test_a_record_a_topic_refuses_by_its_configuration_is_told_apart_and_size_is_one_such_refusal() -> None:
    for code in (KafkaError.INVALID_TIMESTAMP, KafkaError.INVALID_RECORD, KafkaError.MSG_SIZE_TOO_LARGE):
        refused = KafkaException(err(code, txn_requires_abort=True))
        assert record_refused(refused) is refused.args[0]
        assert record_refused(KafkaOperationError("flushing destination records", refused)) is refused.args[0]
    assert record_too_large(KafkaException(err(KafkaError.INVALID_RECORD))) is None
    assert record_refused(KafkaException(err(KafkaError.NOT_ENOUGH_REPLICAS, retriable=True))) is None
