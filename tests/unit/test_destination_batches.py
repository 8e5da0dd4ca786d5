"""Destination topics are made in batches: a few requests for all the topics of a call, not a few per topic.

Issue 29: made one at a time (describe, create, describe, metadata per topic), 100 source topics held the
deduper's loop ~5 s at start. These tests run the deduper's DestinationTopics against an admin client and a
producer that answer from memory and count the requests; the same on real brokers is in
tests/integration/test_destination_batches.py.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from ferryman import topics
from ferryman.config import DeduperConfig, FlowConfig, NamingConfig
from ferryman.errors import KafkaOperationError
from ferryman.kafka_errors import is_transient
from ferryman.naming import NamingPolicy
from ferryman.renewing_admin import RenewingAdmin
from ferryman.v1 import envelope_pb2, state_pb2
from ferryman_deduper._control import ControlHub, ControlTicker
from ferryman_deduper._destinations import DestinationTopicError, DestinationTopics
from ferryman_deduper._gaps import GapTracker

CLUSTER = "source-cluster-id"


def _done(value: Any = None, error: BaseException | None = None) -> Future[Any]:
    fut: Future[Any] = Future()
    if error is None:
        fut.set_result(value)
    else:
        fut.set_exception(error)
    return fut


@dataclass
class _Admin:
    """A cluster in memory behind AdminClient's calls, keeping a log of the requests made.

    hidden: topics the cluster creates but never describes (a broker still creating their logs).
    """

    partitions: dict[str, int] = field(default_factory=dict)
    hidden: set[str] = field(default_factory=set)
    requests: list[tuple[str, list[str]]] = field(default_factory=list)
    created: dict[str, NewTopic] = field(default_factory=dict)
    #: Topic ids as DescribeTopics gives them (a new one per creation); the tests that look at them map
    #: ``topics.uuid_bytes`` to the identity.
    ids: dict[str, bytes] = field(default_factory=dict)

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.requests]

    def describe_topics(self, collection: Any, request_timeout: float) -> dict[str, Future[Any]]:
        names = list(collection.topic_names)
        self.requests.append(("describe", names))
        unknown = KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
        return {
            name: _done(SimpleNamespace(topic_id=self.ids.get(name), partitions=[0] * self.partitions[name]))
            if name in self.partitions and name not in self.hidden
            else _done(error=unknown)
            for name in names
        }

    def create_topics(
        self, new: Iterable[NewTopic], request_timeout: float, operation_timeout: float
    ) -> dict[str, Future[Any]]:
        new = list(new)
        self.requests.append(("create", [t.topic for t in new]))
        out = {}
        for t in new:
            if t.topic in self.partitions:
                out[t.topic] = _done(error=KafkaException(KafkaError(KafkaError.TOPIC_ALREADY_EXISTS)))
                continue
            self.created[t.topic] = t
            self.partitions[t.topic] = t.num_partitions
            self.ids[t.topic] = f"{t.topic}#{len(self.requests)}".encode()
            out[t.topic] = _done()
        return out

    def create_partitions(self, new: Iterable[NewPartitions], request_timeout: float) -> dict[str, Future[Any]]:
        new = list(new)
        self.requests.append(("grow", [p.topic for p in new]))
        for p in new:
            self.partitions[p.topic] = p.new_total_count
        return {p.topic: _done() for p in new}

    def list_offsets(self, offsets: dict[TopicPartition, Any], **_kwargs: Any) -> dict[TopicPartition, Future[Any]]:
        self.requests.append(("offsets", sorted({tp.topic for tp in offsets})))
        return {tp: _done(SimpleNamespace(offset=0)) for tp in offsets}  # every partition empty


@dataclass
class _Producer:
    """The producer's metadata: the cluster's topics, less those that never show in it (lagging)."""

    admin: _Admin
    lagging: set[str] = field(default_factory=set)
    requests: list[str | None] = field(default_factory=list)

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        self.requests.append(topic)
        shown = {n: p for n, p in self.admin.partitions.items() if n not in self.admin.hidden | self.lagging}
        return SimpleNamespace(
            topics={n: SimpleNamespace(error=None, partitions=dict.fromkeys(range(p))) for n, p in shown.items()}
        )


@pytest.fixture(autouse=True)
def _no_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(topics, "uuid_bytes", lambda _id: b"")
    monkeypatch.setattr("ferryman.topics.time.sleep", lambda _s: None)
    monkeypatch.setattr("ferryman_deduper._destinations.time.sleep", lambda _s: None)


def _spec(topic: str, partitions: int, **configs: str) -> state_pb2.TopicSpec:
    return state_pb2.TopicSpec(cluster_id=CLUSTER, topic=topic, partitions=partitions, configs=configs)


def _destinations(
    admin: _Admin,
    *,
    wrote: Collection[str] = (),
    asked: list[set[str]] | None = None,
    asked_after: list[list[str]] | None = None,
) -> tuple[DestinationTopics, _Producer]:
    """asked: the names of each look at the flow's state; asked_after: the admin requests made before each."""

    def flow_wrote(names: Collection[str]) -> set[str]:
        if asked is not None:
            asked.append(set(names))
        if asked_after is not None:
            asked_after.append(admin.kinds())
        return set(names) & set(wrote)

    dest = DestinationTopics(
        admin=RenewingAdmin(lambda: cast(AdminClient, admin), what="the test's admin client"),
        consumer_config={},
        specs_topic="ferryman.f.specs.internal",
        naming=NamingPolicy("src", NamingConfig()),
        replicate_configs=True,
        # The fakes answer at once; a topic that does not show, does not show within this.
        timeout_s=0.05,
        flow_wrote=flow_wrote,
    )
    dest.apply_flow(
        FlowConfig(name="f", source="src", target="dst", replication_factor=3, topic_configs_exclude=[r"segment\..*"])
    )
    producer = _Producer(admin)
    dest.producer = producer  # type: ignore[assignment]
    return dest, producer


