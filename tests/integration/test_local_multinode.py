"""The local harness's three-node cluster on real brokers: one quorum, three replicas, a node lost and back."""

from __future__ import annotations

import itertools
import logging
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from ferryman.topics import committed_ranges
from ferryman.topics import create_topic as create_replicated_topic
from ferryman_local import (
    JVM_OPTIONS,
    MultiNodeCluster,
    coordinator_partition,
    ensure_kafka_jars,
    group_coordinator,
    transaction_coordinator,
)

from tests.helpers.kafka import assert_sequences, produce_sequences, read_all, sequence_value, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

_log = logging.getLogger(__name__)

PARTITIONS = 3
# The cluster's transaction.state.log.num.partitions and offsets.topic.num.partitions (SINGLE_NODE_PROPERTIES).
INTERNAL_PARTITIONS = 4
# A commit with the coordinator's node just killed waits for the controller to fence that node
# (broker.session.timeout.ms, 5 s, after a controller failover if the node led the quorum), the
# new leaders' election and the coordinator's load: ~10 s here; the rest is margin for a busy machine.
COMMIT_BUDGET_S = 60.0


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultiNodeCluster]:
    with MultiNodeCluster.start("three", nodes=3, work_dir=tmp_path_factory.mktemp("three")) as cluster:
        yield cluster


def _partitions(bootstrap: str, topic: str) -> list[Any]:
    """The topic's partitions as the metadata names them (id, leader, replicas)."""
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return list(metadata.topics[topic].partitions.values())


def _replicas(bootstrap: str, topic: str) -> dict[int, list[int]]:
    return {p.id: list(p.replicas) for p in _partitions(bootstrap, topic)}


def test_three_nodes_form_one_cluster_with_three_replicas_of_everything(three: MultiNodeCluster) -> None:
    admin = AdminClient({"bootstrap.servers": three.bootstrap_servers})
    described = admin.describe_cluster(request_timeout=10).result(timeout=15)
    assert described.cluster_id == three.cluster_id
    assert sorted(n.id for n in described.nodes) == [1, 2, 3] == three.node_ids == three.running_nodes
    assert len(three.bootstrap_servers.split(",")) == 3
    for node in three.nodes:
        # Each node on ports of its own, serving the same cluster, with a data dir of its own.
        alone = AdminClient({"bootstrap.servers": node.bootstrap_servers})
        assert alone.describe_cluster(request_timeout=10).result(timeout=15).cluster_id == three.cluster_id
        assert (three.node_dir(node.node_id) / "data" / "meta.properties").exists()
    assert len({n.port for n in three.nodes} | {n.controller_port for n in three.nodes}) == 6
    for internal in ("__transaction_state", "__consumer_offsets"):
        replicas = _replicas(three.bootstrap_servers, internal)
        assert len(replicas) == INTERNAL_PARTITIONS
        assert all(sorted(r) == [1, 2, 3] for r in replicas.values()), (internal, replicas)


