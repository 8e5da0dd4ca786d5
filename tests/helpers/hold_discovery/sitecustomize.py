"""Holds a ferryman-wrapper's first periodic topic discovery at the source until a test lets it go.

A test puts this directory first on ``PYTHONPATH`` of one wrapper process, with
``FERRYMAN_TEST_DISCOVERY_GATE`` naming a file that does not exist yet. The
wrapper's second source topic listing (the first is at start-up, the second is the
first periodic one) then creates ``<gate>.held`` and waits until the gate file
exists before it asks the source: a source cluster slow to answer, on demand.
Everything else in the process is the real wrapper on real clusters.
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient
from ferryman import topics

_GATE = Path(os.environ["FERRYMAN_TEST_DISCOVERY_GATE"])
_HOLD_LIMIT_S = 300.0  # never hang a forgotten process for ever
_real_list_topic_names = topics.list_topic_names
_calls = itertools.count(1)


def _held_list_topic_names(admin: AdminClient, timeout_s: float) -> list[str]:
    if next(_calls) == 2:
        _GATE.with_suffix(".held").touch()
        deadline = time.monotonic() + _HOLD_LIMIT_S
        while not _GATE.exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # waiting for a file another process creates: nothing to block on
    return _real_list_topic_names(admin, timeout_s)


topics.list_topic_names = _held_list_topic_names
