"""What the wrapper may commit: only an acknowledged, in-order prefix."""

from __future__ import annotations

from confluent_kafka import OFFSET_BEGINNING
from ferryman.state import PartitionKey
from ferryman_wrapper._progress import ProgressTracker

K = PartitionKey("t", 0)


def test_commit_positions_follow_the_acknowledged_prefix() -> None:
    t = ProgressTracker()
    t.start(K, 10)
    for last in (12, 15, 20):
        t.sent(K, last)
    assert t.commit_positions() == {}
    t.acked(K, 12)
    assert t.commit_positions() == {K: 13}
    t.mark_committed({K: 13})
    assert t.commit_positions() == {}
    t.acked(K, 15)
    t.acked(K, 20)
    assert t.commit_positions() == {K: 21}
    assert t.in_flight_count() == 0


def test_failure_poisons_the_partition_until_rewind() -> None:
    t = ProgressTracker()
    t.start(K, 0)
    t.sent(K, 5)
    t.sent(K, 9)
    t.acked(K, 5)
    t.failed(K)
    t.acked(K, 9)  # a later success after a failure must not move the commit point
    assert t.any_failed
    assert t.commit_positions() == {K: 6}
    assert t.rewind_positions() == {K: (6, None)}


def test_logical_start_is_kept_until_the_first_ack() -> None:
    t = ProgressTracker()
    t.start(K, 0, OFFSET_BEGINNING)
    t.sent(K, 100)
    assert t.rewind_positions() == {K: (0, OFFSET_BEGINNING)}
    t.acked(K, 100)
    assert t.rewind_positions() == {K: (101, None)}


def test_stale_acks_and_forgotten_partitions_are_ignored() -> None:
    t = ProgressTracker()
    t.start(K, 50)
    t.acked(K, 60)  # never sent in this epoch
    assert t.commit_positions() == {}
    t.forget(K)
    t.acked(K, 70)
    t.failed(K)
    assert not t.any_failed
    assert t.commit_positions() == {}