def _transactions_list(bootstrap: str) -> dict[str, int]:
    """Kafka's own view (TransactionsCommand, Java AdminClient): transactional id -> coordinator node id."""
    out = subprocess.run(
        [
            "java",
            *JVM_OPTIONS,
            "-cp",
            f"{ensure_kafka_jars()}/*",
            "org.apache.kafka.tools.TransactionsCommand",
            "--bootstrap-server",
            bootstrap,
            "list",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    # Columns: TransactionalId, Coordinator, ProducerId, TransactionState (a header line first).
    rows = [line.split() for line in out.splitlines()[1:] if line.strip()]
    return {row[0]: int(row[1]) for row in rows}


def test_the_active_controller_is_the_node_that_last_took_the_quorum(three: MultiNodeCluster) -> None:
    activations = []  # the controller logs its activation at WARN: (time, node)
    for node_id in three.node_ids:
        for line in three.server_log(node_id).read_text(errors="replace").splitlines():
            if "Performing controller activation" in line:
                activations.append((line[1 : line.index("]")], node_id))
    assert activations
    assert three.active_controller() == max(activations)[1]


def test_coordinators_are_named_where_kafka_places_them(three: MultiNodeCluster) -> None:
    # One transactional id and one group per internal partition, so every leader is asked about.
    prefix = uuid.uuid4().hex[:8]
    ids: dict[int, str] = {}
    for n in itertools.count():
        ids.setdefault(coordinator_partition(f"coord-{prefix}-{n}", INTERNAL_PARTITIONS), f"coord-{prefix}-{n}")
        if len(ids) == INTERNAL_PARTITIONS:
            break
    for tid in ids.values():
        Producer({"bootstrap.servers": three.bootstrap_servers, "transactional.id": tid}).init_transactions(30)
    kafka_view = _transactions_list(three.bootstrap_servers)
    ours = {tid: transaction_coordinator(three.bootstrap_servers, tid) for tid in ids.values()}
    assert ours == {tid: kafka_view[tid] for tid in ids.values()}

    offsets_leaders = {
        p.id: p.leader
        for p in AdminClient({"bootstrap.servers": three.bootstrap_servers})
        .list_topics("__consumer_offsets", timeout=10)
        .topics["__consumer_offsets"]
        .partitions.values()
    }
    for group in ids.values():
        consumer = Consumer({"bootstrap.servers": three.bootstrap_servers, "group.id": group})
        try:
            consumer.committed([TopicPartition("any", 0)], timeout=30)  # the group's coordinator loads it
        finally:
            consumer.close()
        expected = offsets_leaders[coordinator_partition(group, INTERNAL_PARTITIONS)]
        assert group_coordinator(three.bootstrap_servers, group) == expected, group


def _leaders(bootstrap: str, topic: str) -> dict[int, int]:
    return {p.id: p.leader for p in _partitions(bootstrap, topic)}


def _read_ranges(
    admin: AdminClient, topic: str, out: list[dict[tuple[str, int], tuple[int, int]] | BaseException]
) -> None:
    try:
        out.append(committed_ranges(admin, {topic: PARTITIONS}, COMMIT_BUDGET_S))
    except BaseException as exc:  # reported by the test
        out.append(exc)


def test_transactions_commit_while_the_coordinators_node_is_down_and_it_rejoins(
    three: MultiNodeCluster, unique_name: Callable[[str], str]
) -> None:
    bootstrap = three.bootstrap_servers
    topic = unique_name("rf3")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    create_replicated_topic(admin, topic, PARTITIONS, {}, 30)  # the broker's default replication factor
    wait_until(lambda: len(_replicas(bootstrap, topic)) == PARTITIONS, 30, message=f"{topic} in metadata")
    assert all(sorted(r) == [1, 2, 3] for r in _replicas(bootstrap, topic).values())
    written = produce_sequences(bootstrap, topic, PARTITIONS, 50, producer_config={"acks": "all"})

    tid = unique_name("txn")
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid})
    producer.init_transactions(30)
    victim = transaction_coordinator(bootstrap, tid)
    led = [p for p, leader in _leaders(bootstrap, topic).items() if leader == victim]
    three.kill(victim)
    assert victim not in three.running_nodes
    # Meanwhile, a client that knew the old leaders reads the committed ranges: librdkafka answers offset -1001
    # with no error for the partitions of a leader that is away, and committed_ranges must ask again rather
    # than read them as empty (the deduper's check of an existing destination topic did).
    ranges: list[dict[tuple[str, int], tuple[int, int]] | BaseException] = []
    reader = threading.Thread(target=_read_ranges, args=(admin, topic, ranges), daemon=True)
    reader.start()

    killed = time.monotonic()
    producer.begin_transaction()
    for p in range(PARTITIONS):
        for i in range(50, 100):
            producer.produce(topic, value=sequence_value(topic, p, i), key=f"{p}:{i}".encode(), partition=p)
            written[p].append(sequence_value(topic, p, i))
    producer.commit_transaction(COMMIT_BUDGET_S)
    _log.info("committed with node %d (the coordinator) down in %.1fs", victim, time.monotonic() - killed)
    assert transaction_coordinator(bootstrap, tid) != victim
    reader.join(COMMIT_BUDGET_S)
    assert len(ranges) == 1 and isinstance(ranges[0], dict), ranges
    # Read while the node was down: the 50 records produced before the kill, in every partition (the ones
    # the node led too), perhaps the transaction's 50 more and their marker.
    assert led and all(low == 0 and high >= 50 for low, high in ranges[0].values()), (led, ranges)

    three.restart(victim)
    assert victim in three.running_nodes
    three.wait_in_sync(60)  # the node rejoined: back in every ISR, its copies up to date
    producer.begin_transaction()
    for p in range(PARTITIONS):
        producer.produce(topic, value=sequence_value(topic, p, 100), key=f"{p}:100".encode(), partition=p)
        written[p].append(sequence_value(topic, p, 100))
    producer.commit_transaction(30)
    # commit_transaction() returns before the markers are written, and right after the rejoin a partition's
    # leadership may be moving back to the restarted node: read until every record is visible, not to the
    # stable offsets of the moment (a CI run once read 100 of 101 values there).
    total = sum(len(values) for values in written.values())
    assert_sequences(read_all(bootstrap, topic, timeout_s=30, expected=total), written)
