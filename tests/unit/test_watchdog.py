"""Deadlines that hold for blocking calls (ferryman.watchdog)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from ferryman.errors import WedgedCallError
from ferryman.watchdog import MAX_ABANDONED, Watchdog, close_or_park


def test_a_call_returns_its_result_and_raises_what_it_raised() -> None:
    w = Watchdog("t")
    assert w.call(lambda: 42, what="answer", deadline_s=5) == 42
    with pytest.raises(ZeroDivisionError):
        w.call(lambda: 1 / 0, what="divide", deadline_s=5)
    assert w.abandoned == []
    w.shutdown()


def test_a_call_past_its_deadline_is_abandoned_with_its_client_and_the_next_call_runs() -> None:
    w = Watchdog("t")
    gate = threading.Event()
    client = object()
    started = time.monotonic()
    with pytest.raises(WedgedCallError) as caught:
        w.call(gate.wait, what="never returns", deadline_s=0.2, client=client)
    assert time.monotonic() - started < 2.0
    assert "never returns" in str(caught.value)
    [(_worker, parked, _future)] = w.abandoned
    assert parked is client
    # A fresh worker: the stuck one does not hold the next call back.
    assert w.call(lambda: "next", what="next", deadline_s=1) == "next"
    gate.set()  # the abandoned call may return at last; nothing waits for it
    w.shutdown()


def test_the_watchdog_is_exhausted_after_max_abandoned_calls() -> None:
    w = Watchdog("t")
    gate = threading.Event()
    for _ in range(MAX_ABANDONED):
        assert not w.exhausted
        with pytest.raises(WedgedCallError):
            w.call(gate.wait, what="stuck", deadline_s=0.01)
    assert w.exhausted
    gate.set()


def test_a_wedged_call_does_not_keep_the_process_from_exiting() -> None:
    """concurrent.futures' threads are joined at exit; the watchdog's are daemons."""
    code = (
        "import threading; from ferryman.watchdog import Watchdog; from ferryman.errors import WedgedCallError\n"
        "w = Watchdog('t')\n"
        "try: w.call(threading.Event().wait, what='stuck', deadline_s=0.1)\n"
        "except WedgedCallError: print('abandoned')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20, check=True)
    assert out.stdout.strip() == "abandoned"


def test_close_or_park_gives_up_a_close_that_never_returns() -> None:
    gate = threading.Event()
    started = time.monotonic()
    close_or_park(gate.wait, object(), what="closing", deadline_s=0.2)
    assert time.monotonic() - started < 2.0
    gate.set()
