"""LagClock: lag in seconds from the log-end offsets seen at each scrape."""

from __future__ import annotations

import pytest
from ferryman.metrics._lag import LagClock

KEY = ("t", 0)


def test_unknown_partition_has_no_lag() -> None:
    assert LagClock().seconds_behind(KEY, 5, now=10.0) is None


def test_caught_up_is_zero() -> None:
    clock = LagClock()
    clock.observe(KEY, 100, now=0.0)
    assert clock.seconds_behind(KEY, 100, now=50.0) == 0.0


def test_time_of_the_oldest_missing_record_is_interpolated_between_samples() -> None:
    clock = LagClock()
    clock.observe(KEY, 10, now=0.0)
    clock.observe(KEY, 20, now=10.0)  # offsets 10..19 appended during (0, 10]: offset 14 at 5 s
    assert clock.seconds_behind(KEY, 14, now=30.0) == pytest.approx(25.0)
    assert clock.seconds_behind(KEY, 19, now=30.0) == pytest.approx(20.0)


def test_a_record_older_than_every_sample_reads_as_a_lower_bound() -> None:
    clock = LagClock()
    clock.observe(KEY, 50, now=100.0)  # first sight: offsets below 50 were there already
    assert clock.seconds_behind(KEY, 10, now=100.0) == 0.0
    assert clock.seconds_behind(KEY, 10, now=160.0) == pytest.approx(60.0)


def test_an_offset_seen_again_keeps_the_time_it_was_first_seen() -> None:
    clock = LagClock()
    clock.observe(KEY, 10, now=0.0)
    clock.observe(KEY, 20, now=10.0)
    clock.observe(KEY, 20, now=40.0)  # no new record: a stalled source must not make old records look young
    assert clock.seconds_behind(KEY, 19, now=50.0) == pytest.approx(40.0)


def test_a_log_that_goes_backwards_starts_a_new_table() -> None:
    clock = LagClock()
    clock.observe(KEY, 1000, now=0.0)
    clock.observe(KEY, 5, now=100.0)  # topic re-created
    assert clock.seconds_behind(KEY, 0, now=110.0) == pytest.approx(10.0)


def test_samples_are_bounded_and_forgotten_with_their_partition() -> None:
    clock = LagClock(max_samples=3)
    for i in range(10):
        clock.observe(KEY, 10 * (i + 1), now=float(i))
    # Only (7, 80), (8, 90), (9, 100) are kept: offset 0 reads from the oldest of them.
    assert clock.seconds_behind(KEY, 0, now=20.0) == pytest.approx(13.0)
    clock.retain([])
    assert clock.seconds_behind(KEY, 0, now=20.0) is None


def test_at_least_two_samples_are_kept() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        LagClock(max_samples=1)