def _resolve(dest: DestinationTopics, topic: str, partition: int = 0) -> str:
    return dest.resolve(envelope_pb2.SourcePartition(cluster_id=CLUSTER, topic=topic, partition=partition))


def test_a_batch_of_specs_costs_one_request_of_each_kind() -> None:
    admin = _Admin()
    dest, producer = _destinations(admin)
    specs = [_spec(f"t{i}", 1 + i % 7, **{"retention.ms": "1000", "segment.ms": "60000"}) for i in range(40)]
    dest.add_specs(specs)
    # One describe; one CreateTopics of all 40; one describe until they show; one metadata look.
    assert admin.kinds() == ["describe", "create", "describe"]
    assert sorted(admin.requests[1][1]) == sorted(f"src.t{i}" for i in range(40))
    assert producer.requests == [None]  # the whole cluster's metadata, once, not a request per topic
    for i in range(40):
        made = admin.created[f"src.t{i}"]
        assert made.num_partitions == 1 + i % 7
        assert made.replication_factor == 3
        assert made.config == {"retention.ms": "1000"}  # segment.ms: left out by the flow's topic_configs_exclude
    # Ready: a record of any of them costs no request.
    before = list(admin.requests)
    assert _resolve(dest, "t6", 6) == "src.t6"
    assert admin.requests == before
    # A periodic sync with nothing new asks nothing either.
    dest._tail_specs = lambda: None  # type: ignore[method-assign]  # no spec topic here
    dest.sync_all()
    assert admin.requests == before


def test_configs_are_not_copied_when_the_flow_says_so() -> None:
    admin = _Admin()
    dest, _ = _destinations(admin)
    dest._replicate_configs = False
    dest.add_specs([_spec("quiet", 2, **{"retention.ms": "1000"})])
    assert admin.created["src.quiet"].config == {}


def test_one_topic_that_does_not_show_fails_alone_and_transiently() -> None:
    admin = _Admin(hidden={"src.slow"})
    dest, _ = _destinations(admin)
    with pytest.raises(KafkaOperationError) as caught:
        dest.add_specs([_spec("a", 2), _spec("slow", 3), _spec("b", 4)])
    assert "creating destination topics src.slow" in str(caught.value)
    assert "not in the cluster's metadata" in str(caught.value)
    assert is_transient(caught.value)  # waited out by the loop, never an exit
    # The others were recorded ready before the error.
    before = list(admin.requests)
    assert (_resolve(dest, "a", 1), _resolve(dest, "b", 3)) == ("src.a", "src.b")
    assert admin.requests == before
    # Once the broker describes it, the next look takes it (as found empty: it might be anyone's by now).
    admin.hidden.clear()
    assert _resolve(dest, "slow", 2) == "src.slow"


