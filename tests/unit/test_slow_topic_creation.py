"""A topic the cluster accepted but does not describe yet is a transient fault, never a configuration error.

A broker creates every partition's log before it describes a new topic: for a few hundred partitions on a loaded
machine that took over 30 s here, and the services exited (1) with "does not exist and could not be created".
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from ferryman import topics
from ferryman.errors import KafkaOperationError
from ferryman.kafka_errors import is_transient
from ferryman.topics import InternalTopic, ensure_internal_topics


class _SlowAdmin:
    """Creates topics at once but describes them only after ``visible_after`` describe calls."""

    def __init__(self, visible_after: int) -> None:
        self.visible_after = visible_after
        self.describes = 0
        self.created: dict[str, int] = {}

    def describe_topics(self, collection: Any, request_timeout: float) -> dict[str, Future[Any]]:
        self.describes += 1
        out: dict[str, Future[Any]] = {}
        for name in collection.topic_names:
            fut: Future[Any] = Future()
            if name in self.created and self.describes > self.visible_after:
                desc = type("Desc", (), {"topic_id": None, "partitions": [0] * self.created[name]})()
                fut.set_result(desc)
            else:
                fut.set_exception(KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)))
            out[name] = fut
        return out

    def create_topics(self, new: Iterable[Any], request_timeout: float, operation_timeout: float) -> dict[str, Any]:
        out: dict[str, Future[None]] = {}
        for t in new:
            self.created[t.topic] = t.num_partitions
            fut: Future[None] = Future()
            fut.set_result(None)
            out[t.topic] = fut
        return out


_WANTED = [InternalTopic("staging", 256, {}, "staging")]


@pytest.fixture(autouse=True)
def _no_sleep_no_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(topics, "uuid_bytes", lambda _id: b"")
    monkeypatch.setattr("ferryman.topics.time.sleep", lambda _s: None)


def test_a_created_topic_that_never_shows_is_a_transient_fault() -> None:
    admin = _SlowAdmin(visible_after=10**9)
    with pytest.raises(KafkaOperationError) as caught:
        ensure_internal_topics(admin, _WANTED, 0.05)  # type: ignore[arg-type]
    assert "not in the cluster's metadata" in str(caught.value)
    assert is_transient(caught.value)  # waited out by the loops, never an exit for bad configuration


def test_the_visibility_budget_outlasts_the_request_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(range(10**6))
    monkeypatch.setattr("ferryman.topics.time.monotonic", lambda: float(next(clock)))  # one "second" per look
    admin = _SlowAdmin(visible_after=40)
    with pytest.raises(KafkaOperationError):
        ensure_internal_topics(admin, _WANTED, 5.0)  # type: ignore[arg-type]
    admin = _SlowAdmin(visible_after=40)
    ensure_internal_topics(admin, _WANTED, 5.0, visible_budget_s=120.0)  # type: ignore[arg-type]
    assert admin.created == {"staging": 256}


class _SilentAdmin:
    """An admin whose answers never come (a frozen broker): every future stays pending."""

    def describe_configs(self, resources: Iterable[Any], request_timeout: float) -> dict[Any, Future[Any]]:
        return {r: Future() for r in resources}

    def describe_topics(self, collection: Any, request_timeout: float) -> dict[str, Future[Any]]:
        return {name: Future() for name in collection.topic_names}


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda a: topics.replicable_configs(a, ["t"], 0.05), id="replicable_configs"),
        pytest.param(lambda a: topics.describe_topics(a, ["t"], 0.05), id="describe_topics"),
    ],
)
def test_an_answer_that_never_comes_is_a_transient_error_naming_the_call(call: Any) -> None:
    # Bare, concurrent.futures.TimeoutError is neither a Kafka nor a Ferryman error: a wrapper whose
    # assignment callback met it (a source broker frozen 9 s) exited 1 instead of waiting it out.
    with pytest.raises(KafkaOperationError, match=r"topic t: no answer within 0\.05 s") as err:
        call(_SilentAdmin())
    assert is_transient(err.value)
