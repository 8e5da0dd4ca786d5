"""Held staging partitions (``_holds``): when a probe is due, what releases a hold, what forgets it."""

from __future__ import annotations

import pytest
from ferryman.v1 import control_pb2
from ferryman_deduper._holds import RETRY_MAX_S, RETRY_S, RefusalHolds

REFUSED = control_pb2.RefusedRecord(topic="src.t", partition=0, error="MSG_SIZE_TOO_LARGE")


def _held(sp: int = 3, through: int = 120, now: float = 0.0) -> RefusalHolds:
    holds = RefusalHolds()
    holds.hold(sp, REFUSED, "too large", through, now)
    return holds


def test_a_held_partition_is_paused_and_probed_after_the_first_retry() -> None:
    holds = _held()
    assert 3 in holds and holds.paused == {3}
    assert holds.due(RETRY_S - 0.1) == []
    assert holds.due(RETRY_S) == [3]
    holds.probing(3)
    assert holds.paused == set() and 3 in holds  # read again, still held until a commit passes the record
    assert holds.due(1_000.0) == []  # a probing partition is not probed twice


def test_each_failed_probe_doubles_the_wait_up_to_the_cap() -> None:
    holds, now, waits = _held(), 0.0, []
    for _ in range(8):
        [sp] = holds.due(1e9)
        holds.probing(sp)
        hold, new = holds.hold(sp, REFUSED, "too large", 120, now)
        assert not new
        waits.append(hold.retry_at - now)
    assert waits[:4] == [2 * RETRY_S, 4 * RETRY_S, 8 * RETRY_S, min(RETRY_MAX_S, 16 * RETRY_S)]
    assert waits[-1] == RETRY_MAX_S


def test_a_refusal_met_again_while_held_keeps_its_wait() -> None:
    """A second failure naming a partition already held (not probing: e.g. two records of it) moves no backoff."""
    holds = _held()
    hold, new = holds.hold(3, REFUSED, "too large", 150, 1.0)
    assert not new and hold.backoff_s == RETRY_S and hold.through == 150


def test_only_a_probes_commit_past_the_failed_transaction_releases_the_hold() -> None:
    holds = _held(through=120)
    assert holds.committed({3: 500}) == []  # not probing: nothing of it was in the commit
    holds.probing(3)
    assert holds.committed({4: 500}) == []  # another partition's commit
    assert holds.committed({3: 110}) == []  # the probe's first records, short of the refused one
    [released] = holds.committed({3: 120})
    assert released.staging_partition == 3 and 3 not in holds and not holds.paused


def test_a_hold_whose_reach_is_unknown_is_released_by_the_probes_first_commit() -> None:
    holds = _held(through=-1)
    holds.probing(3)
    assert [h.staging_partition for h in holds.committed({3: 0})] == [3]


@pytest.mark.parametrize("forget", ["drop", "clear"])
def test_partitions_that_leave_take_their_holds_with_them(forget: str) -> None:
    holds = _held(sp=3)
    holds.hold(5, REFUSED, "too large", 10, 0.0)
    if forget == "drop":
        holds.drop([3, 7])
        assert holds.paused == {5} and [h.staging_partition for h in holds.holds()] == [5]
    else:
        holds.clear()
        assert not holds.paused and len(holds) == 0


def test_the_status_names_the_refusal_and_the_waiting_source_partitions() -> None:
    [hold] = _held().holds()
    waiting = [control_pb2.HeldSourcePartition(topic="t", partition=0, watermark=99)]
    shown = hold.status(waiting)
    assert shown.staging_partition == 3 and shown.refused_record == REFUSED and shown.reason == "too large"
    assert list(shown.source_partitions) == waiting and shown.held_since_ms > 0
