"""The deduper's topic watch: describes sent without waiting, answers taken once they have come."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any, cast

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicCollection, Uuid
from confluent_kafka.admin import AdminClient
from ferryman import controller
from ferryman.renewing_admin import RenewingAdmin
from ferryman_deduper import _topic_watch
from ferryman_deduper._topic_watch import TopicWatch


class _Admin:
    """Keeps each describe's futures for the test to answer."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Future[Any]]] = []

    def describe_topics(self, collection: TopicCollection, request_timeout: float) -> dict[str, Future[Any]]:
        assert request_timeout > 0
        futures: dict[str, Future[Any]] = {name: Future() for name in collection.topic_names}
        self.sent.append(futures)
        return futures


def _renewing(admin: _Admin) -> RenewingAdmin:
    return RenewingAdmin(lambda: cast(AdminClient, admin), what="the test's admin client")


def _desc(partitions: int) -> SimpleNamespace:
    return SimpleNamespace(topic_id=Uuid(1, 2), partitions=list(range(partitions)))


def test_answers_are_taken_when_they_have_come_and_names_asked_meanwhile_go_next() -> None:
    admin = _Admin()
    watch = TopicWatch(_renewing(admin))
    watch.ask(["a", "b", "c"])
    assert [sorted(f) for f in admin.sent] == [["a", "b", "c"]]
    watch.ask(["d"])  # one describe in flight at a time
    assert len(admin.sent) == 1
    first = admin.sent[0]
    first["a"].set_result(_desc(3))
    assert watch.answers() == {}  # not every topic answered yet: the loop goes on

    first["b"].set_exception(KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)))
    first["c"].set_exception(KafkaException(KafkaError(KafkaError._TIMED_OUT)))
    found = watch.answers()
    assert set(found) == {"a", "b"}  # c: no answer, nothing known
    info = found["a"]
    assert info is not None and info.partitions == 3
    assert info.topic_id == (1).to_bytes(8, "big") + (2).to_bytes(8, "big")
    assert found["b"] is None  # the cluster does not know it
    assert [sorted(f) for f in admin.sent] == [["a", "b", "c"], ["d"]]  # the name asked meanwhile
    assert watch.answers() == {}


def test_nothing_asked_sends_nothing() -> None:
    admin = _Admin()
    watch = TopicWatch(_renewing(admin))
    watch.ask([])
    assert watch.answers() == {}
    assert admin.sent == []


def test_a_describe_left_waiting_refreshes_the_metadata_every_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(controller, "CONTROLLER_WAIT_S", 0.05)
    clock = [100.0]
    monkeypatch.setattr(_topic_watch, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    refreshed: list[object] = []

    def refresh(admin: object) -> bool:
        refreshed.append(admin)
        return True

    monkeypatch.setattr(controller, "refresh", refresh)
    admin = _Admin()
    watch = TopicWatch(_renewing(admin))
    watch.ask(["a"])
    assert watch.answers() == {}
    assert refreshed == []  # just sent: an answer takes ms
    clock[0] += 0.06
    assert watch.answers() == {}
    assert watch.answers() == {}
    assert refreshed == [admin]  # once per wait: the controller a refresh names takes the request
    clock[0] += 0.06
    assert watch.answers() == {}
    assert refreshed == [admin, admin]  # right after a kill, a refresh may still name the dead node
    admin.sent[0]["a"].set_result(_desc(1))
    assert set(watch.answers()) == {"a"}


def test_a_describe_its_client_never_fails_is_given_up_and_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client stuck with no usable broker may never fail its request: past its timeout the watch asks again."""
    clock = [100.0]
    monkeypatch.setattr(_topic_watch, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setattr(controller, "refresh", lambda _admin: True)
    admin = _Admin()
    renewing = _renewing(admin)
    suspected: list[bool] = []
    monkeypatch.setattr(renewing, "suspect", lambda: suspected.append(True))
    watch = TopicWatch(renewing, request_timeout_s=10.0)
    watch.ask(["a", "b"])
    clock[0] += 10.0 + _topic_watch.ABANDON_AFTER_TIMEOUT_S - 0.1
    assert watch.answers() == {} and len(admin.sent) == 1  # still within the client's own timeout and margin
    clock[0] += 0.2
    assert watch.answers() == {}
    assert suspected == [True]  # the client is checked (replaced if it alone gets no answer)
    assert [sorted(f) for f in admin.sent] == [["a", "b"], ["a", "b"]]  # the names asked again
    admin.sent[1]["a"].set_result(_desc(1))
    admin.sent[1]["b"].set_result(_desc(2))
    assert set(watch.answers()) == {"a", "b"}
