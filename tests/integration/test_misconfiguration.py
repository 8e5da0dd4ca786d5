"""Misconfiguration is a clear start-up error naming the setting, before any record moves (real brokers)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from ferryman.config import load_config
from ferryman.naming import FlowNames
from ferryman.service import EXIT_CONFIG, EXIT_FAILURE
from ferryman.topics import describe_topics

from tests.helpers.kafka import KafkaCluster, create_topic, produce_sequences, read_all
from tests.helpers.services import ServiceProcess, running_flow, write_flow_config

pytestmark = pytest.mark.integration

_TIMEOUT_S = 30.0
#: The local brokers' transaction.max.timeout.ms is Kafka's default, 15 minutes.
_ABOVE_BROKER_MAX_MS = 900_001


def _admin(cluster: KafkaCluster) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.bootstrap_servers})


def test_a_transaction_timeout_above_the_brokers_maximum_names_the_setting_and_exits_2(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    cfg = write_flow_config(
        source_cluster,
        destination_cluster,
        tmp_path,
        flow=unique_name("flow"),
        topics=["nothing"],
        deduper={"transaction_timeout_ms": _ABOVE_BROKER_MAX_MS},
    )
    names = FlowNames.of(load_config(cfg).flows[0])
    deduper = ServiceProcess("deduper", cfg, tmp_path, args=["--instance-id", "d1"]).start()
    assert deduper.wait_exit(60) == EXIT_CONFIG
    out = deduper.output()
    assert f"deduper.transaction_timeout_ms is {_ABOVE_BROKER_MAX_MS} ms" in out
    assert "transaction.max.timeout.ms (900000 ms)" in out
    assert "Traceback" not in out
    # Before anything: not even the internal topics were created.
    assert describe_topics(_admin(destination_cluster), [names.staging_topic, names.dlq_topic], _TIMEOUT_S) == {}


@pytest.mark.parametrize("kind", ["wrapper", "deduper"])
def test_a_staging_topic_with_another_partition_count_names_the_setting(
    source_cluster: KafkaCluster,
    destination_cluster: KafkaCluster,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    kind: str,
) -> None:
    flow = unique_name("flow")
    cfg = write_flow_config(
        source_cluster, destination_cluster, tmp_path, flow=flow, topics=["nothing"], staging_partitions=4
    )
    names = FlowNames.of(load_config(cfg).flows[0])
    create_topic(destination_cluster.bootstrap_servers, names.staging_topic, 3, {"cleanup.policy": "delete"})
    args = ["--instance-id", "d1"] if kind == "deduper" else []
    service = ServiceProcess(kind, cfg, tmp_path, args=args).start()
    assert service.wait_exit(60) == EXIT_FAILURE
    out = service.output()
    assert (
        f"staging topic {names.staging_topic} has 3 partitions but the flow is configured for 4 "
        f"(flows[{flow}].staging_partitions)" in out
    )
    assert "Traceback" not in out


def test_a_destination_topic_with_fewer_partitions_than_the_source_is_refused_before_any_record(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    topic = unique_name("narrow")
    dst_topic = f"src.{topic}"
    create_topic(source_cluster.bootstrap_servers, topic, 4)
    create_topic(destination_cluster.bootstrap_servers, dst_topic, 2)
    produce_sequences(source_cluster.bootstrap_servers, topic, 4, 20)
    with running_flow(source_cluster, destination_cluster, tmp_path, flow=unique_name("flow"), topics=[topic]) as f:
        assert f.deduper.wait_exit(90) == EXIT_CONFIG
        out = f.deduper.output()
        assert f"destination topic {dst_topic} has 2 partitions, fewer than the 4 of source topic {topic}" in out
        assert "flows[].naming" in out
        assert "Traceback" not in out
    assert describe_topics(_admin(destination_cluster), [dst_topic], _TIMEOUT_S)[dst_topic].partitions == 2
    assert read_all(destination_cluster.bootstrap_servers, dst_topic) == {0: [], 1: []}


def test_a_destination_topic_written_by_someone_else_is_refused_before_any_record(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    topic = unique_name("taken")
    dst_topic = f"src.{topic}"
    create_topic(source_cluster.bootstrap_servers, topic, 2)
    create_topic(destination_cluster.bootstrap_servers, dst_topic, 2)
    theirs = produce_sequences(destination_cluster.bootstrap_servers, dst_topic, [0], 3)
    produce_sequences(source_cluster.bootstrap_servers, topic, 2, 20)
    with running_flow(source_cluster, destination_cluster, tmp_path, flow=unique_name("flow"), topics=[topic]) as f:
        assert f.deduper.wait_exit(90) == EXIT_CONFIG
        out = f.deduper.output()
        assert f"destination topic {dst_topic} partition 0 already holds records (offsets 0..2)" in out
        assert "Traceback" not in out
    # Theirs untouched, nothing of ours committed.
    assert [r.value for r in read_all(destination_cluster.bootstrap_servers, dst_topic)[0]] == theirs[0]
    assert sum(len(r) for r in read_all(destination_cluster.bootstrap_servers, dst_topic).values()) == 3
