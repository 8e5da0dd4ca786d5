"""Issue 29 on a real cluster: the destination topics of many specs are made in one batch.

The deduper's control tick and DestinationTopics run in process against the destination cluster; the specs
are what a wrapper would send over the link. The requests are counted on the wire: librdkafka's statistics
count every request an admin client sends, by kind.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, ResourceType
from ferryman.config import DeduperConfig, FlowConfig, NamingConfig
from ferryman.naming import NamingPolicy
from ferryman.renewing_admin import RenewingAdmin
from ferryman.topics import committed_ranges, describe_topics
from ferryman.v1 import envelope_pb2, state_pb2
from ferryman_deduper._control import ControlHub, ControlTicker
from ferryman_deduper._destinations import DestinationTopicError, DestinationTopics
from ferryman_deduper._gaps import GapTracker

from tests.helpers.kafka import KafkaCluster, create_topic, produce_sequences

pytestmark = pytest.mark.integration

_TIMEOUT_S = 30.0
#: librdkafka's statistics interval: counts are read from the first report made after a call returned.
_STATS_INTERVAL_MS = 100
_TOPICS = 40
_SOURCE_CONFIGS = {"retention.ms": "123456789", "max.message.bytes": "2000000", "segment.ms": "3600000"}


class _CountedAdmin:
    """An AdminClient whose requests to the brokers are counted by kind, from librdkafka's statistics."""

    def __init__(self, bootstrap: str) -> None:
        self._reports: list[dict[str, Any]] = []
        conf: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "statistics.interval.ms": _STATS_INTERVAL_MS,
            "stats_cb": lambda report: self._reports.append(json.loads(report)),
        }
        self.admin = AdminClient(conf)

    def sent(self) -> dict[str, int]:
        """Requests sent so far, by kind, summed over the brokers: from a report made after this call."""
        now_us = time.monotonic() * 1e6  # librdkafka's report "ts" is the same monotonic clock, in us
        deadline = time.monotonic() + 10 * _STATS_INTERVAL_MS / 1000
        while not (self._reports and self._reports[-1]["ts"] >= now_us):
            assert time.monotonic() < deadline, "no statistics report from the admin client"
            self.admin.poll(_STATS_INTERVAL_MS / 1000)
        counts: dict[str, int] = {}
        for broker in self._reports[-1]["brokers"].values():
            for kind, n in broker.get("req", {}).items():
                counts[kind] = counts.get(kind, 0) + n
        return counts


@dataclass
class _Deduper:
    """The destination side of a deduper: its topic maker and the control tick that feeds it specs."""

    counted: _CountedAdmin
    topics: DestinationTopics
    ticker: ControlTicker
    hub: ControlHub
    producer: Producer


@pytest.fixture
def deduper(destination_cluster: KafkaCluster) -> Iterator[_Deduper]:
    bootstrap = destination_cluster.bootstrap_servers
    counted = _CountedAdmin(bootstrap)
    topics = DestinationTopics(
        admin=RenewingAdmin(lambda: counted.admin, what="the test's admin client"),
        consumer_config={"bootstrap.servers": bootstrap},
        specs_topic="unused",  # the specs come over the (in-process) link
        naming=NamingPolicy("src", NamingConfig()),
        replicate_configs=True,
        timeout_s=_TIMEOUT_S,
        flow_wrote=lambda _names: set(),  # a new flow: its state names no topic
    )
    topics.apply_flow(FlowConfig(name="f", source="src", target="dst", topic_configs_exclude=[r"segment\.ms"]))
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    topics.producer = producer
    hub = ControlHub("d1", "f")
    ticker = ControlTicker(
        hub=hub,
        dc=DeduperConfig(),
        committed={},
        gaps=GapTracker(),
        staging_lag=lambda: 0,
        destination_trouble=lambda: "",
        process_resent=lambda _env: None,
        add_specs=topics.add_specs,
        partition_counters={},
    )
    try:
        yield _Deduper(counted, topics, ticker, hub, producer)
    finally:
        topics.close()
        producer.flush(_TIMEOUT_S)


