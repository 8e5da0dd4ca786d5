"""Holds a ferryman-wrapper's first periodic topic discovery at the source until a test lets it go.

A test puts this directory first on ``PYTHONPATH`` of one wrapper process, with
``FERRYMAN_TEST_DISCOVERY_HELD`` naming a marker file. The wrapper's second source
topic listing (the first is at start-up, the second is the first periodic one) then
creates the marker and waits, before it asks the source, until the process gets
SIGUSR1: a source cluster slow to answer, on demand. When the wait ends
it creates ``<marker>.released``. Everything else in the process is the real wrapper
on real clusters.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient
from ferryman import topics

_HELD = Path(os.environ["FERRYMAN_TEST_DISCOVERY_HELD"])
_HOLD_LIMIT_S = 300.0  # never hang a forgotten process for ever
#: Set by the SIGUSR1 handler: a plain store (an Event.set() there can wait for ever for the lock of an
#: Event.wait() the main thread is in; see docs/notes.md, "No lock in a signal handler").
_released: list[bool] = []
_real_list_topic_names = topics.list_topic_names
_calls = itertools.count(1)


def _held_list_topic_names(admin: AdminClient, timeout_s: float) -> list[str]:
    if next(_calls) == 2:
        _HELD.touch()
        deadline = time.monotonic() + _HOLD_LIMIT_S
        while not _released and time.monotonic() < deadline:
            time.sleep(0.05)  # the handler runs on the main thread between these, whichever thread waits
        _HELD.with_suffix(".released").touch()
    return _real_list_topic_names(admin, timeout_s)


topics.list_topic_names = _held_list_topic_names
# Set at start-up, on the main thread (the only one that may); runs there, and the
# listing waits wherever it was called from.
signal.signal(signal.SIGUSR1, lambda _signum, _frame: _released.append(True))
