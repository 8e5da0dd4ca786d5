"""RecentDurations: the deduper's window of recent commit times (status RPC); SlowSteps: a slow restore, named."""

from __future__ import annotations

import logging
import threading
from unittest.mock import patch

import pytest
from ferryman_deduper._timings import RecentDurations, SlowSteps


def test_empty_window_reports_zero() -> None:
    d = RecentDurations()
    assert d.median_ms() == 0.0
    assert d.max_ms() == 0.0
    assert d.total_s() == 0.0


def test_median_and_max_in_milliseconds() -> None:
    d = RecentDurations()
    for s in (0.030, 0.010, 0.020, 0.200):
        d.add(s)
    assert d.median_ms() == pytest.approx(25.0)
    assert d.max_ms() == pytest.approx(200.0)


def test_only_the_last_window_counts_but_the_total_keeps_everything() -> None:
    d = RecentDurations(window=3)
    d.add(5.0)  # a slow start, pushed out by three later commits
    for s in (0.001, 0.002, 0.003):
        d.add(s)
    assert d.max_ms() == pytest.approx(3.0)
    assert d.median_ms() == pytest.approx(2.0)
    assert d.total_s() == pytest.approx(5.006)


def test_window_must_hold_something() -> None:
    with pytest.raises(ValueError, match="window must be at least 1"):
        RecentDurations(window=0)


def test_summaries_while_another_thread_records() -> None:
    d = RecentDurations(window=64)
    stop = threading.Event()

    def record() -> None:
        while not stop.is_set():
            d.add(0.004)

    writer = threading.Thread(target=record)
    writer.start()
    try:
        for _ in range(2000):
            assert d.median_ms() in (0.0, pytest.approx(4.0))
            assert d.max_ms() in (0.0, pytest.approx(4.0))
    finally:
        stop.set()
        writer.join()


def test_slow_steps_name_the_step_that_took_the_time(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("test.slow")
    clock = iter([100.0, 100.1, 106.1, 106.2])
    with (
        caplog.at_level(logging.WARNING, logger="test.slow"),
        patch("ferryman_deduper._timings.time.monotonic", lambda: next(clock)),
    ):
        steps = SlowSteps(log, slow_s=5.0)
        steps.done("describing")
        steps.done("reading offsets")
        steps.done("reading state")
        steps.report("restoring [0, 1]")
    assert [r.getMessage() for r in caplog.records] == [
        "restoring [0, 1] took 6.2 s: describing 0.1 s, reading offsets 6.0 s, reading state 0.1 s"
    ]


def test_fast_steps_say_nothing(caplog: pytest.LogCaptureFixture) -> None:
    steps = SlowSteps(logging.getLogger("test.fast"), slow_s=5.0)
    steps.done("describing")
    with caplog.at_level(logging.DEBUG, logger="test.fast"):
        steps.report("restoring [0]")
    assert caplog.records == []
