"""Admin requests follow a lost controller: a waiting request has its client's metadata refreshed while it waits."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from ferryman import controller, topics
from ferryman.errors import KafkaOperationError


class _Admin:
    """list_topics (the refresh) blocks until released; each call is counted."""

    def __init__(self, *, fail: bool = False) -> None:
        self.refreshes = 0
        self.release = threading.Event()
        self.refreshed = threading.Event()
        self._fail = fail

    def list_topics(self, timeout: float) -> SimpleNamespace:
        assert timeout > 0
        self.refreshes += 1
        self.refreshed.set()
        self.release.wait(5)
        if self._fail:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        return SimpleNamespace(controller_id=2)


def _refresh_again(admin: _Admin) -> None:
    """Start a second refresh once the first has ended, and wait for it to ask."""
    admin.release.set()
    deadline = time.monotonic() + 5
    while controller.refresh(admin) is False:  # type: ignore[arg-type]
        assert time.monotonic() < deadline, "the refresh did not end"
        time.sleep(0.01)
    while admin.refreshes < 2:
        assert time.monotonic() < deadline, "the second refresh did not ask"
        time.sleep(0.01)


def test_one_refresh_per_client_at_a_time_and_another_once_it_ended() -> None:
    admin, other = _Admin(), _Admin()
    assert controller.refresh(admin)  # type: ignore[arg-type]
    assert admin.refreshed.wait(5)
    assert not controller.refresh(admin)  # type: ignore[arg-type]  # one under way
    assert controller.refresh(other)  # type: ignore[arg-type]  # clients are apart
    other.release.set()
    _refresh_again(admin)  # a new refresh starts once the first ended
    assert admin.refreshes == 2


def test_a_failed_refresh_is_let_go_and_can_be_tried_again() -> None:
    admin = _Admin(fail=True)
    assert controller.refresh(admin)  # type: ignore[arg-type]
    _refresh_again(admin)
    assert admin.refreshes == 2


def test_an_answer_that_comes_at_once_refreshes_nothing() -> None:
    admin = _Admin()
    done: Future[int] = Future()
    done.set_result(7)
    assert topics.answer(done, 30, "describe", admin=admin) == 7  # type: ignore[arg-type]
    assert admin.refreshes == 0


def test_a_request_left_waiting_refreshes_the_metadata_and_takes_the_answer_that_follows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(controller, "CONTROLLER_WAIT_S", 0.05)
    admin = _Admin()
    future: Future[str] = Future()

    def new_controller_answers() -> None:  # as librdkafka re-sends to the controller the refresh names
        if admin.refreshed.wait(5):
            future.set_result("described")
        admin.release.set()

    threading.Thread(target=new_controller_answers, daemon=True).start()
    assert topics.answer(future, 5, "describe topic t", admin=admin) == "described"  # type: ignore[arg-type]
    assert admin.refreshes == 1


def test_without_an_answer_the_metadata_is_refreshed_all_along_then_the_request_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(controller, "CONTROLLER_WAIT_S", 0.05)
    admin = _Admin()
    admin.release.set()
    never: Future[Any] = Future()
    began = time.monotonic()
    with pytest.raises(KafkaOperationError, match=r"describe topic t: no answer within 0.5 s"):
        topics.answer(never, 0.5, "describe topic t", admin=admin)  # type: ignore[arg-type]
    assert 0.45 <= time.monotonic() - began < 2
    assert admin.refreshes >= 3  # a refresh right after a kill may name the dead node again