def _spec(topic: str, partitions: int) -> state_pb2.TopicSpec:
    return state_pb2.TopicSpec(cluster_id="source-id", topic=topic, partitions=partitions, configs=_SOURCE_CONFIGS)


def _partitions_of(i: int) -> int:
    return 1 + i % 6


def _send(deduper: _Deduper, specs: Sequence[state_pb2.TopicSpec]) -> None:
    """What the link does with a wrapper's TopicSpecs message: queue every spec, then the loop's tick."""
    for spec in specs:
        deduper.hub.specs.put(spec)
    deduper.ticker.tick(time.monotonic())


def _produce_to_last_partitions(producer: Producer, partitions: dict[str, int]) -> None:
    """A record to the last partition of each topic at once: the producer must know every partition already."""
    errors: list[str] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            errors.append(f"{msg.topic()} [{msg.partition()}]: {err}")

    for name, n in partitions.items():
        producer.produce(name, value=b"x", partition=n - 1, on_delivery=on_delivery)
    assert producer.flush(_TIMEOUT_S) == 0
    assert errors == []


def test_many_specs_at_once_make_every_topic_with_one_create_request(
    deduper: _Deduper, destination_cluster: KafkaCluster, unique_name: Callable[[str], str]
) -> None:
    bootstrap = destination_cluster.bootstrap_servers
    base = unique_name("many")
    sources = [f"{base}-{i}" for i in range(_TOPICS)]
    # One destination topic is there already, empty and as big as its source: taken, not created.
    create_topic(bootstrap, f"src.{sources[0]}", _partitions_of(0))
    before = deduper.counted.sent()

    _send(deduper, [_spec(s, _partitions_of(i)) for i, s in enumerate(sources)])

    sent = deduper.counted.sent()
    assert sent.get("CreateTopics", 0) - before.get("CreateTopics", 0) == 1  # one request for 39 topics
    wanted = {f"src.{s}": _partitions_of(i) for i, s in enumerate(sources)}
    found = describe_topics(deduper.counted.admin, wanted, _TIMEOUT_S)
    assert {name: info.partitions for name, info in found.items()} == wanted
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resources = [ConfigResource(ResourceType.TOPIC, name) for name in wanted if name != f"src.{sources[0]}"]
    for resource, future in admin.describe_configs(resources, request_timeout=_TIMEOUT_S).items():
        configs = future.result(_TIMEOUT_S)
        assert configs["retention.ms"].value == "123456789", resource.name
        assert configs["max.message.bytes"].value == "2000000", resource.name
        # Left out by the flow's topic_configs_exclude.
        assert configs["segment.ms"].source != ConfigSource.DYNAMIC_TOPIC_CONFIG.value, resource.name
    _produce_to_last_partitions(deduper.producer, wanted)

    # The sources grow: one CreatePartitions request for all that grew, and nothing for the others.
    grown = {s: _partitions_of(i) + 2 for i, s in enumerate(sources) if i % 4 == 0}
    before = sent
    _send(deduper, [_spec(s, grown.get(s, _partitions_of(i))) for i, s in enumerate(sources)])
    sent = deduper.counted.sent()
    assert sent.get("CreatePartitions", 0) - before.get("CreatePartitions", 0) == 1
    assert sent.get("CreateTopics", 0) == before.get("CreateTopics", 0)
    wanted.update({f"src.{s}": n for s, n in grown.items()})
    found = describe_topics(deduper.counted.admin, wanted, _TIMEOUT_S)
    assert {name: info.partitions for name, info in found.items()} == wanted
    _produce_to_last_partitions(deduper.producer, {f"src.{s}": n for s, n in grown.items()})


