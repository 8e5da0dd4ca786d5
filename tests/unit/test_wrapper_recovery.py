"""The wrapper's step recovery: capped, doubling waits between attempts, short again once a step passes."""

from __future__ import annotations

import threading
from typing import cast

from ferryman_wrapper._clients import LoopClients, StepRecovery


def _recovery() -> StepRecovery:
    stop = threading.Event()
    stop.set()  # a backoff returns at once (none is waited here; the clients are never used)
    return StepRecovery(clients=cast(LoopClients, None), stop=stop, health_changed=lambda: None)


def test_waits_double_up_to_the_cap() -> None:
    recovery = _recovery()
    assert [recovery.next_backoff() for _ in range(7)] == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]


def test_a_passed_step_makes_the_next_wait_short_again() -> None:
    recovery = _recovery()
    for _ in range(5):
        recovery.next_backoff()
    recovery.reset_backoff()  # what the first topic discovery does once it has passed
    assert recovery.next_backoff() == 0.2
    recovery.next_backoff()
    recovery.reason = "KafkaException: all brokers down"
    recovery.recovered()
    assert recovery.reason == ""
    assert recovery.next_backoff() == 0.2
