"""Rows of a round run at the same time (``--together``): an A/B whose rows meet the same machine.

Run one after another, two rows of a round meet a machine whose speed drifts
between them: on this VM the same row's CPU per record moves +-20 % from one
copy to the next, more than the 5 % an observability row may cost (issue 26).
Run together, both rows' processes share the cores for the same seconds, so
what slows one slows the other, and the ratio of their CPU per record keeps
only what differs between them. The rate of a row run together is its share
of a shared machine, not its rate alone.

A `Gate` keeps the rows in step: every row launches when all are prepared, and
none is stopped and audited (which reads its copies back, on the same cores)
before every row has copied.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

_T = TypeVar("_T")
_R = TypeVar("_R")


class Gate:
    """Where rows that run together wait for each other (a reusable barrier that a failed row opens)."""

    def __init__(self, parties: int, timeout_s: float) -> None:
        """Gate parties rows; a row waits at most timeout_s for the others, then goes on alone."""
        self._barrier = threading.Barrier(parties, timeout=timeout_s)

    def wait(self) -> None:
        """Wait until every row is here (at once when one has left or the wait timed out)."""
        # Broken: a row left (failed, unavailable or done), and the others no longer wait for it.
        with contextlib.suppress(threading.BrokenBarrierError):
            self._barrier.wait()

    def leave(self) -> None:
        """This row waits no more: open the gate for good, for the rows waiting and to come."""
        self._barrier.abort()


def run_together(rows: Sequence[_T], run: Callable[[_T, Gate], _R], timeout_s: float) -> list[_R]:
    """run(row, gate) for every row at once, one thread each; the results in rows' order.

    A row that returns or raises leaves the gate, so the others never wait on it.
    """
    gate = Gate(len(rows), timeout_s)

    def one(row: _T) -> _R:
        try:
            return run(row, gate)
        finally:
            gate.leave()

    with ThreadPoolExecutor(len(rows), thread_name_prefix="bench-row") as pool:
        return list(pool.map(one, rows))