@pytest.mark.parametrize("misfit", ["too-small", "foreign-records"])
def test_a_misfit_topic_among_many_is_refused_before_any_is_created(
    deduper: _Deduper, destination_cluster: KafkaCluster, unique_name: Callable[[str], str], misfit: str
) -> None:
    bootstrap = destination_cluster.bootstrap_servers
    base = unique_name("misfit")
    sources = [f"{base}-{i}" for i in range(_TOPICS)]
    odd = sources[_TOPICS // 2]
    # Someone else's topic where the flow would write odd: too small for its 4 partitions, or holding records.
    create_topic(bootstrap, f"src.{odd}", 2 if misfit == "too-small" else 4)
    if misfit == "foreign-records":
        produce_sequences(bootstrap, f"src.{odd}", [1], 3)
    before = deduper.counted.sent()

    with pytest.raises(DestinationTopicError) as caught:
        _send(deduper, [_spec(s, 4) for s in sources])

    if misfit == "too-small":
        assert f"destination topic src.{odd} has 2 partitions, fewer than the 4 of source topic {odd}" in str(
            caught.value
        )
    else:
        assert f"destination topic src.{odd} partition 1 already holds records (offsets 0..2)" in str(caught.value)
    assert deduper.counted.sent().get("CreateTopics", 0) == before.get("CreateTopics", 0)
    assert describe_topics(deduper.counted.admin, [f"src.{s}" for s in sources if s != odd], _TIMEOUT_S) == {}


def test_a_peers_commit_between_the_two_looks_does_not_make_the_flows_records_foreign(
    destination_cluster: KafkaCluster, unique_name: Callable[[str], str]
) -> None:
    # Another deduper of the flow (a rebalance, scale-out) writes a topic this deduper finds at first sight,
    # and commits just after this deduper read the flow's state, which did not name the topic yet. Its
    # records are the flow's own. With the state read before the destinations' offsets, the commit
    # landed between the two looks and the deduper exited with a configuration error ("already holds
    # records that this flow did not write"; a scale-out run with processes capped at 0.1 core).
    bootstrap = destination_cluster.bootstrap_servers
    source = unique_name("peer")
    create_topic(bootstrap, f"src.{source}", 2)
    peer = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique_name("peer-deduper")})
    peer.init_transactions(_TIMEOUT_S)
    peer.begin_transaction()
    for partition in range(2):
        peer.produce(f"src.{source}", value=b"copied", partition=partition)
    assert peer.flush(_TIMEOUT_S) == 0  # written, not committed: the transaction is open
    looked: list[set[str]] = []

    def flow_wrote(names: Collection[str]) -> set[str]:
        looked.append(set(names))
        peer.commit_transaction(_TIMEOUT_S)  # the state (read now) does not name the topic; the commit lands
        return set()

    topics = DestinationTopics(
        admin=RenewingAdmin(lambda: AdminClient({"bootstrap.servers": bootstrap}), what="the test's admin client"),
        consumer_config={"bootstrap.servers": bootstrap},
        specs_topic="unused",
        naming=NamingPolicy("src", NamingConfig()),
        replicate_configs=True,
        timeout_s=_TIMEOUT_S,
        flow_wrote=flow_wrote,
    )
    topics.apply_flow(FlowConfig(name="f", source="src", target="dst"))
    producer = Producer({"bootstrap.servers": bootstrap})
    topics.producer = producer
    try:
        topics.add_specs([_spec(source, 2)])  # raised DestinationTopicError with the state read first
        assert looked == [{f"src.{source}"}]
        name = topics.resolve(envelope_pb2.SourcePartition(cluster_id="source-id", topic=source, partition=1))
        assert name == f"src.{source}"
        # The premise: the peer's records are committed now, where a look after the state read would see them.
        admin = AdminClient({"bootstrap.servers": bootstrap})
        committed = {(name, 0): (0, 2), (name, 1): (0, 2)}  # a record and its commit marker in each
        assert committed_ranges(admin, {name: 2}, _TIMEOUT_S) == committed
    finally:
        topics.close()
        producer.flush(_TIMEOUT_S)
