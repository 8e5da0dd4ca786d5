"""OrphanWatch's decisions: which partitions count as owned by nobody, and when that is confirmed."""

from __future__ import annotations

from confluent_kafka import ConsumerGroupState
from ferryman.group_watch import OrphanWatch, orphans

STABLE, REBALANCING = ConsumerGroupState.STABLE, ConsumerGroupState.PREPARING_REBALANCING


def _watch(confirm: int = 2) -> OrphanWatch:
    return OrphanWatch({"bootstrap.servers": "127.0.0.1:1"}, "g", lambda: ["t"], confirm=confirm)  # never started


def test_orphans_are_the_partitions_no_member_owns_in_a_stable_group() -> None:
    assert orphans(STABLE, {("t", 0), ("t", 2)}, {"t": 4, "u": 1}) == {("t", 1), ("t", 3), ("u", 0)}
    assert orphans(STABLE, {("t", 0), ("t", 1)}, {"t": 2}) == frozenset()
    # Mid-rebalance, partitions are withheld on purpose: nothing is concluded.
    assert orphans(REBALANCING, set(), {"t": 2}) == frozenset()


def test_the_same_orphans_on_confirm_checks_in_a_row_are_reported_once() -> None:
    watch = _watch()
    watch.observe(STABLE, {("t", 0)}, {"t": 2})
    assert watch.take() == frozenset()  # seen once: maybe a rebalance about to start
    watch.observe(STABLE, {("t", 0)}, {"t": 2})
    assert watch.take() == {("t", 1)}
    assert watch.take() == frozenset()  # taken
    assert watch.rejoins == 1


def test_a_change_between_checks_starts_the_count_again() -> None:
    watch = _watch()
    watch.observe(STABLE, {("t", 0)}, {"t": 3})  # 1 and 2 orphaned
    watch.observe(STABLE, {("t", 0), ("t", 1)}, {"t": 3})  # only 2 now: a different set
    assert watch.take() == frozenset()
    watch.observe(REBALANCING, set(), {"t": 3})  # a rebalance resets the streak
    watch.observe(STABLE, {("t", 0), ("t", 1)}, {"t": 3})
    assert watch.take() == frozenset()
    watch.observe(STABLE, {("t", 0), ("t", 1)}, {"t": 3})
    assert watch.take() == {("t", 2)}


def test_a_fully_owned_group_is_never_reported() -> None:
    watch = _watch(confirm=1)
    for _ in range(3):
        watch.observe(STABLE, {("t", 0), ("t", 1)}, {"t": 2})
    assert watch.take() == frozenset() and watch.rejoins == 0
