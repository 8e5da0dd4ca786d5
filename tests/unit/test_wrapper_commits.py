"""The wrapper's periodic source-offset commit does not wait (ferryman_wrapper._wrapper.Wrapper).

Pure bookkeeping: what the commit callback marks committed, and which failures stop
the wrapper. That the commit lands on a real source cluster while the wrapper runs is
``tests/integration/test_exactly_once.py::test_the_wrapper_commits_its_source_positions_while_it_runs``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from ferryman.config import parse_config
from ferryman.errors import KafkaOperationError
from ferryman.state import PartitionKey
from ferryman.v1 import envelope_pb2
from ferryman_wrapper import _wrapper
from ferryman_wrapper._wrapper import Wrapper

K = PartitionKey("orders", 0)
K2 = PartitionKey("orders", 1)


@dataclass
class _Report:
    """A partition of a commit report (confluent-kafka's TopicPartition.error is read-only)."""

    topic: str
    partition: int
    offset: int
    error: KafkaError | None = None


@dataclass
class _Consumer:
    """Records commit() calls; nothing else of a consumer is touched by the commit."""

    calls: list[tuple[list[TopicPartition], bool]] = field(default_factory=list)
    refuse: KafkaError | None = None

    def commit(self, *, offsets: list[TopicPartition], asynchronous: bool) -> None:
        if self.refuse is not None:
            raise KafkaException(self.refuse)
        self.calls.append((offsets, asynchronous))


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    c = _Clock()
    monkeypatch.setattr(time, "monotonic", c)
    return c


def wrapper_with_acks(consumer: _Consumer | None = None) -> Wrapper:
    """A wrapper whose tracker has K acknowledged up to 99 and K2 up to 49 (nothing committed)."""
    cfg = parse_config(
        {
            "clusters": {"a": {"bootstrap_servers": "h1:9092"}, "b": {"bootstrap_servers": "h2:9092"}},
            "flows": [{"name": "f1", "source": "a", "target": "b"}],
        }
    )
    w = Wrapper(cfg, cfg.flows[0], instance_id="w0")
    for key, last in ((K, 99), (K2, 49)):
        w._tracker.start(key, 0)
        w._tracker.sent(key, last)
        w._tracker.acked(key, last)
        w._sources[key] = envelope_pb2.SourcePartition(topic=key.topic, partition=key.partition, topic_id=b"\x01" * 16)
    w._consumer = cast(Any, consumer or _Consumer())
    return w


def report(*parts: _Report) -> list[TopicPartition]:
    return cast(list[TopicPartition], list(parts))


def test_the_periodic_commit_is_sent_without_waiting_and_carries_the_topic_id() -> None:
    consumer = _Consumer()
    w = wrapper_with_acks(consumer)
    w._commit(synchronous=False)
    [(offsets, asynchronous)] = consumer.calls
    assert asynchronous
    assert {(tp.topic, tp.partition, tp.offset, tp.metadata) for tp in offsets} == {
        ("orders", 0, 100, "01" * 16),
        ("orders", 1, 50, "01" * 16),
    }
    # Nothing is marked committed until the report: the next commit offers the same positions.
    assert w._tracker.commit_positions() == {K: 100, K2: 50}


def test_a_successful_report_marks_each_partition_committed() -> None:
    w = wrapper_with_acks()
    w._on_commit(None, report(_Report("orders", 0, 100)))
    assert w._tracker.commit_positions() == {K2: 50}
    w._on_commit(None, report(_Report("orders", 1, 50)))
    assert w._tracker.commit_positions() == {}
    assert w._fatal is None


def test_a_late_report_of_an_older_commit_never_moves_a_position_back() -> None:
    w = wrapper_with_acks()
    w._on_commit(None, report(_Report("orders", 0, 100)))
    w._on_commit(None, report(_Report("orders", 0, 60)))
    assert K not in w._tracker.commit_positions()


def test_a_partition_error_leaves_that_partition_to_the_next_commit(clock: _Clock) -> None:
    w = wrapper_with_acks()
    busy = KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS)
    w._on_commit(None, report(_Report("orders", 0, 100), _Report("orders", 1, 50, busy)))
    assert w._tracker.commit_positions() == {K2: 50}
    assert w._fatal is None


