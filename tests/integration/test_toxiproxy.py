"""toxiproxy in front of a broker's PROXIED listener: every request of a client goes through it.

A client that bootstraps at the proxy learns the proxy's address from metadata (the broker advertises
it), so a cut stops all its traffic, while a client on the direct listener goes on unhindered.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from ferryman_local import MultiNodeCluster, Toxiproxy
from ferryman_local._multinode import _MultiNodeState

from tests.helpers.kafka import create_topic, produce_sequences, read_all


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MultiNodeCluster, Toxiproxy]]:
    work = tmp_path_factory.mktemp("proxied")
    with (
        MultiNodeCluster.start("proxied", nodes=1, work_dir=work / "cluster", proxied=True) as cluster,
        Toxiproxy.start(work / "toxiproxy") as toxiproxy,
    ):
        for node in cluster.nodes:
            assert node.proxied is not None
            toxiproxy.create_proxy(
                f"node-{node.node_id}", f"127.0.0.1:{node.proxied.port}", listen_port=node.proxied.advertised_port
            )
        yield cluster, toxiproxy


def test_metadata_through_the_proxy_names_the_proxy(proxied: tuple[MultiNodeCluster, Toxiproxy]) -> None:
    cluster, toxiproxy = proxied
    direct = AdminClient({"bootstrap.servers": cluster.bootstrap_servers}).list_topics(timeout=10)
    via = AdminClient({"bootstrap.servers": cluster.proxied_bootstrap_servers}).list_topics(timeout=10)
    node = cluster.nodes[0]
    assert node.proxied is not None
    assert {b.port for b in direct.brokers.values()} == {node.port}
    assert {b.port for b in via.brokers.values()} == {node.proxied.advertised_port}
    assert set(toxiproxy.proxies) == {"node-1"}


def test_a_cut_stops_proxied_clients_only_and_heals(proxied: tuple[MultiNodeCluster, Toxiproxy]) -> None:
    cluster, toxiproxy = proxied
    topic = f"cut-{time.monotonic_ns()}"
    create_topic(cluster.bootstrap_servers, topic, 1)
    toxiproxy.cut("node-1")
    try:
        with pytest.raises(KafkaException):
            AdminClient({"bootstrap.servers": cluster.proxied_bootstrap_servers}).list_topics(timeout=3)
        produce_sequences(cluster.bootstrap_servers, topic, 1, 10)  # the direct path is untouched
    finally:
        toxiproxy.heal("node-1")
    produce_sequences(cluster.proxied_bootstrap_servers, topic, 1, 10, start=10)
    assert len(read_all(cluster.bootstrap_servers, topic)[0]) == 20


def test_latency_is_added_to_each_round_trip(proxied: tuple[MultiNodeCluster, Toxiproxy]) -> None:
    cluster, toxiproxy = proxied
    admin = AdminClient({"bootstrap.servers": cluster.proxied_bootstrap_servers})
    admin.list_topics(timeout=10)  # connected
    toxiproxy.delay("node-1", 300)
    try:
        started = time.monotonic()
        admin.list_topics(timeout=10)
        assert time.monotonic() - started >= 0.5  # 300 ms each way
    finally:
        toxiproxy.reset()


def test_state_files_from_before_the_proxied_listener_still_load(tmp_path: Path) -> None:
    old = {
        "name": "old",
        "cluster_id": "abcdefghijklmnopqrstuv",
        "kafka_version": "4.1.1",
        "nodes": [{"node_id": 1, "port": 1, "controller_port": 2, "directory_id": "x"}],
    }
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(old))
    state = _MultiNodeState.load(path)
    assert state.nodes[0].proxied is None
    state.save(path)
    assert _MultiNodeState.load(path) == state