def test_a_topic_late_in_the_producers_metadata_fails_alone() -> None:
    admin = _Admin()
    dest, producer = _destinations(admin)
    producer.lagging = {"src.late"}
    with pytest.raises(KafkaOperationError) as caught:
        dest.add_specs([_spec("on-time", 2), _spec("late", 2)])
    assert "waiting for destination topics src.late" in str(caught.value)
    assert is_transient(caught.value)
    assert len(producer.requests) > 1  # looked again until the time was up
    before = list(admin.requests)
    assert _resolve(dest, "on-time", 1) == "src.on-time"
    assert admin.requests == before


def test_a_misfit_among_existing_topics_stops_the_batch_before_anything_is_created() -> None:
    # src.narrow: someone else's (the flow's state never names it) and smaller than its source.
    admin = _Admin(partitions={"src.narrow": 2, "src.empty": 3})
    asked: list[set[str]] = []
    dest, _ = _destinations(admin, asked=asked)
    with pytest.raises(DestinationTopicError) as caught:
        dest.add_specs([_spec("new", 1), _spec("empty", 3), _spec("narrow", 4)])
    assert "destination topic src.narrow has 2 partitions, fewer than the 4 of source topic narrow" in str(caught.value)
    assert "create" not in admin.kinds()
    assert asked == [{"src.narrow", "src.empty"}]  # one look at the flow's state for the batch


def test_existing_topics_are_checked_together_and_the_flows_own_are_grown_together() -> None:
    # src.ours-*: written by the flow before, smaller than the source now (it grew): grown, not refused.
    # src.found: empty and big enough, the flow never wrote it: taken after one offsets pass.
    admin = _Admin(partitions={"src.ours-1": 1, "src.ours-2": 2, "src.found": 3})
    asked: list[set[str]] = []
    asked_after: list[list[str]] = []
    dest, _ = _destinations(admin, wrote={"src.ours-1", "src.ours-2"}, asked=asked, asked_after=asked_after)
    dest.add_specs([_spec("ours-1", 4), _spec("ours-2", 4), _spec("found", 3), _spec("new", 2)])
    assert admin.kinds() == ["describe", "offsets", "offsets", "create", "describe", "grow", "describe"]
    assert sorted(admin.requests[1][1]) == ["src.found", "src.ours-1", "src.ours-2"]  # one offsets pass for all
    # The destinations' offsets are asked before the flow's state is read: another deduper's commit between
    # the two looks would otherwise show its records without the state that names them (foreign, wrongly).
    assert asked_after == [["describe", "offsets", "offsets"]]
    assert sorted(admin.requests[5][1]) == ["src.ours-1", "src.ours-2"]
    assert asked == [{"src.ours-1", "src.ours-2", "src.found"}]
    assert admin.partitions["src.ours-1"] == admin.partitions["src.ours-2"] == 4
    # The source grows again later: only the grown topic is asked about, and it is grown in place.
    before = len(admin.requests)
    dest.add_specs([_spec("found", 5), _spec("new", 2)])
    assert admin.requests[before:] == [
        ("describe", ["src.found"]),
        ("grow", ["src.found"]),
        ("describe", ["src.found"]),
    ]
    assert asked == [{"src.ours-1", "src.ours-2", "src.found"}]  # ready before: no check again


def test_a_record_beyond_the_spec_grows_its_topic_on_its_own() -> None:
    admin = _Admin()
    dest, _ = _destinations(admin)
    dest.add_specs([_spec("t", 2)])
    dest.load_specs = lambda: None  # type: ignore[method-assign]  # the spec topic still says 2
    assert _resolve(dest, "t", 4) == "src.t"
    assert admin.partitions["src.t"] == 5
    assert admin.requests[-3:] == [("describe", ["src.t"]), ("grow", ["src.t"]), ("describe", ["src.t"])]


def test_two_source_topics_named_alike_share_one_topic_made_once() -> None:
    admin = _Admin()
    dest, _ = _destinations(admin)
    other = state_pb2.TopicSpec(cluster_id="re-created-cluster", topic="t", partitions=6)
    dest.add_specs([_spec("t", 4), other])
    assert admin.requests[1] == ("create", ["src.t"])  # a duplicate in one CreateTopics fails the request
    assert admin.created["src.t"].num_partitions == 6
    assert dest.resolve(envelope_pb2.SourcePartition(cluster_id="re-created-cluster", topic="t", partition=5))


# -- the control link hands the specs over in one call ---------------------------------------------------------


