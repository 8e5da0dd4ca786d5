"""What the wrapper may commit (ferryman_wrapper._progress.ProgressTracker)."""

from __future__ import annotations

import random

import pytest
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END
from ferryman.state import PartitionKey
from ferryman_wrapper._progress import ProgressTracker

K = PartitionKey("orders", 0)
K2 = PartitionKey("orders", 1)
OTHER = PartitionKey("payments", 0)


def tracker(start: int = 10, key: PartitionKey = K, logical: int | None = None) -> ProgressTracker:
    t = ProgressTracker()
    t.start(key, start, logical)
    return t


# ---------------------------------------------------------------- the acknowledged prefix


def test_nothing_to_commit_before_the_first_ack() -> None:
    t = tracker(10)
    t.sent(K, 12)
    t.sent(K, 15)
    assert t.commit_positions() == {}
    assert t.in_flight_count() == 2
    assert not t.any_failed


def test_commit_positions_follow_in_order_acks() -> None:
    t = tracker(10)
    for last in (12, 15, 20):
        t.sent(K, last)
    t.acked(K, 12)
    assert t.commit_positions() == {K: 13}
    t.acked(K, 15)
    assert t.commit_positions() == {K: 16}
    t.acked(K, 20)
    assert t.commit_positions() == {K: 21}
    assert t.in_flight_count() == 0


def test_commit_positions_only_move_forward_past_what_was_committed() -> None:
    t = tracker(10)
    t.sent(K, 12)
    t.sent(K, 15)
    t.acked(K, 12)
    t.mark_committed({K: 13})
    assert t.commit_positions() == {}
    t.acked(K, 15)
    assert t.commit_positions() == {K: 16}
    t.mark_committed({K: 16})
    assert t.commit_positions() == {}
    # A late or repeated mark of an older position does not move committed_next back.
    t.mark_committed({K: 13})
    assert t.commit_positions() == {}


def test_commit_position_is_one_past_the_last_acknowledged_offset_across_holes() -> None:
    # Source offsets are sparse (markers, compaction): the commit is last + 1, not a count.
    t = tracker(0)
    t.sent(K, 3)
    t.sent(K, 250)
    t.acked(K, 3)
    t.acked(K, 250)
    assert t.commit_positions() == {K: 251}


def test_partitions_are_independent_and_can_be_selected() -> None:
    t = ProgressTracker()
    t.start(K, 0)
    t.start(K2, 100)
    t.start(OTHER, 7)
    t.sent(K, 4)
    t.sent(K2, 105)
    t.sent(OTHER, 9)
    t.acked(K, 4)
    t.acked(K2, 105)
    assert t.commit_positions() == {K: 5, K2: 106}
    assert t.commit_positions([K2, OTHER]) == {K2: 106}
    assert t.commit_positions([]) == {}
    t.failed(OTHER)
    assert t.any_failed
    # A failure elsewhere does not hold back a healthy partition.
    assert t.commit_positions() == {K: 5, K2: 106}


def test_in_flight_count_spans_partitions() -> None:
    t = ProgressTracker()
    t.start(K, 0)
    t.start(K2, 0)
    t.sent(K, 1)
    t.sent(K, 2)
    t.sent(K2, 1)
    assert t.in_flight_count() == 3
    t.acked(K, 1)
    assert t.in_flight_count() == 2


# ---------------------------------------------------------------- failures


def test_a_failure_poisons_the_partition() -> None:
    t = tracker(0)
    t.sent(K, 5)
    t.sent(K, 9)
    t.sent(K, 14)
    t.acked(K, 5)
    t.failed(K)  # the envelope ending at 9
    t.acked(K, 14)  # a later success must not move the commit point over the hole
    assert t.any_failed
    assert t.commit_positions() == {K: 6}
    assert t.rewind_positions() == {K: (6, None)}


def test_only_a_partitions_first_failure_since_its_rewind_is_news() -> None:
    t = tracker(0)
    t.sent(K, 5)
    t.sent(K, 9)
    assert t.failed(K)  # logged
    assert not t.failed(K)  # the rest of an outage's failures of the partition: not logged again
    t.start(K, 0)  # the rewind
    t.sent(K, 5)
    assert t.failed(K)
    assert not t.failed(PartitionKey("gone", 0))  # a partition no longer tracked


def test_a_failure_before_any_ack_rewinds_to_the_start() -> None:
    t = tracker(40)
    t.sent(K, 45)
    t.failed(K)
    t.acked(K, 45)
    assert t.commit_positions() == {}
    assert t.rewind_positions() == {K: (40, None)}


def test_start_clears_the_failure_and_the_in_flight_envelopes() -> None:
    t = tracker(0)
    t.sent(K, 5)
    t.sent(K, 9)
    t.acked(K, 5)
    t.failed(K)
    ((nxt, logical),) = t.rewind_positions().values()
    t.start(K, nxt, logical)  # the rewind
    assert not t.any_failed
    assert t.in_flight_count() == 0
    assert t.commit_positions() == {}
    t.sent(K, 9)
    t.acked(K, 9)
    assert t.commit_positions() == {K: 10}


# ---------------------------------------------------------------- logical start


@pytest.mark.parametrize("logical", [OFFSET_BEGINNING, OFFSET_END])
def test_logical_start_is_kept_until_the_first_ack(logical: int) -> None:
    t = tracker(0, logical=logical)
    t.sent(K, 100)
    assert t.rewind_positions() == {K: (0, logical)}
    assert t.commit_positions() == {}
    t.failed(K)
    # Nothing acknowledged yet: go back to the logical start, not to offset 0,
    # which retention may have deleted (or, for "latest", replay history).
    assert t.rewind_positions() == {K: (0, logical)}