def test_a_rebalance_error_is_skipped_however_long_it_lasts(clock: _Clock) -> None:
    w = wrapper_with_acks()
    for _ in range(3):
        w._on_commit(KafkaError(KafkaError.REBALANCE_IN_PROGRESS), report(_Report("orders", 0, 100)))
        clock.now += 60
    assert w._fatal is None
    assert w._tracker.commit_positions() == {K: 100, K2: 50}


def test_retriable_failures_stop_the_wrapper_only_after_the_admin_budget(clock: _Clock) -> None:
    w = wrapper_with_acks()
    down = KafkaError(KafkaError.COORDINATOR_NOT_AVAILABLE)
    w._on_commit(down, report(_Report("orders", 0, 100)))
    clock.now += _wrapper._ADMIN_TIMEOUT_S - 1
    w._on_commit(down, report(_Report("orders", 0, 100)))
    assert w._fatal is None
    clock.now += 1
    w._on_commit(down, report(_Report("orders", 0, 100)))
    assert isinstance(w._fatal, KafkaOperationError)
    assert "committing source offsets" in str(w._fatal)


def test_a_success_in_between_restarts_the_budget(clock: _Clock) -> None:
    w = wrapper_with_acks()
    down = KafkaError(KafkaError.COORDINATOR_NOT_AVAILABLE)
    w._on_commit(down, report(_Report("orders", 0, 100)))
    clock.now += _wrapper._ADMIN_TIMEOUT_S - 1
    w._on_commit(None, report(_Report("orders", 0, 100), _Report("orders", 1, 50)))
    clock.now += _wrapper._ADMIN_TIMEOUT_S - 1
    w._on_commit(down, report(_Report("orders", 0, 100)))
    assert w._fatal is None


def test_a_fatal_failure_stops_the_wrapper_at_once(clock: _Clock) -> None:
    w = wrapper_with_acks()
    w._on_commit(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED), report(_Report("orders", 0, 100)))
    assert isinstance(w._fatal, KafkaOperationError)


def test_a_commit_refused_before_it_is_sent_counts_as_a_failure(clock: _Clock) -> None:
    consumer = _Consumer(refuse=KafkaError(KafkaError._TRANSPORT))
    w = wrapper_with_acks(consumer)
    w._commit(synchronous=False)
    assert w._fatal is None and w._commit_failing_since == clock.now
    consumer.refuse = KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED)
    w._commit(synchronous=False)
    assert isinstance(w._fatal, KafkaOperationError)


def test_a_failure_long_past_is_forgotten_once_everything_is_committed(clock: _Clock) -> None:
    """A retriable failure, then every position committed and nothing new for a while: a new
    failure starts a new budget instead of stopping the wrapper at once."""
    w = wrapper_with_acks()
    down = KafkaError(KafkaError.COORDINATOR_NOT_AVAILABLE)
    w._on_commit(down, report(_Report("orders", 0, 100)))
    w._tracker.mark_committed({K: 100, K2: 50})
    w._commit(synchronous=False)  # nothing left to commit
    clock.now += 10 * _wrapper._ADMIN_TIMEOUT_S
    w._on_commit(down, report(_Report("orders", 0, 100)))
    assert w._fatal is None


def test_positions_of_partitions_no_longer_described_send_no_commit() -> None:
    """An empty commit is refused by librdkafka (_NO_OFFSET, fatal here): none is sent."""
    consumer = _Consumer()
    w = wrapper_with_acks(consumer)
    w._sources.clear()
    w._commit(synchronous=False)
    w._commit()
    assert consumer.calls == []
    assert w._fatal is None
