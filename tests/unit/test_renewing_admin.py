"""When `RenewingAdmin` checks its client, and what a check decides (fake clients; real broker: integration)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import cast

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from ferryman import controller
from ferryman.renewing_admin import RenewingAdmin, suspect_client
from ferryman.watchdog import _PARKED

from tests.helpers.kafka import wait_until


@dataclass
class _Client:
    """Answers metadata (one broker) or fails it, probe after probe (the last answer repeats); may hold each."""

    answering: list[bool]
    hold: threading.Event | None = None
    probes: list[float] = field(default_factory=list)

    def list_topics(self, timeout: float) -> SimpleNamespace:
        self.probes.append(timeout)
        if self.hold is not None:
            assert self.hold.wait(10)
        if not self.answering[min(len(self.probes), len(self.answering)) - 1]:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        return SimpleNamespace(brokers={1: object()})


def _holder(clients: list[_Client], interval_s: float = 60.0) -> RenewingAdmin:
    queue = list(clients)
    return RenewingAdmin(lambda: cast(AdminClient, queue.pop(0)), what="test", check_interval_s=interval_s)


def test_a_stuck_client_is_replaced_by_an_answering_candidate_and_parked() -> None:
    stuck, fresh = _Client(answering=[False]), _Client(answering=[True])
    admin = _holder([stuck, fresh])
    assert admin.check() is True
    assert admin.client is cast(AdminClient, fresh) and admin.renewals == 1
    assert any(p is stuck for p in _PARKED)  # never destroyed: a destroy may not return


def test_a_client_that_answers_within_its_reconnect_backoff_is_kept() -> None:
    """Right after an outage a client may only wait to reconnect: the candidate answering first is not enough."""
    reconnecting, fresh = _Client(answering=[False, True]), _Client(answering=[True])
    admin = _holder([reconnecting, fresh])
    assert admin.check() is False
    assert admin.client is cast(AdminClient, reconnecting) and admin.renewals == 0
    assert reconnecting.probes == [5.0, 15.0]  # asked again with librdkafka's longest backoff and a margin


def test_a_client_that_answers_is_kept_and_no_candidate_is_made() -> None:
    answering = _Client(answering=[True])
    admin = _holder([answering])  # a second make() would fail: the queue is empty
    assert admin.check() is False
    assert admin.client is cast(AdminClient, answering)


def test_suspicions_start_one_check_at_a_time_and_at_most_once_per_interval() -> None:
    release = threading.Event()
    held = _Client(answering=[True], hold=release)
    admin = _holder([held], interval_s=60.0)
    admin.suspect()
    wait_until(lambda: len(held.probes) == 1, 10)
    admin.suspect()  # a check is under way: nothing more
    release.set()
    wait_until(lambda: not admin._checking, 10)
    admin.suspect()  # within the interval: nothing more
    time.sleep(0.1)
    assert len(held.probes) == 1
    admin._next_check = 0.0  # the interval has passed
    admin.suspect()
    wait_until(lambda: len(held.probes) == 2, 10)


def test_a_failed_controller_refresh_of_a_held_client_has_it_checked_and_replaced() -> None:
    """Every admin request that waits past its controller wait refreshes its client: a failure suspects it."""
    stuck, fresh = _Client(answering=[False]), _Client(answering=[True])
    admin = _holder([stuck, fresh])
    assert controller.refresh(cast(AdminClient, stuck), timeout_s=0.1)
    wait_until(lambda: admin.client is cast(AdminClient, fresh), 10)
    assert admin.renewals == 1
    suspect_client(cast(AdminClient, object()))  # a client no holder holds: nothing to check
