"""Configuration loading (file, env overrides, kafka-reo variables), naming policy, topic filter."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException
from ferryman.config import ClusterConfig, NamingConfig, load_config
from ferryman.errors import ConfigError, KafkaOperationError
from ferryman.kafka_errors import ErrorClass, classify, retry_retriable
from ferryman.naming import FlowNames, NamingPolicy, TopicFilter
from ferryman.topics import EXCLUDED_TOPIC_CONFIGS

BASIC = """
clusters:
  a: {bootstrap_servers: "h1:9092"}
  b: {bootstrap_servers: "h2:9092", client_config: {sasl.password: hunter2, security.protocol: SASL_SSL}}
flows:
  - {name: f1, source: a, target: b, topics: ["orders.*"]}
"""


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_yaml_file_with_defaults(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, BASIC), env={})
    flow = cfg.flow(None)
    assert flow.name == "f1"
    assert flow.exactly_once
    assert flow.staging_partitions == 12
    assert cfg.deduper.transaction_interval_ms == 500


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (BASIC.replace("topics:", "topicz:"), "topicz"),
        (BASIC.replace('"orders.*"', '"orders[("'), "invalid topic regex"),
        (BASIC.replace("target: b", "target: zz"), "target cluster 'zz' is not defined"),
        ("- just a list", "mapping at the top level"),
        ("clusters: {a: [", "not valid YAML"),
    ],
)
def test_bad_files_give_clear_errors(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("(", r"\(").replace("*", r"\*")):
        load_config(_write(tmp_path, text), env={})


def test_env_overrides_nested_fields(tmp_path: Path) -> None:
    cfg = load_config(
        _write(tmp_path, BASIC),
        env={"FERRYMAN_DEDUPER__INSTANCE_ID": "d7", "FERRYMAN_CLUSTERS__A__BOOTSTRAP_SERVERS": "other:1"},
    )
    assert cfg.deduper.instance_id == "d7"
    assert cfg.clusters["a"].bootstrap_servers == "other:1"


def test_kafka_reo_variables_are_a_complete_flow() -> None:
    env = {
        "KAFKA_CLUSTERS_SOURCE_BOOTSTRAP_SERVERS": "src:9092",
        "KAFKA_CLUSTERS_SOURCE_TOPIC": "in.events",
        "KAFKA_CLUSTERS_DESTINATION_BOOTSTRAP_SERVERS": "dst:9092",
        "KAFKA_CLUSTERS_DESTINATION_TOPIC": "out-events",
    }
    cfg = load_config(None, env=env)
    flow = cfg.flow(None)
    assert NamingPolicy(flow.source, flow.naming).destination_topic("in.events") == "out-events"
    assert TopicFilter.of(flow).matches("in.events")
    assert not TopicFilter.of(flow).matches("inXevents")  # the name is escaped, not a regex
    assert cfg.clusters[flow.target].bootstrap_servers == "dst:9092"


def test_incomplete_kafka_reo_variables_name_what_is_missing() -> None:
    with pytest.raises(ConfigError, match="KAFKA_CLUSTERS_DESTINATION_TOPIC"):
        load_config(
            None,
            env={
                "KAFKA_CLUSTERS_SOURCE_BOOTSTRAP_SERVERS": "s",
                "KAFKA_CLUSTERS_SOURCE_TOPIC": "t",
                "KAFKA_CLUSTERS_DESTINATION_BOOTSTRAP_SERVERS": "d",
            },
        )
    with pytest.raises(ConfigError, match="no configuration"):
        load_config(None, env={})


def test_secrets_are_masked(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, BASIC), env={})
    assert "hunter2" not in repr(cfg.clusters["b"])
    assert "hunter2" not in repr(ClusterConfig(bootstrap_servers="x", client_config={"ssl.key.password": "hunter2"}))


def test_several_flows_need_a_choice(tmp_path: Path) -> None:
    text = BASIC + "  - {name: f2, source: b, target: a}\n"
    cfg = load_config(_write(tmp_path, text), env={})
    with pytest.raises(ConfigError, match="choose one with --flow"):
        cfg.flow(None)
    assert cfg.flow("f2").source == "b"


def test_naming_policies() -> None:
    assert NamingPolicy("src", NamingConfig()).destination_topic("t") == "src.t"
    assert NamingPolicy("src", NamingConfig(separator="_")).destination_topic("t") == "src_t"
    assert NamingPolicy("src", NamingConfig(policy="identity")).destination_topic("t") == "t"
    assert NamingPolicy("src", NamingConfig(rename={"t": "u"})).destination_topic("t") == "u"


def test_topic_filter_defaults_exclude_internals(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, BASIC.replace('["orders.*"]', '[".*"]')), env={})
    f = TopicFilter.of(cfg.flow(None))
    for excluded in ("__consumer_offsets", "mm2-offsets.a.internal", "x-internal", "orders.replica"):
        assert not f.matches(excluded)
    assert f.matches("orders")
    names = FlowNames.of(cfg.flow(None))
    for t in (names.staging_topic, names.state_topic, names.specs_topic, names.offset_map_topic):
        assert not f.matches(t)


def test_mm2_config_exclusions() -> None:
    def excluded(name: str) -> bool:
        return any(p.fullmatch(name) for p in EXCLUDED_TOPIC_CONFIGS)

    for name in ("min.insync.replicas", "message.timestamp.type", "follower.replication.throttled.replicas"):
        assert excluded(name)
    for name in ("cleanup.policy", "retention.ms", "max.message.bytes"):
        assert not excluded(name)


def test_error_classification() -> None:
    assert classify(KafkaError(KafkaError._FENCED, "x", fatal=True)) is ErrorClass.FENCED
    assert classify(KafkaError(KafkaError.PRODUCER_FENCED, "x")) is ErrorClass.FENCED
    assert classify(KafkaError(KafkaError._FATAL, "x", fatal=True)) is ErrorClass.FATAL
    assert classify(KafkaError(KafkaError._STATE, "x", txn_requires_abort=True)) is ErrorClass.ABORTABLE
    assert classify(KafkaError(KafkaError.ILLEGAL_GENERATION, "x")) is ErrorClass.ABORTABLE
    assert classify(KafkaError(KafkaError.COORDINATOR_NOT_AVAILABLE, "x", retriable=True)) is ErrorClass.RETRIABLE
    assert classify(ValueError("not kafka")) is ErrorClass.FATAL


def test_retry_retriable_within_budget_then_wraps() -> None:
    calls = []

    def flaky() -> int:
        calls.append(1)
        if len(calls) < 3:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "t", retriable=True))
        return 7

    assert retry_retriable(flaky, what="op", budget_s=5) == 7

    def always() -> None:
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "t", retriable=True))

    with pytest.raises(KafkaOperationError, match="op did not succeed"):
        retry_retriable(always, what="op", budget_s=0.2)

    def fatal() -> None:
        raise KafkaException(KafkaError(KafkaError._FENCED, "f", fatal=True))

    with pytest.raises(KafkaException):
        retry_retriable(fatal, what="op", budget_s=5)
