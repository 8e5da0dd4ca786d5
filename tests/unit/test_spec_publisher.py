"""The wrapper's topic discovery off its loop thread (ferryman_wrapper._specs.SpecPublisher).

Pure bookkeeping: the source reads run on a thread of their own, and a view read
earlier never overrides what a later one published. That discovery follows new
topics, grown partitions and re-created topics on real clusters is
``tests/integration/test_flow_lifecycle.py``.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from ferryman import topics
from ferryman.errors import KafkaOperationError
from ferryman.naming import TopicFilter
from ferryman.renewing_admin import RenewingAdmin
from ferryman.topics import TopicInfo
from ferryman.v1 import state_pb2
from ferryman_wrapper._specs import SourceView, SpecPublisher

OLD_ID = b"\x01" * 16
NEW_ID = b"\x02" * 16


@dataclass
class _Producer:
    """Acknowledges every spec at flush(), or fails them all."""

    fail: str | None = None
    sent: list[state_pb2.TopicSpec] = field(default_factory=list)
    pending: list[Callable[[object, object], None]] = field(default_factory=list)

    def produce(self, topic: str, *, key: bytes, value: bytes, on_delivery: Callable[[object, object], None]) -> None:
        self.sent.append(state_pb2.TopicSpec.FromString(value))
        self.pending.append(on_delivery)

    def flush(self, timeout: float) -> int:
        for report in self.pending:
            report(self.fail, None)
        self.pending.clear()
        return 0


@dataclass
class _Admin:
    """Stands in for RenewingAdmin: counts the failures reported to it."""

    client: AdminClient = field(default_factory=lambda: cast(AdminClient, object()))
    suspected: int = 0

    def suspect(self) -> None:
        self.suspected += 1


def _publisher(producer: _Producer, admin: _Admin | None = None) -> SpecPublisher:
    return SpecPublisher(
        source_admin=cast(RenewingAdmin, admin or _Admin()),
        producer=cast(Producer, producer),
        specs_topic="flow.topic-specs.internal",
        cluster_id="src",
        topic_filter=TopicFilter(include=(re.compile("orders.*"),), exclude=()),
        replicate_configs=False,
        timeout_s=1.0,
    )


def _view(started: float, topic_id: bytes, partitions: int = 3, names: tuple[str, ...] = ("orders",)) -> SourceView:
    infos = {n: TopicInfo(n, topic_id, partitions) for n in names}
    return SourceView(started, list(names), infos, {})


def test_a_view_read_before_a_later_one_does_not_bring_back_an_old_topic_id() -> None:
    producer = _Producer()
    specs = _publisher(producer)
    assert specs.publish(_view(20.0, NEW_ID)) == ["orders"]  # e.g. a rebalance described the re-created topic
    assert specs.publish(_view(10.0, OLD_ID)) == ["orders"]  # the periodic read began before it
    assert specs.published["orders"].topic_id == NEW_ID
    assert [s.topic_id for s in producer.sent] == [NEW_ID]


def test_a_topic_id_change_seen_by_this_process_is_a_re_creation_the_wrapper_acts_on() -> None:
    specs = _publisher(_Producer())
    specs.publish(_view(1.0, OLD_ID))
    specs.publish(_view(2.0, OLD_ID, partitions=6))  # grew: same topic
    assert specs.recreated == set()
    specs.publish(_view(3.0, NEW_ID))
    assert specs.recreated == {"orders"}


def test_a_later_view_publishes_what_changed_and_only_that() -> None:
    producer = _Producer()
    specs = _publisher(producer)
    announced: list[list[str]] = []
    specs.on_change = lambda changed: announced.append([s.topic for s in changed])
    specs.publish(_view(1.0, OLD_ID, names=("orders", "orders-eu")))
    specs.publish(_view(2.0, OLD_ID, names=("orders", "orders-eu")))  # nothing changed: nothing sent
    specs.publish(_view(3.0, OLD_ID, partitions=6, names=("orders",)))  # orders grew; orders-eu not in this view
    assert [(s.topic, s.partitions) for s in producer.sent] == [("orders", 3), ("orders-eu", 3), ("orders", 6)]
    assert announced == [["orders", "orders-eu"], ["orders"]]
    assert specs.published["orders"].partitions == 6


def test_a_selected_topic_gone_before_it_was_described_is_not_subscribed() -> None:
    specs = _publisher(_Producer())
    view = SourceView(1.0, ["orders", "orders-gone"], {"orders": TopicInfo("orders", OLD_ID, 3)}, {})
    assert specs.publish(view) == ["orders"]


def test_a_spec_the_destination_refused_is_neither_recorded_nor_announced() -> None:
    specs = _publisher(_Producer(fail="Broker: Topic authorization failed"))
    announced: list[object] = []
    specs.on_change = announced.append
    with pytest.raises(KafkaOperationError, match="Topic authorization failed"):
        specs.publish(_view(1.0, OLD_ID))
    assert specs.published == {}
    assert announced == []


def test_background_observation_returns_at_once_and_hands_over_the_view(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()

    def slow_list(_admin: object, _timeout: float) -> list[str]:
        assert release.wait(10), "the test never released the source read"
        return ["orders", "payments"]

    described: list[list[str]] = []

    def describe(_admin: object, names: Any, _timeout: float) -> dict[str, TopicInfo]:
        described.append(list(names))
        return {n: TopicInfo(n, OLD_ID, 3) for n in names}

    monkeypatch.setattr(topics, "list_topic_names", slow_list)
    monkeypatch.setattr(topics, "describe_topics", describe)
    specs = _publisher(_Producer())
    future = specs.observe_in_background()
    assert not future.done()  # the caller goes on while the source has not answered
    release.set()
    view = future.result(timeout=10)
    assert view.names == ["orders"]  # the flow's filter applied
    assert described == [["orders"]]
    assert specs.published == {}  # observing publishes nothing: publish() does, on the loop thread


def test_a_failed_background_observation_raises_where_its_result_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_list(_admin: object, _timeout: float) -> list[str]:
        raise KafkaOperationError("listing source topics", TimeoutError("no answer in 1.0 s"))

    monkeypatch.setattr(topics, "list_topic_names", failing_list)
    admin = _Admin()
    future = _publisher(_Producer(), admin).observe_in_background()
    with pytest.raises(KafkaOperationError, match="listing source topics"):
        future.result(timeout=10)
    assert admin.suspected == 1  # a transient failure has the admin client checked (renewed if it alone is stuck)


def test_a_republish_that_fails_is_sent_again_by_the_next_publish() -> None:
    """The spec topic made again: every spec goes to it again, even if the first try meets it still unknown."""
    producer = _Producer()
    specs = _publisher(producer)
    specs.publish(_view(1.0, OLD_ID, names=("orders", "orders-eu")))
    producer.sent.clear()
    producer.fail = "Local: Unknown topic"  # just made: the producer does not know it yet
    with pytest.raises(KafkaOperationError, match="Unknown topic"):
        specs.republish()
    producer.fail = None
    producer.sent.clear()
    specs.publish(_view(2.0, OLD_ID, names=("orders", "orders-eu")))  # nothing changed at the source
    assert sorted(s.topic for s in producer.sent) == ["orders", "orders-eu"]
    producer.sent.clear()
    specs.publish(_view(3.0, OLD_ID, names=("orders", "orders-eu")))
    assert producer.sent == []  # sent once: no more republishing
