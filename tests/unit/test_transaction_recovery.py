"""The deduper's recovery decisions (ferryman_deduper._transaction.Transaction), on a stand-in producer.

Pure decision logic: which failure aborts, which rebuilds the producer, which
stops the deduper as fenced, and that a recovery that fails (the cluster still
away) is taken up again. That these paths keep the copy exact on real brokers is
``tests/e2e/test_broker_restarts.py`` and ``tests/e2e/test_crash_recovery.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from ferryman.config import ClusterConfig, DeduperConfig
from ferryman.errors import FencedError, KafkaOperationError, WedgedCallError
from ferryman.health import ClusterHealth
from ferryman_deduper import _transaction
from ferryman_deduper._transaction import FAILED_COMMITS_PAUSE_S, Transaction


@dataclass
class FakeProducer:
    """Records transactional calls; each may be told to fail or to hang."""

    name: int
    calls: list[str] = field(default_factory=list)
    fail: dict[str, KafkaError] = field(default_factory=dict)
    broken: dict[str, BaseException] = field(default_factory=dict)
    hang: set[str] = field(default_factory=set)
    gate: threading.Event = field(default_factory=threading.Event)
    on_poll: list[Callable[[], None]] = field(default_factory=list)
    """Served (once each) by the next poll(): confluent-kafka hands the client's log lines over there."""

    def _do(self, what: str) -> None:
        self.calls.append(what)
        if what in self.hang:
            self.gate.wait(30)
        if what in self.fail:
            raise KafkaException(self.fail[what])
        if what in self.broken:
            raise self.broken[what]

    def init_transactions(self, _timeout: float) -> None:
        self._do("init_transactions")

    def begin_transaction(self) -> None:
        self._do("begin_transaction")

    def abort_transaction(self, _timeout: float = 0) -> None:
        self._do("abort_transaction")

    def commit_transaction(self, _timeout: float) -> None:
        self._do("commit_transaction")

    def send_offsets_to_transaction(self, *_args: Any) -> None:
        self._do("send_offsets_to_transaction")

    def flush(self, _timeout: float) -> int:
        self._do("flush")
        return 0

    def poll(self, _timeout: float) -> int:
        self._do("poll")
        while self.on_poll:
            self.on_poll.pop(0)()
        return 0

    def purge(self) -> None:
        self.calls.append("purge")


class Producers:
    def __init__(self) -> None:
        self.made: list[FakeProducer] = []
        self.init_fails: KafkaError | None = None

    def __call__(self) -> tuple[Any, bool]:
        p = FakeProducer(len(self.made))
        if self.init_fails is not None:
            p.fail["init_transactions"] = self.init_fails
        self.made.append(p)
        return p, False


def txn(producers: Producers, **dc: Any) -> Transaction:
    t = Transaction(
        make_producer=producers,
        dc=DeduperConfig(instance_id="d1", **dc),
        exactly_once=True,
        transactional_id="ferryman-deduper.f.d1",
        health=ClusterHealth("dst", ClusterConfig(bootstrap_servers="h:9092")),
    )
    t.start()
    t.begin()
    return t


def abortable(code: int = KafkaError._STATE) -> KafkaException:
    return KafkaException(KafkaError(code, "abortable", txn_requires_abort=True))


def test_an_abortable_failure_aborts_and_keeps_the_producer() -> None:
    producers = Producers()
    t = txn(producers)
    t.recover(abortable(), "commit")
    assert producers.made[0].calls[-1] == "abort_transaction"
    assert len(producers.made) == 1
    assert not t.open and t.stats.aborted == 1


def test_a_failed_abort_rebuilds_the_producer() -> None:
    producers = Producers()
    t = txn(producers)
    producers.made[0].fail["abort_transaction"] = KafkaError(KafkaError._FATAL, "gone", fatal=True)
    t.recover(abortable(), "commit")
    assert len(producers.made) == 2
    assert producers.made[1].calls == ["init_transactions"]
    assert t.stats.producer_rebuilds == 1


@pytest.mark.parametrize(
    "error",
    [
        KafkaError(KafkaError._TIMED_OUT, "outcome unknown", retriable=True),  # retries ran out
        KafkaError(KafkaError._FATAL, "fatal", fatal=True),
    ],
)
def test_an_unknown_outcome_or_a_fatal_error_rebuilds_the_producer(error: KafkaError) -> None:
    producers = Producers()
    t = txn(producers)
    t.recover(KafkaException(error), "commit")
    assert len(producers.made) == 2
    assert "purge" in producers.made[0].calls


