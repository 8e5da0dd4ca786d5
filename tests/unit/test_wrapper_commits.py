"""The wrapper's source-offset commits (ferryman_wrapper._commits.SourceCommits).

Pure bookkeeping: what the commit callback marks committed, and what a failed commit
does: never stop the wrapper (the next owner re-sends from the last commit and the
deduper drops what it has), mark the source cluster down while it lasts. That commits
land on a real source cluster while the wrapper runs is
``tests/integration/test_exactly_once.py::test_the_wrapper_commits_its_source_positions_while_it_runs``;
that a wrapper rides through a source broker restart is ``tests/e2e/test_broker_restarts.py``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from ferryman.config import ClusterConfig
from ferryman.health import ClusterHealth
from ferryman.state import PartitionKey
from ferryman.v1 import envelope_pb2
from ferryman_wrapper._commits import STILL_FAILING_S, SourceCommits
from ferryman_wrapper._progress import ProgressTracker

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


@dataclass
class _Setup:
    commits: SourceCommits
    tracker: ProgressTracker
    sources: dict[PartitionKey, envelope_pb2.SourcePartition]
    health: ClusterHealth
    consumer: _Consumer


def commits_with_acks(consumer: _Consumer | None = None) -> _Setup:
    """Commits over a tracker with K acknowledged up to 99 and K2 up to 49 (nothing committed)."""
    tracker = ProgressTracker()
    sources: dict[PartitionKey, envelope_pb2.SourcePartition] = {}
    for key, last in ((K, 99), (K2, 49)):
        tracker.start(key, 0)
        tracker.sent(key, last)
        tracker.acked(key, last)
        sources[key] = envelope_pb2.SourcePartition(topic=key.topic, partition=key.partition, topic_id=b"\x01" * 16)
    cons = consumer or _Consumer()
    health = ClusterHealth("src", ClusterConfig(bootstrap_servers="h1:9092"))
    commits = SourceCommits(consumer=lambda: cast(Any, cons), tracker=tracker, sources=sources, health=health)
    return _Setup(commits, tracker, sources, health, cons)


def report(*parts: _Report) -> list[TopicPartition]:
    return cast(list[TopicPartition], list(parts))


def test_the_periodic_commit_is_sent_without_waiting_and_carries_the_topic_id() -> None:
    s = commits_with_acks()
    s.commits.commit(synchronous=False)
    [(offsets, asynchronous)] = s.consumer.calls
    assert asynchronous
    assert {(tp.topic, tp.partition, tp.offset, tp.metadata) for tp in offsets} == {
        ("orders", 0, 100, "01" * 16),
        ("orders", 1, 50, "01" * 16),
    }
    # Nothing is marked committed until the report: the next commit offers the same positions.
    assert s.tracker.commit_positions() == {K: 100, K2: 50}


def test_a_synchronous_commit_marks_the_positions_committed() -> None:
    s = commits_with_acks()
    s.commits.commit()
    [(_offsets, asynchronous)] = s.consumer.calls
    assert not asynchronous
    assert s.tracker.commit_positions() == {}


def test_a_successful_report_marks_each_partition_committed() -> None:
    s = commits_with_acks()
    s.commits.on_commit(None, report(_Report("orders", 0, 100)))
    assert s.tracker.commit_positions() == {K2: 50}
    s.commits.on_commit(None, report(_Report("orders", 1, 50)))
    assert s.tracker.commit_positions() == {}
    assert s.health.reachable


def test_a_late_report_of_an_older_commit_never_moves_a_position_back() -> None:
    s = commits_with_acks()
    s.commits.on_commit(None, report(_Report("orders", 0, 100)))
    s.commits.on_commit(None, report(_Report("orders", 0, 60)))
    assert K not in s.tracker.commit_positions()


def test_a_partition_error_leaves_that_partition_to_the_next_commit(clock: _Clock) -> None:
    s = commits_with_acks()
    busy = KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS)
    s.commits.on_commit(None, report(_Report("orders", 0, 100), _Report("orders", 1, 50, busy)))
    assert s.tracker.commit_positions() == {K2: 50}
    assert s.health.reachable


def test_a_rebalance_error_is_skipped_however_long_it_lasts(clock: _Clock) -> None:
    s = commits_with_acks()
    for _ in range(3):
        s.commits.on_commit(KafkaError(KafkaError.REBALANCE_IN_PROGRESS), report(_Report("orders", 0, 100)))
        clock.now += 60
    assert s.health.reachable
    assert s.tracker.commit_positions() == {K: 100, K2: 50}


@pytest.mark.parametrize("code", [KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError._WAIT_COORD, KafkaError._TRANSPORT])
def test_retriable_failures_mark_the_source_down_once_they_last_and_a_success_brings_it_back(
    clock: _Clock, code: int
) -> None:
    """The wrapper exited on _WAIT_COORD after a source broker restart (issue 24); it now waits."""
    s = commits_with_acks()
    down = KafkaError(code)
    s.commits.on_commit(down, report(_Report("orders", 0, 100)))
    clock.now += STILL_FAILING_S - 1
    s.commits.on_commit(down, report(_Report("orders", 0, 100)))
    assert s.health.reachable
    clock.now += 1
    s.commits.on_commit(down, report(_Report("orders", 0, 100)))
    assert not s.health.reachable
    assert "source offset commits failing" in s.health.reason
    clock.now += 600  # an outage of any length: still waited out
    s.commits.on_commit(down, report(_Report("orders", 0, 100)))
    s.commits.on_commit(None, report(_Report("orders", 0, 100), _Report("orders", 1, 50)))
    assert s.health.reachable
    assert s.tracker.commit_positions() == {}


def test_a_success_in_between_restarts_the_clock(clock: _Clock) -> None:
    s = commits_with_acks()
    down = KafkaError(KafkaError.COORDINATOR_NOT_AVAILABLE)
    s.commits.on_commit(down, report(_Report("orders", 0, 100)))
    clock.now += STILL_FAILING_S - 1
    s.commits.on_commit(None, report(_Report("orders", 0, 100), _Report("orders", 1, 50)))
    clock.now += STILL_FAILING_S - 1
    s.commits.on_commit(down, report(_Report("orders", 0, 100)))
    assert s.health.reachable


def test_a_refused_commit_marks_the_source_down_at_once_but_stops_nothing(clock: _Clock) -> None:
    s = commits_with_acks()
    s.commits.on_commit(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED), report(_Report("orders", 0, 100)))
    assert not s.health.reachable
    assert "refused" in s.health.reason


def test_a_commit_refused_before_it_is_sent_counts_as_a_failure(clock: _Clock) -> None:
    s = commits_with_acks(_Consumer(refuse=KafkaError(KafkaError._TRANSPORT)))
    s.commits.commit(synchronous=False)
    clock.now += STILL_FAILING_S
    s.commits.commit(synchronous=False)
    assert not s.health.reachable


def test_a_synchronous_commit_failure_is_reported_not_raised(clock: _Clock) -> None:
    s = commits_with_acks(_Consumer(refuse=KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED)))
    s.commits.commit()
    assert s.tracker.commit_positions() == {K: 100, K2: 50}
    assert not s.health.reachable


def test_nothing_left_to_commit_says_nothing_of_the_sources_health(clock: _Clock) -> None:
    """Partitions lost to a session timeout while the source is down leave nothing to commit: the source
    stayed down (it was reported back every commit interval, SERVING, while it was still away)."""
    s = commits_with_acks()
    s.health.down("source consumer: 1/1 brokers are down")
    for key in (K, K2):
        s.tracker.forget(key)
    s.commits.commit(synchronous=False)
    s.commits.commit()
    assert s.consumer.calls == []
    assert not s.health.reachable


def test_positions_of_partitions_no_longer_described_send_no_commit() -> None:
    """An empty commit is refused by librdkafka (_NO_OFFSET): none is sent."""
    s = commits_with_acks()
    s.sources.clear()
    s.commits.commit(synchronous=False)
    s.commits.commit()
    assert s.consumer.calls == []


def test_one_asynchronous_commit_at_a_time_while_the_last_has_not_reported(clock: _Clock) -> None:
    """A rebalance waits for every commit in progress: commits queued during an outage kept it from completing."""
    s = commits_with_acks()
    s.commits.commit(synchronous=False)
    s.commits.commit(synchronous=False)
    assert len(s.consumer.calls) == 1
    s.commits.on_commit(KafkaError(KafkaError._WAIT_COORD), report(_Report("orders", 0, 100)))
    s.commits.commit(synchronous=False)
    assert len(s.consumer.calls) == 2
    clock.now += 30  # a report that never comes is given up
    s.commits.commit(synchronous=False)
    assert len(s.consumer.calls) == 3