def test_logical_start_is_dropped_on_the_first_ack() -> None:
    t = tracker(0, logical=OFFSET_BEGINNING)
    t.sent(K, 100)
    t.sent(K, 120)
    t.acked(K, 100)
    assert t.rewind_positions() == {K: (101, None)}
    assert t.commit_positions() == {K: 101}


# ---------------------------------------------------------------- stale reports, forget


def test_ack_of_an_envelope_never_sent_is_ignored() -> None:
    t = tracker(50)
    t.acked(K, 60)
    assert t.commit_positions() == {}
    assert t.rewind_positions() == {K: (50, None)}


def test_acks_before_start_or_after_forget_are_ignored() -> None:
    t = ProgressTracker()
    t.sent(K, 5)
    t.acked(K, 5)
    t.failed(K)
    assert t.commit_positions() == {}
    assert t.rewind_positions() == {}
    assert not t.any_failed
    t.start(K, 0)
    t.sent(K, 5)
    t.forget(K)
    t.acked(K, 5)
    t.failed(K)
    t.sent(K, 7)
    assert not t.any_failed
    assert t.commit_positions() == {}
    assert t.rewind_positions() == {}
    assert t.in_flight_count() == 0
    t.forget(K)  # forgetting twice is harmless


def test_forget_leaves_other_partitions_alone() -> None:
    t = ProgressTracker()
    t.start(K, 0)
    t.start(K2, 0)
    t.sent(K2, 3)
    t.acked(K2, 3)
    t.failed(K)
    t.forget(K)
    assert not t.any_failed
    assert t.commit_positions() == {K2: 4}


def test_duplicate_ack_is_ignored() -> None:
    t = tracker(0)
    t.sent(K, 5)
    t.sent(K, 9)
    t.acked(K, 5)
    t.acked(K, 5)
    assert t.commit_positions() == {K: 6}
    assert t.in_flight_count() == 1
    t.acked(K, 9)
    assert t.commit_positions() == {K: 10}


def test_stale_ack_after_a_rewind_does_not_skip_an_unacknowledged_envelope() -> None:
    """An ack out of send order is stale and must not commit past a pending envelope.

    Epoch 1 sent envelopes ending at 60 and 70, then rewound to 50. Epoch 2
    re-sent the same records; its reports arrive in send order (60 first).
    A late report of epoch 1's envelope ending at 70 arrives before them.
    """
    t = tracker(50)
    t.sent(K, 60)
    t.sent(K, 70)
    t.acked(K, 70)  # stale: epoch 2's report for 60 has not come yet
    assert t.commit_positions() == {}, "committed past the unacknowledged envelope ending at 60"
    t.failed(K)  # epoch 2's envelope ending at 60 failed after all
    assert t.rewind_positions() == {K: (50, None)}, "the rewind would skip offsets 50..60"


def test_stale_ack_does_not_swallow_the_pending_envelopes() -> None:
    t = tracker(50)
    t.sent(K, 60)
    t.sent(K, 70)
    t.acked(K, 65)  # stale: an envelope of the previous epoch, ending between the two
    t.acked(K, 60)
    assert t.commit_positions() == {K: 61}
    t.acked(K, 70)
    assert t.commit_positions() == {K: 71}


# ---------------------------------------------------------------- model


@pytest.mark.parametrize("seed", range(30))
def test_commit_and_rewind_never_pass_an_unacknowledged_envelope(seed: int) -> None:
    """Random in-order reports, failures, commits and rewinds against a reference model."""
    rng = random.Random(seed)
    t = tracker(0, logical=OFFSET_BEGINNING)
    next_read, acked_upto, committed = 0, -1, 0
    in_flight: list[int] = []
    failed = False
    for _ in range(300):
        r = rng.random()
        if r < 0.4:
            next_read += rng.randint(1, 10)
            in_flight.append(next_read - 1)
            t.sent(K, next_read - 1)
        elif r < 0.75 and in_flight:
            last = in_flight.pop(0)
            if rng.random() < 0.1:
                failed = True
                t.failed(K)
            else:
                t.acked(K, last)
                if not failed:
                    acked_upto = last
        elif r < 0.9:
            positions = t.commit_positions()
            assert positions == ({K: acked_upto + 1} if acked_upto + 1 > committed else {})
            t.mark_committed(positions)
            committed = max(committed, *positions.values()) if positions else committed
        else:
            ((nxt, _logical),) = t.rewind_positions().values()
            assert nxt == acked_upto + 1
            if failed or rng.random() < 0.3:
                t.start(K, nxt)
                next_read, in_flight, failed, committed = nxt, [], False, nxt
        assert t.any_failed == failed
        if not failed:  # a poisoned partition stops tracking its reports until the rewind
            assert t.in_flight_count() == len(in_flight)


def test_a_failure_is_answered_without_walking_every_partition_and_cleared_by_a_restart_or_a_revoke() -> None:
    t = ProgressTracker()
    keys = [PartitionKey("orders", p) for p in range(1000)]
    for key in keys:
        t.start(key, 0)
    assert t._failed == set()  # the flag any_failed reads: a set of the failed, not a walk over all 1000
    t.sent(keys[500], 9)
    t.failed(keys[500])
    t.failed(PartitionKey("unknown", 0))  # not tracked: ignored
    assert t.any_failed and t._failed == {keys[500]}
    t.start(keys[500], 0)  # the rewind restarts it
    assert not t.any_failed
    t.failed(keys[7])
    t.forget(keys[7])  # revoked
    assert not t.any_failed
