"""Stop signals (SIGTERM, SIGINT) acted on by a thread of their own, never in a Python signal handler.

A Python signal handler runs on the main thread between two bytecodes, wherever that thread is, also
inside a lock it holds. ``threading.Event.set`` and ``queue.Queue.put`` take such a lock
(``Event.wait`` holds its condition's lock around its timed wait), so a handler calling them can wait
for ever on its own thread: a CI run's wrapper hung that way in a test hook's ``Event.set``, and a
SIGTERM reaching a service inside ``_stop.wait()`` could do the same to ``shutdown()``.

So the C-level handler (no GIL, no lock) writes the signal's number to a pipe
(``signal.set_wakeup_fd``), and a daemon thread reads it and calls the handler registered for it. The
Python-level handler is a no-op, there only so that the C handler runs. A main thread stuck in a C call
is no obstacle either: the thread still hears the signal, and can arm the drain's deadlines.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType

_log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class _Relay:
    """The process's one wakeup pipe and the thread that reads it."""

    def __init__(self) -> None:
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)  # the C handler never blocks; a full pipe drops the byte
        self._read_fd, self._write_fd = read_fd, write_fd
        self.handlers: dict[int, Callable[[int], None]] = {}
        self.claim()
        threading.Thread(target=self._run, name="signals", daemon=True).start()

    def claim(self) -> None:
        """Make the pipe the process's wakeup fd (again: there is one per process, and a library may set its own)."""
        signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)

    def _run(self) -> None:
        while True:
            for signum in os.read(self._read_fd, 64):
                handler = self.handlers.get(signum)
                if handler is None:
                    continue  # another signal with a Python handler of its own
                try:
                    handler(signum)
                except Exception:  # the relay must outlive a failing handler: the next signal still counts
                    _log.exception("handling %s failed", signal.Signals(signum).name)


_relay: _Relay | None = None


def _ignore(_signum: int, _frame: FrameType | None) -> None:
    """The Python-level handler: the relay thread does the work (this runs wherever the main thread is)."""


def on_signals(handler: Callable[[int], None], signums: Iterable[signal.Signals] = STOP_SIGNALS) -> None:
    """Call handler(signum) on the relay thread for each of signums received from now on.

    From the main thread (``signal.signal``'s rule). Called again, it replaces the handler and installs
    the no-op handlers again (PySpark installs a SIGINT handler of its own when its context starts).
    """
    global _relay  # noqa: PLW0603 - one wakeup fd per process
    if _relay is None:
        _relay = _Relay()
    else:
        _relay.claim()
    for signum in signums:
        _relay.handlers[int(signum)] = handler
        signal.signal(signum, _ignore)