def _ticker(add_specs: Any) -> tuple[ControlTicker, ControlHub]:
    hub = ControlHub("d1", "f")
    ticker = ControlTicker(
        hub=hub,
        dc=DeduperConfig(),
        committed={},
        gaps=GapTracker(),
        staging_lag=lambda: 0,
        destination_trouble=lambda: "",
        process_resent=lambda _env: None,
        add_specs=add_specs,
        partition_counters={},
    )
    return ticker, hub


def test_a_tick_hands_every_queued_spec_over_in_one_call() -> None:
    calls: list[list[str]] = []
    ticker, hub = _ticker(lambda specs: calls.append([s.topic for s in specs]))
    ticker.tick(0.0)
    assert calls == []  # nothing queued: no call
    for i in range(40):
        hub.specs.put(_spec(f"t{i}", 1))
    ticker.tick(1.0)
    assert calls == [[f"t{i}" for i in range(40)]]


def test_a_transient_failure_of_the_batch_is_logged_and_left_to_the_sync(caplog: pytest.LogCaptureFixture) -> None:
    def fail(_specs: Sequence[state_pb2.TopicSpec]) -> None:
        raise KafkaOperationError("creating destination topics src.t0", TimeoutError("slow"))

    ticker, hub = _ticker(fail)
    hub.specs.put(_spec("t0", 1))
    with caplog.at_level(logging.WARNING):
        ticker.tick(0.0)
    assert "destination topics of 1 new topic specs not all ready yet" in caplog.text
    assert hub.specs.empty()


def test_a_misfit_topic_stops_the_deduper() -> None:
    def refuse(_specs: Sequence[state_pb2.TopicSpec]) -> None:
        raise DestinationTopicError("destination topic src.t0 has 1 partitions")

    ticker, hub = _ticker(refuse)
    hub.specs.put(_spec("t0", 2))
    with pytest.raises(DestinationTopicError):
        ticker.tick(0.0)


def _found(admin: _Admin, dest: DestinationTopics) -> dict[str, topics.TopicInfo | None]:
    """What the deduper's topic watch would find for the ready topics: None for those the cluster does not know."""
    described = topics.describe_topics(admin, dest.ready_names(), 1.0)  # type: ignore[arg-type]
    return {name: described.get(name) for name in dest.ready_names()}


def test_a_destination_topic_deleted_or_recreated_under_the_flow_is_forgotten_and_made_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """After a failed transaction the deduper asks which ready topics vanished (one describe for them all,
    answered off its loop: ``TopicWatch``).

    A deleted topic failed every transaction that wrote it, and with them every other topic's records, for
    as long as the deduper kept it ready: forgotten, the next record makes it again. Each is named once
    made ready again; one a broker merely did not know for a moment is not news.
    """
    monkeypatch.setattr(topics, "uuid_bytes", lambda topic_id: topic_id or b"")
    caplog.set_level(logging.INFO, logger="ferryman_deduper._destinations")
    admin = _Admin()
    dest, _producer = _destinations(admin, wrote=["src.a", "src.b"])
    dest.add_specs([_spec("a", 2), _spec("b", 2), _spec("c", 2)])
    assert dest.ready_names() == ["src.a", "src.b", "src.c"]
    assert dest.forget_vanished(_found(admin, dest)) == []
    assert dest.forget_vanished({}) == []  # no answer: nothing is known, nothing forgotten

    del admin.partitions["src.a"], admin.ids["src.a"]  # deleted by an operator
    admin.ids["src.b"] = b"someone else's"  # deleted and made again by someone else
    assert dest.forget_vanished(_found(admin, dest)) == ["src.a", "src.b"]
    del admin.requests[:]
    assert _resolve(dest, "a") == "src.a"
    assert ("create", ["src.a"]) in admin.requests  # made again
    del admin.requests[:]
    assert _resolve(dest, "b") == "src.b"
    assert "create" not in admin.kinds()  # taken as it is
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2
    assert errors[0].startswith("destination topic src.a was deleted while flow records were written to it")
    assert errors[1].startswith("destination topic src.b was deleted and re-created by someone else")
    assert all("audits report them missing" in e for e in errors)
    assert dest.forget_vanished(_found(admin, dest)) == []  # the new incarnations are the ready ones now

    caplog.clear()
    admin.hidden.add("src.c")  # a broker that does not know the topic for a moment
    assert dest.forget_vanished(_found(admin, dest)) == ["src.c"]
    admin.hidden.clear()
    assert _resolve(dest, "c") == "src.c"
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert any("src.c is there after all" in r.getMessage() for r in caplog.records)