def test_a_fence_of_a_young_transaction_is_a_live_twin_and_stops_the_deduper() -> None:
    producers = Producers()
    t = txn(producers)
    with pytest.raises(FencedError, match="two live processes"):
        t.recover(KafkaException(KafkaError(KafkaError.PRODUCER_FENCED, "fenced", fatal=True)), "commit")
    assert len(producers.made) == 1  # rebuilding would fence the twin back


def test_a_fence_of_a_transaction_older_than_its_timeout_is_our_own_and_rebuilds() -> None:
    producers = Producers()
    t = txn(producers, transaction_timeout_ms=1000)
    t.started = time.monotonic() - 2.0
    t.recover(KafkaException(KafkaError(KafkaError.PRODUCER_FENCED, "fenced", fatal=True)), "commit")
    assert len(producers.made) == 2


def test_a_fence_of_a_transaction_older_than_its_timeout_goes_to_recovery_not_out_of_the_loop() -> None:
    # Seen in a chaos run at load ~98: a commit's flush took seconds, the coordinator expired the transaction
    # and bumped our epoch, and the fence at EndTxn was re-raised past recovery: the deduper exited.
    producers = Producers()
    t = txn(producers, transaction_timeout_ms=1000)
    t.begin()
    assert not t.fence_may_be_ours(fenced())  # young: a twin
    t.started = time.monotonic() - 2.0
    assert t.fence_may_be_ours(fenced())
    t.recover(fenced(), "commit (revoke)")
    assert len(producers.made) == 2


def test_a_fence_at_the_abort_of_a_transaction_older_than_its_timeout_rebuilds() -> None:
    # A CI chaos run: a deduper paused (SIGSTOP) 14 s against a 10 s transaction timeout woke up with its
    # staging partitions lost (abortable); the coordinator had expired the transaction and bumped the epoch,
    # so the abort was fenced, and the deduper exited as if a twin had taken over.
    producers = Producers()
    t = txn(producers, transaction_timeout_ms=1000)
    producers.made[0].fail["abort_transaction"] = KafkaError(KafkaError._FENCED, "fenced", fatal=True)
    t.started = time.monotonic() - 2.0
    t.recover(abortable(), "lost partitions")
    assert len(producers.made) == 2
    assert producers.made[1].calls == ["init_transactions"]


def test_a_fence_at_the_abort_of_a_young_transaction_is_a_live_twin() -> None:
    producers = Producers()
    t = txn(producers, transaction_timeout_ms=60_000)
    producers.made[0].fail["abort_transaction"] = KafkaError(KafkaError._FENCED, "fenced", fatal=True)
    with pytest.raises(FencedError, match="abort"):
        t.recover(abortable(), "lost partitions")
    assert len(producers.made) == 1  # rebuilding would fence the twin back


def test_a_fence_after_the_process_was_frozen_past_the_timeout_is_our_own_even_between_transactions() -> None:
    # A CI chaos run: a deduper SIGSTOPped 14 s against a 10 s timeout was fenced at its next
    # AddPartitionsToTxn and exited as if a twin had taken over.
    producers = Producers()
    t = txn(producers, transaction_timeout_ms=1000)
    t.clear()  # between transactions
    t.note_alive()
    assert not t.fence_may_be_ours(fenced())  # not frozen: a twin
    t._alive_at -= 2.0  # the loop last went round 2 s ago: frozen past the timeout
    assert t.fence_may_be_ours(fenced())
    t.note_alive()  # the loop goes round again: the freeze is remembered for one more timeout
    assert t.fence_may_be_ours(fenced())
    t.recover(fenced(), "writing the transaction")
    assert len(producers.made) == 2


def test_a_fence_that_poll_raises_while_recovering_from_a_freeze_is_our_own() -> None:
    # Real brokers (tests/e2e/test_crash_recovery.py, the frozen deduper): woken past the timeout, the
    # deduper's recovery served producer events and poll() raised the fence itself, instead of handing
    # it to error_cb; it escaped the recovery and the deduper exited as if a twin had taken over.
    producers = Producers()
    t = txn(producers, transaction_timeout_ms=1000)
    producers.made[0].fail["poll"] = fenced().args[0]
    t._alive_at -= 2.0  # frozen past the timeout
    t.recover(abortable(), "lost partitions")
    assert len(producers.made) == 2  # rebuilt, not exited
    assert t.producer_fatal is None  # the new producer starts clean


