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
import threading
from pathlib import Path

from confluent_kafka.admin import AdminClient
from ferryman import topics
from ferryman.signals import on_signals

_HELD = Path(os.environ["FERRYMAN_TEST_DISCOVERY_HELD"])
_HOLD_LIMIT_S = 300.0  # never hang a forgotten process for ever
#: Set on SIGUSR1 by `ferryman.signals`' relay thread, never in a signal handler (docs/notes.md, "No lock
#: in a signal handler").
_release = threading.Event()
_real_list_topic_names = topics.list_topic_names
_calls = itertools.count(1)


def _held_list_topic_names(admin: AdminClient, timeout_s: float) -> list[str]:
    if next(_calls) == 2:
        _HELD.touch()
        _release.wait(_HOLD_LIMIT_S)
        _HELD.with_suffix(".released").touch()
    return _real_list_topic_names(admin, timeout_s)


topics.list_topic_names = _held_list_topic_names
# Set at start-up, on the main thread (the only one that may); the listing waits wherever it was called from.
on_signals(lambda _signum: _release.set(), [signal.SIGUSR1])
