"""``ferryman trace`` against a real destination cluster, run as a user runs it."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Producer

from tests.helpers.kafka import KafkaCluster, create_topic
from tests.helpers.services import BIN, flow_config, write_config

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _trace(config: Path, topic: str, offset: int, timeout_s: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(BIN / "ferryman"),
            "trace",
            topic,
            "0",
            str(offset),
            "--config",
            str(config),
            "--timeout",
            f"{timeout_s:g}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_trace_prints_the_trace_of_a_record_or_says_it_has_none(
    source_cluster: KafkaCluster, destination_cluster: KafkaCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    topic = unique_name("dest")
    create_topic(destination_cluster.bootstrap_servers, topic, 1)
    producer = Producer({"bootstrap.servers": destination_cluster.bootstrap_servers})
    producer.produce(topic, value=b"plain", partition=0)
    producer.produce(topic, value=b"traced", partition=0, headers=[("a", b"1"), ("traceparent", TP.encode())])
    producer.flush(30)
    data = flow_config(
        source_bootstrap=source_cluster.bootstrap_servers,
        destination_bootstrap=destination_cluster.bootstrap_servers,
        flow=unique_name("flow"),
        topics=[topic],
    )
    data["tracing"] = {"ui_url_template": "http://zipkin.example:9411/zipkin/traces/{trace_id}"}
    config = write_config(tmp_path / "c.yaml", data)
    traced = _trace(config, topic, 1)
    assert traced.returncode == 0, traced.stderr
    assert "0af7651916cd43dd8448eb211c80319c" in traced.stdout
    assert "http://zipkin.example:9411/zipkin/traces/0af7651916cd43dd8448eb211c80319c" in traced.stdout
    plain = _trace(config, topic, 0)
    assert plain.returncode == 1
    assert "has no traceparent header" in plain.stderr and plain.stdout == ""
    missing = _trace(config, topic, 5, timeout_s=3)  # past the end: nothing comes
    assert missing.returncode == 3 and "cannot read" in missing.stderr