def test_a_fence_that_poll_raises_without_a_freeze_is_a_twin() -> None:
    producers = Producers()
    t = txn(producers, transaction_timeout_ms=60_000)
    producers.made[0].fail["poll"] = fenced().args[0]
    with pytest.raises(FencedError):
        t.recover(abortable(), "lost partitions")
    assert len(producers.made) == 1


def test_a_client_that_breaks_with_a_system_error_is_recovered_by_its_fatal_error() -> None:
    # A clean-clone CI run: a twin's fence failed the records in flight and confluent-kafka's flush()
    # raised SystemError ("returned a result with an exception set"); it escaped as a crash, not exit 3.
    producers = Producers()
    t = txn(producers)
    producer = producers.made[0]
    producer.broken["flush"] = SystemError("<class 'str'> returned a result with an exception set")
    with pytest.raises(KafkaOperationError) as caught:
        t.call(lambda: producer.flush(1.0), "flushing destination records")
    producer.fail["abort_transaction"] = fenced().args[0]  # the probe finds the fence behind it
    with pytest.raises(FencedError):
        t.recover(caught.value, "commit")


def test_a_fence_long_after_a_freeze_is_a_twin() -> None:
    producers = Producers()
    t = txn(producers, transaction_timeout_ms=1000)
    t.clear()
    t._stalled_at = time.monotonic() - 5.0
    t.note_alive()
    assert not t.fence_may_be_ours(fenced())
    with pytest.raises(FencedError):
        t.recover(fenced(), "writing the transaction")


def fenced() -> KafkaException:
    return KafkaException(KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True))


def test_a_fence_soon_after_replacing_our_own_producer_rebuilds_once_then_a_second_is_a_twin() -> None:
    # Seen in a chaos run: a producer replaced after "requires epoch bump" fenced its successor.
    producers = Producers()
    t = txn(producers)
    assert not t.fence_may_be_ours(fenced())  # nothing replaced yet: a fence is a twin
    t.recover(KafkaException(KafkaError(KafkaError._FATAL, "fatal", fatal=True)), "commit")
    t.begin()
    assert t.fence_may_be_ours(fenced())
    t.recover(fenced(), "commit (revoke)")
    assert len(producers.made) == 3 and t.stats.producer_rebuilds == 2
    t.begin()
    assert not t.fence_may_be_ours(fenced())  # forgiven once per replacement
    with pytest.raises(FencedError, match="two live processes"):
        t.recover(fenced(), "commit")
    assert len(producers.made) == 3


def test_a_fence_long_after_the_last_replacement_is_a_twin(monkeypatch: pytest.MonkeyPatch) -> None:
    producers = Producers()
    t = txn(producers, transaction_timeout_ms=1000)
    t.recover(KafkaException(KafkaError(KafkaError._FATAL, "fatal", fatal=True)), "commit")
    t.begin()
    later = time.monotonic() + 2.0
    monkeypatch.setattr("ferryman_deduper._transaction.time.monotonic", lambda: later)
    t.started = later  # a young transaction
    t._alive_at = later  # the loop has been going round: not frozen
    assert not t.fence_may_be_ours(fenced())
    with pytest.raises(FencedError):
        t.recover(fenced(), "commit")


def test_a_wedged_call_rebuilds_without_touching_the_abandoned_producer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_transaction, "CALL_TIMEOUT_S", 0.1)
    monkeypatch.setattr(_transaction, "GRACE_S", 0.1)
    producers = Producers()
    t = txn(producers)
    stuck = producers.made[0]
    stuck.hang.add("commit_transaction")
    with pytest.raises(WedgedCallError):
        t.call(lambda: stuck.commit_transaction(1), "commit_transaction")
    t.recover(WedgedCallError("commit_transaction", 0.2), "commit")
    assert len(producers.made) == 2
    assert "purge" not in stuck.calls  # a call of its may still be running
    assert t.stats.wedged_calls == 1
    stuck.gate.set()


