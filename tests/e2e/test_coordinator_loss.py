"""A three-node destination loses a key node while records flow: the deduper's transaction coordinator's,
or (nightly) the active KRaft controller.

With three replicas of everything and two required in sync, the destination cluster keeps serving
with one node gone: the coordinator of the deduper's ``transactional.id`` moves to another node,
and so do the leaders of the staging, state and destination partitions that node led; a lost active
controller is replaced by another voter. The services must follow (no process exits), the copy must
stay exact, and records must go on being committed while the node is still down; the node is then
restarted and rejoins under the running flow.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient
from ferryman.config import load_config
from ferryman.naming import FlowNames
from ferryman.topics import describe_topics, watermark_offsets
from ferryman_local import MultiNodeCluster, transaction_coordinator

from tests.helpers.kafka import (
    KafkaCluster,
    assert_exact_copy,
    create_topic,
    produce_sequences,
    read_all,
    wait_until,
)
from tests.helpers.services import RunningFlow, running_flow
from tests.helpers.streams import SequenceProducer

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

_log = logging.getLogger(__name__)

PARTITIONS = 4
#: The goal of issue 24: records are committed again within 30 s of the coordinator's node being lost.
RECOVERY_GOAL_S = 30.0
# ~32 s of stream at 2000 records/s: the first commits (~5 s after the flow starts), the kill,
# the recovery with the node down (~10 s: fencing the node takes broker.session.timeout.ms, 5 s,
# plus elections and the coordinator's load) and the node's restart (~5-13 s on a busy 2-core
# machine) all land mid-stream, so records are seen flowing after the rejoin too.
RATE_PER_S = 2000.0
PER_PARTITION = 16_000
# How long one poll of the watching consumer blocks: short, so the recovery time is measured to ~0.1 s.
_WATCH_POLL_S = 0.1


@pytest.fixture(scope="module")
def destination3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultiNodeCluster]:
    """A destination cluster of three nodes, for this module only (its nodes get killed)."""
    cluster = MultiNodeCluster.start("destination3", nodes=3, work_dir=tmp_path_factory.mktemp("destination3"))
    try:
        yield cluster
    finally:
        cluster.kill_all()  # its data is thrown away: a controlled shutdown of three nodes would cost ~7 s


class NewRecords:
    """Watches a destination topic (read_committed, from its end now) for records produced after a mark.

    Values are ``SequenceProducer``'s ``topic:partition:index``; a record whose index is above the
    mark was handed to the source producer after the mark was taken. Each partition is watched on
    its own: one partition whose leader moved can stall while the others flow.
    """

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"ferryman-test-watch-{uuid.uuid4().hex[:8]}",  # required, never used
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            }
        )
        # The last stable offsets now, explicitly: a position resolved later would skip records.
        ends = [watermark_offsets(self._consumer, topic, p, budget_s=10)[1] for p in range(PARTITIONS)]
        self._consumer.assign([TopicPartition(topic, p, end) for p, end in enumerate(ends)])
        self.highest = dict.fromkeys(range(PARTITIONS), -1)
        """The highest index seen so far, per partition."""

    def seen_above(self, mark: int) -> bool:
        """Read what has been committed since the last call; True once every partition has a record above mark."""
        for m in self._consumer.consume(num_messages=10_000, timeout=_WATCH_POLL_S):
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                _log.info("watching consumer: %s", err)  # a leader moved: librdkafka fetches again
                continue
            value = m.value() or b""
            partition = m.partition() or 0
            self.highest[partition] = max(self.highest[partition], int(value.rsplit(b":", 1)[1]))
        return min(self.highest.values()) > mark

    def behind(self, mark: int) -> list[int]:
        """The partitions with no record above mark yet."""
        return [p for p, highest in self.highest.items() if highest <= mark]

    def close(self) -> None:
        """Close the consumer."""
        self._consumer.close()


def _recovery_s(watch: NewRecords, producer: SequenceProducer, since: float) -> float | None:
    """Seconds from since until every partition has committed a record produced after since; None if not in the goal."""
    mark = producer.sent // PARTITIONS  # an index per partition: everything above it was produced later
    try:
        wait_until(
            lambda: watch.seen_above(mark), RECOVERY_GOAL_S, 0.0, message="a record produced since committed in each"
        )
    except AssertionError:
        _log.info("partitions with nothing produced since committed: %s", watch.behind(mark))
        return None
    return time.monotonic() - since


def _shown(seconds: float | None) -> str:
    return "never within the goal" if seconds is None else f"{seconds:.1f}s"


def _partitions(bootstrap: str, topic: str) -> int:
    found = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10).topics.get(topic)
    return 0 if found is None or found.error is not None else len(found.partitions)


def _replication_factors(bootstrap: str, names: Callable[[str], bool]) -> dict[str, set[int]]:
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    return {
        name: {len(p.replicas) for p in t.partitions.values()} for name, t in metadata.topics.items() if names(name)
    }


def _wait_started(flow: RunningFlow) -> None:
    """Wait for the deduper to own its partitions (a new topic's configs are retried across brokers)."""
    flow.deduper.wait_for_log("ready (now own", 60)
    _check_alive(flow, "at start-up")


def _check_alive(flow: RunningFlow, when: str) -> None:
    for proc in (flow.wrapper, flow.deduper):
        assert proc.alive, f"{proc.kind} exited {when}:\n{proc.output()[-4000:]}"


@pytest.mark.parametrize(
    "victim_role",
    [
        pytest.param("transaction-coordinator"),
        # A flow rides through it in 10-20 s. The long chaos run's "stall until the killed controller was
        # back" was its sampler reading ListOffsets' -1001 as an end (docs/notes.md, Pitfalls).
        pytest.param("active-controller", marks=pytest.mark.nightly),
    ],
)
def test_losing_a_key_node_loses_nothing_and_stops_nothing(
    source_cluster: KafkaCluster,
    destination3: MultiNodeCluster,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    victim_role: str,
) -> None:
    topic = unique_name("coordloss")
    flow_name = unique_name("flow")
    create_topic(source_cluster.bootstrap_servers, topic, PARTITIONS)
    producer = SequenceProducer(
        source_cluster.bootstrap_servers, [topic], PARTITIONS, per_partition=PER_PARTITION, rate_per_s=RATE_PER_S
    )
    dst = destination3.bootstrap_servers
    with running_flow(source_cluster, destination3, tmp_path, flow=flow_name, topics=[topic]) as flow:
        _wait_started(flow)
        transactional_id = FlowNames.of(load_config(flow.config).flows[0]).transactional_id("d1")
        producer.start()
        wait_until(lambda: _partitions(dst, f"src.{topic}") == PARTITIONS, 60, message="the destination topic created")
        first = NewRecords(dst, f"src.{topic}")
        try:
            wait_until(lambda: first.seen_above(-1), 60, 0.0, message="the first records committed at the destination")
        finally:
            first.close()

        coordinator = transaction_coordinator(dst, transactional_id)
        victim = coordinator if victim_role == "transaction-coordinator" else destination3.active_controller()
        watch = NewRecords(dst, f"src.{topic}")
        try:
            killed = time.monotonic()
            destination3.kill(victim)
            _log.info(
                "killed node %d (%s; the transaction coordinator of %s is node %d)",
                victim,
                victim_role,
                transactional_id,
                coordinator,
            )
            # The node stays down until the flow has shown it goes on without it (or the goal has passed).
            while_down_s = _recovery_s(watch, producer, killed)
            _log.info(
                "every partition committed a record produced after the kill %s after it, node %d still down",
                _shown(while_down_s),
                victim,
            )
            _check_alive(flow, "after the coordinator's node was killed")
            moved_to = transaction_coordinator(dst, transactional_id)
            destination3.restart(victim)
            restarted = time.monotonic()
            _log.info(
                "node %d back after %.1fs down; the coordinator is on node %d", victim, restarted - killed, moved_to
            )
            streaming = producer.is_alive()
            after_restart_s = _recovery_s(watch, producer, restarted) if streaming else None
            _log.info(
                "every partition committed a record produced after the restart %s after it",
                _shown(after_restart_s) if streaming else "(stream over)",
            )
            assert while_down_s is not None, (
                f"not every partition committed a record produced after the kill within {RECOVERY_GOAL_S:g}s with node "
                f"{victim} down; after its restart: {_shown(after_restart_s)}\n{flow.deduper.output()[-4000:]}"
            )
        finally:
            watch.close()

        producer.join(120)
        assert producer.error is None, producer.error
        _check_alive(flow, "after the coordinator's node came back")
        src = read_all(source_cluster.bootstrap_servers, topic)
        expected = sum(len(v) for v in src.values())
        assert expected == producer.sent
        assert_exact_copy(src, read_all(dst, f"src.{topic}", expected=expected, timeout_s=120))
        assert flow.wrapper.starts == flow.deduper.starts == 1
        assert flow.wrapper.terminate() == 0
        assert flow.deduper.terminate() == 0

    assert moved_to != victim
    # Ferryman creates its topics with the broker's default replication factor: three here.
    factors = _replication_factors(dst, lambda name: flow_name in name or name == f"src.{topic}")
    assert f"src.{topic}" in factors
    assert len(factors) >= 3, factors  # staging, state, offset map (and the topic specs) besides the copy
    assert all(f == {3} for f in factors.values()), factors
    if streaming:
        assert after_restart_s is not None, (
            f"not every partition committed a record produced after the restart in {RECOVERY_GOAL_S:g}s"
        )


def test_a_flow_started_while_the_destination_has_lost_its_controller_quorum_waits_for_it(
    source_cluster: KafkaCluster,
    destination3: MultiNodeCluster,
    unique_name: Callable[[str], str],
    tmp_path: Path,
) -> None:
    """Two of the destination's three nodes down as both services start (a zone lost, a rolling restart gone wrong).

    The node left answers metadata from its own image, so each service finds the cluster reachable; but no
    topic can be made until a quorum of controllers is back. Such a step after the first answer used to be
    one try: a timeout there exited the process (a CI chaos run: a deduper restarted while a destination broker
    was down). Both services now wait it out within ``startup_timeout_s`` and replicate once the nodes are back.
    """
    topic = unique_name("noquorum")
    create_topic(source_cluster.bootstrap_servers, topic, PARTITIONS)
    produce_sequences(source_cluster.bootstrap_servers, topic, PARTITIONS, per_partition=200)
    left, *down = destination3.node_ids
    for node in down:
        destination3.kill(node)
    try:
        with running_flow(source_cluster, destination3, tmp_path, flow=unique_name("flow"), topics=[topic]) as flow:
            for proc in (flow.wrapper, flow.deduper):
                # A step after the first answer failed and is repeated (a process that gave up fails this wait).
                proc.wait_for_log("; trying again in", 120)
            _check_alive(flow, f"with only node {left} of the destination up")
            assert "ready (now own" not in flow.deduper.output()
            for node in down:
                destination3.restart(node)
            down = []  # all back: nothing left for the finally to restart
            _wait_started(flow)
            src = read_all(source_cluster.bootstrap_servers, topic)
            assert_exact_copy(
                src, read_all(destination3.bootstrap_servers, f"src.{topic}", expected=PARTITIONS * 200, timeout_s=120)
            )
            assert flow.wrapper.starts == flow.deduper.starts == 1
            assert flow.wrapper.terminate() == 0
            assert flow.deduper.terminate() == 0
    finally:
        for node in down:  # the module's other tests need all three
            destination3.restart(node)


def test_an_admin_request_follows_a_lost_controller(
    destination3: MultiNodeCluster, unique_name: Callable[[str], str]
) -> None:
    """librdkafka sends DescribeTopics (and CreateTopics, DescribeConfigs...) to the node its metadata last named
    controller, and waits for that node: with it killed, until it was back or the request timed out. A
    deduper's restore waited 29 s so, with the flow stopped (`ferryman.controller`). A request left waiting
    now refreshes the client's metadata, and the live broker it then names answers."""
    dst = destination3.bootstrap_servers
    topic = unique_name("ctl")
    create_topic(dst, topic, 1)
    admin = AdminClient({"bootstrap.servers": dst})
    node = admin.list_topics(timeout=30).controller_id  # the node the admin sends its requests to
    assert topic in describe_topics(admin, [topic], 30)
    destination3.kill(node)
    try:
        time.sleep(1)  # the admin has seen its connection to the node close
        began = time.monotonic()
        found = describe_topics(admin, [topic], 30)
        took = time.monotonic() - began
        _log.info("described %s in %.1f s with node %d (the admin's controller) down", topic, took, node)
        assert topic in found
        assert took < 10, f"the describe waited {took:.1f} s for the lost node {node}"
    finally:
        destination3.restart(node)