def test_a_rebuild_that_fails_is_taken_up_again_by_the_next_recovery() -> None:
    producers = Producers()
    t = txn(producers)
    producers.init_fails = KafkaError(KafkaError._FATAL, "init refused", fatal=True)
    with pytest.raises(KafkaException):
        t.recover(KafkaException(KafkaError(KafkaError._FATAL, "fatal", fatal=True)), "commit")
    producers.init_fails = None
    t.recover(KafkaException(KafkaError(KafkaError._FATAL, "fatal", fatal=True)), "commit")
    assert producers.made[-1].calls == ["init_transactions"]
    # The rebuild was due: no abort was tried on the broken producer in between.
    assert "abort_transaction" not in producers.made[1].calls


def test_a_pause_for_failed_commits_runs_out_unless_another_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    producers = Producers()
    t = txn(producers)
    now = [1000.0]
    monkeypatch.setattr("ferryman_deduper._transaction.time.monotonic", lambda: now[0])
    t.recover(abortable(), "commit")
    t.begin()
    t.recover(abortable(), "commit")
    assert t.commits_failing() == 2  # the deduper pauses the wrappers
    now[0] += FAILED_COMMITS_PAUSE_S - 0.1
    assert t.commits_failing() == 2
    # Nothing more to write, so no commit ends the pause: it runs out, and the wrappers send again.
    now[0] += 0.1
    assert t.commits_failing() == 0
    t.begin()
    t.recover(abortable(), "commit")  # a new failure: paused again, counting on
    assert t.commits_failing() == 3


@pytest.mark.parametrize(
    "code",
    [KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID, KafkaError.REBALANCE_IN_PROGRESS],
)
def test_a_failure_of_the_group_generation_does_not_pause_the_wrappers(code: int) -> None:
    """Lost partitions, a fenced staging consumer or a commit refused for a stale generation: not the destination."""
    producers = Producers()
    t = txn(producers)
    t.recover(abortable(), "commit")
    t.begin()
    t.recover(abortable(code), "lost partitions")
    t.begin()
    t.recover(abortable(code), "commit")
    assert t.commits_failing() == 1  # the one destination failure; the generation's are not counted
    assert t.stats.aborted == 3


def test_a_refused_record_keeps_its_partition_when_a_purge_reports_other_failures_after_it() -> None:
    """produce() names the refusal; the rebuild's purge then reports the rest of the transaction (other texts,
    other partitions) before the recovery names it: the refusal's partition is the one named (a CI run)."""
    producers = Producers()
    t = txn(producers)
    refused = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "Unable to produce message: Broker: Message size too large")
    t.refused_at("src.t", 0, refused.str())
    t.refused_at("src.t", 0, "Local: Purged in queue")
    t.refused_at("src.t", 1, "Local: Purged in queue")
    t.recover(KafkaException(refused), "write")
    assert t.refused_record.startswith("the destination refuses a record for src.t partition 0 (MSG_SIZE_TOO_LARGE: ")
    assert t.status_fields()["refused_record"].partition == 0
    # A failure no report named is told without a partition, never with another cause's.
    t.begin()
    t.recover(KafkaException(KafkaError(KafkaError.INVALID_TIMESTAMP, "Broker: Invalid timestamp")), "commit")
    assert t.refused_record.startswith("the destination refuses a record (INVALID_TIMESTAMP: ")


def test_a_produce_refused_for_a_failed_transaction_is_the_refusal_the_log_told() -> None:
    """A refused record fails the transaction; the next produce() raises only _STATE ("Erroneous state"), and the
    refusal is told in librdkafka's TXNERR line alone. Before, the _STATE read as fatal (producer rebuilt) and
    the refusal went unnamed; with other partitions written beside a held one that happened at every probe."""
    producers = Producers()
    t = txn(producers)
    # The TXNERR line's text, served by the producer's next poll().
    producers.made[0].on_poll.append(lambda: t.refused_at("src.t", 0, "Broker: Message size too large"))
    erroneous = KafkaException(KafkaError(KafkaError._STATE, "Unable to produce message: Local: Erroneous state"))
    t.recover(erroneous, "writing the transaction")
    assert producers.made[0].calls[-1] == "abort_transaction" and len(producers.made) == 1  # aborted, kept
    refusal = t.refusal()
    assert refusal is not None
    assert (refusal[0].topic, refusal[0].partition, refusal[0].error) == ("src.t", 0, "MSG_SIZE_TOO_LARGE")
    t.refusal_held()
    # What the log told for an earlier transaction is not the cause of a later one's _STATE.
    t.begin()
    t.recover(erroneous, "writing the transaction")
    assert t.refusal() is None and len(producers.made) == 2  # read as before: the producer rebuilt
