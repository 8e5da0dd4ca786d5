"""Loading the configuration (ferryman.config.load_config): file, env overrides, kafka-reo variables."""

from __future__ import annotations

import itertools
import re
from decimal import Decimal
from pathlib import Path

import ferryman.config as config_module
import pytest
from confluent_kafka import Producer
from ferryman.client_config import base_config
from ferryman.config import (
    SEED_ENV,
    ClusterConfig,
    DeduperConfig,
    FerrymanConfig,
    FlowConfig,
    SecretStr,
    load_config,
    validated,
)
from ferryman.errors import ConfigError, FerrymanError
from ferryman.naming import FlowNames, NamingPolicy, TopicFilter

FULL = """
clusters:
  east:
    bootstrap_servers: "east-1:9092,east-2:9092"
  west:
    bootstrap_servers: "west-1:9093"
    client_config:
      security.protocol: SASL_SSL
      sasl.mechanism: SCRAM-SHA-512
      sasl.username: ferry
      sasl.password: hunter2
flows:
  - name: east-to-west
    source: east
    target: west
    topics: ["orders\\\\..*", "payments"]
    topics_exclude: ["orders\\\\.tmp"]
    naming: {policy: prefix, separator: "_", rename: {payments: pay}}
    exactly_once: true
    staging_partitions: 24
    start_position: latest
    on_topic_recreated: halt
wrapper:
  instance_id: w-1
  envelope_max_records: 250
  commit_interval_ms: 2000
deduper:
  instance_id: d-1
  transaction_interval_ms: 250
rpc:
  auth_token: s3cr3t-token
  tls: {ca_file: /etc/ferryman/ca.pem}
"""

MINIMAL = """
clusters:
  a: {bootstrap_servers: "h1:9092"}
  b: {bootstrap_servers: "h2:9092"}
flows:
  - {name: f1, source: a, target: b}
"""

SEED = {
    "KAFKA_CLUSTERS_SOURCE_BOOTSTRAP_SERVERS": "src-1:9092,src-2:9092",
    "KAFKA_CLUSTERS_SOURCE_TOPIC": "in.events",
    "KAFKA_CLUSTERS_DESTINATION_BOOTSTRAP_SERVERS": "dst-1:9092",
    "KAFKA_CLUSTERS_DESTINATION_TOPIC": "out-events",
}


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ferryman.yaml"
    path.write_text(text)
    return path


def _error(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(_file(tmp_path, text), env=env or {})
    return str(info.value)


# ---------------------------------------------------------------- the file


def test_full_file_is_parsed_into_typed_values(tmp_path: Path) -> None:
    cfg = load_config(_file(tmp_path, FULL), env={})
    assert cfg.clusters["east"].bootstrap_servers == "east-1:9092,east-2:9092"
    assert cfg.clusters["west"].client_config["sasl.mechanism"] == "SCRAM-SHA-512"
    flow = cfg.flow(None)
    assert flow.name == "east-to-west"
    assert (flow.source, flow.target) == ("east", "west")
    assert flow.topics == [r"orders\..*", "payments"]
    assert flow.topics_exclude == [r"orders\.tmp"]
    assert (flow.naming.policy, flow.naming.separator, flow.naming.rename) == ("prefix", "_", {"payments": "pay"})
    assert flow.staging_partitions == 24
    assert flow.start_position == "latest"
    assert flow.on_topic_recreated == "halt"
    assert (cfg.wrapper.instance_id, cfg.wrapper.envelope_max_records, cfg.wrapper.commit_interval_ms) == (
        "w-1",
        250,
        2000,
    )
    assert (cfg.deduper.instance_id, cfg.deduper.transaction_interval_ms) == ("d-1", 250)
    assert cfg.rpc.auth_token is not None and cfg.rpc.auth_token.get_secret_value() == "s3cr3t-token"
    assert cfg.rpc.tls.ca_file == Path("/etc/ferryman/ca.pem")
    assert cfg.rpc.tls.enabled


def test_minimal_file_gets_the_documented_defaults(tmp_path: Path) -> None:
    cfg = load_config(_file(tmp_path, MINIMAL), env={})
    flow = cfg.flow(None)
    assert flow.topics == [".*"]
    assert flow.topics_exclude == [r"__.*", r".*[-.]internal", r".*\.replica"]
    assert flow.naming.policy == "prefix" and flow.naming.separator == "."
    assert flow.exactly_once
    assert flow.staging_partitions == 12
    assert flow.start_position == "earliest"
    assert flow.on_topic_recreated == "reset"
    assert flow.staging_topic is None
    assert cfg.deduper.transaction_interval_ms == 100
    assert cfg.rpc.auth_token is None
    assert not cfg.rpc.tls.enabled


def test_destination_linger_is_librdkafkas_default_with_or_without_transactions() -> None:
    """Records stream to the broker while a transaction is open: the commit's flush waits for one linger only."""
    assert DeduperConfig().linger_ms == 5
    assert DeduperConfig(transaction_interval_ms=250).linger_ms == 5
    assert DeduperConfig(linger_ms=0).linger_ms == 0


def test_configuration_is_frozen(tmp_path: Path) -> None:
    cfg = load_config(_file(tmp_path, MINIMAL), env={})
    with pytest.raises(AttributeError):
        cfg.deduper.instance_id = "other"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        cfg.flows[0].staging_partitions = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("original", "typo", "where"),
    [
        ("flows:", "flowz:", "flowz"),
        ("{name: f1,", "{nmae: f1,", "flows.0.nmae"),
        ('a: {bootstrap_servers: "h1:9092"}', 'a: {bootstrap_server: "h1:9092"}', "clusters.a.bootstrap_server"),
        ("target: b}", "target: b, naming: {polcy: identity}}", "flows.0.naming.polcy"),
    ],
)
def test_unknown_fields_are_rejected_naming_the_field(tmp_path: Path, original: str, typo: str, where: str) -> None:
    message = _error(tmp_path, MINIMAL.replace(original, typo, 1))
    assert re.search(rf"^\s*{re.escape(where)}: unknown field$", message, re.M), message
    assert str(tmp_path / "ferryman.yaml") in message


def test_unknown_field_in_a_service_section_is_rejected(tmp_path: Path) -> None:
    message = _error(tmp_path, MINIMAL + "deduper: {transaction_interval: 100}\n")
    assert "deduper.transaction_interval: unknown field" in message


@pytest.mark.parametrize("field", ["topics", "topics_exclude"])
def test_invalid_regex_is_rejected(tmp_path: Path, field: str) -> None:
    message = _error(tmp_path, MINIMAL.replace("target: b}", f'target: b, {field}: ["ok", "orders[("]}}'))
    assert f"flows.0.{field}" in message
    assert "invalid topic regex 'orders[('" in message


@pytest.mark.parametrize("role", ["source", "target"])
def test_undefined_cluster_alias_is_rejected(tmp_path: Path, role: str) -> None:
    text = MINIMAL.replace(f"{role}: {'a' if role == 'source' else 'b'}", f"{role}: nowhere")
    message = _error(tmp_path, text)
    assert f"{role} cluster 'nowhere' is not defined" in message
    assert "['a', 'b']" in message  # what is defined


def test_duplicate_flow_names_are_rejected(tmp_path: Path) -> None:
    message = _error(tmp_path, MINIMAL + "  - {name: f1, source: b, target: a}\n")
    assert "flow names must be unique" in message


def test_identity_naming_onto_the_same_cluster_is_rejected(tmp_path: Path) -> None:
    message = _error(tmp_path, MINIMAL.replace("target: b}", "target: a, naming: {policy: identity}}"))
    assert "would loop" in message


@pytest.mark.parametrize("name", ["has space", "slash/name", "", "ünï"])
def test_flow_names_must_be_usable_in_topic_and_transactional_ids(tmp_path: Path, name: str) -> None:
    message = _error(tmp_path, MINIMAL.replace("name: f1", f'name: "{name}"'))
    assert "flows.0.name" in message


@pytest.mark.parametrize(
    ("replacement", "where"),
    [
        ("target: b, staging_partitions: 0}", "flows.0.staging_partitions"),
        ("target: b, start_position: middle}", "flows.0.start_position"),
        ("target: b, on_topic_recreated: ignore}", "flows.0.on_topic_recreated"),
    ],
)
def test_out_of_range_values_are_rejected(tmp_path: Path, replacement: str, where: str) -> None:
    assert where in _error(tmp_path, MINIMAL.replace("target: b}", replacement))


def test_malformed_files(tmp_path: Path) -> None:
    assert "mapping at the top level" in _error(tmp_path, "- a list\n")
    assert "not valid YAML" in _error(tmp_path, "clusters: {a: [\n")
    assert "clusters: field required" in _error(tmp_path, "")
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.yaml", env={})


@pytest.mark.parametrize(
    ("addition", "where"),
    [
        ("rpc: {tls: {ca_file: 5}}\n", "rpc.tls.ca_file: Expected `str`, got `int`"),
        ("rpc: {auth_token: [a]}\n", "rpc.auth_token: Expected `str`, got `list`"),
        ("deduper: {linger_ms: -1}\n", "deduper.linger_ms: Expected `int` >= 0"),
        ("wrapper: {compression_type: brotli}\n", "wrapper.compression_type: Invalid enum value 'brotli'"),
        ("deduper: {instance_id: a/b}\n", "deduper.instance_id: instance_id may only contain"),
    ],
)
def test_wrong_types_and_values_name_the_field(tmp_path: Path, addition: str, where: str) -> None:
    assert where in _error(tmp_path, MINIMAL + addition)


def test_a_bad_value_inside_a_mapping_names_the_mapping(tmp_path: Path) -> None:
    # msgspec does not say which key; the cluster alias is named (clusters are checked one by one).
    message = _error(tmp_path, MINIMAL.replace('a: {bootstrap_servers: "h1:9092"}', "a: {client_config: {x: [1]}}"))
    assert "clusters.a.client_config[...]: Expected `bool | int | float | str`, got `array`" in message
    message = _error(tmp_path, MINIMAL.replace('b: {bootstrap_servers: "h2:9092"}', "b: {}"))
    assert "clusters.b.bootstrap_servers: field required" in message
    message = _error(tmp_path, MINIMAL.replace("target: b}", "target: b, naming: {rename: {x: 5}}}"))
    assert "flows.0.naming.rename[...]: Expected `str`, got `int`" in message


def test_client_properties_may_be_numbers_and_booleans_as_librdkafka_takes_them(tmp_path: Path) -> None:
    text = MINIMAL.replace(
        'a: {bootstrap_servers: "h1:9092"}',
        'a: {bootstrap_servers: "h1:9092", client_config: {linger.ms: 5, enable.idempotence: true, client.rack: "7"}}',
    )
    cluster = load_config(_file(tmp_path, text), env={}).clusters["a"]
    assert cluster.client_config == {"linger.ms": 5, "enable.idempotence": True, "client.rack": "7"}
    assert base_config(cluster, "c")["linger.ms"] == 5
    Producer(base_config(cluster, "c"))  # librdkafka accepts them as they are


def test_strings_from_the_file_become_paths_and_secrets(tmp_path: Path) -> None:
    cfg = load_config(_file(tmp_path, FULL), env={})
    assert isinstance(cfg.rpc.tls.ca_file, Path)
    assert isinstance(cfg.rpc.auth_token, SecretStr)
    assert cfg.rpc.auth_token == SecretStr("s3cr3t-token") != SecretStr("other")
    assert "s3cr3t" not in f"{cfg.rpc.auth_token} {cfg.rpc.auth_token!r}"


def test_validated_checks_one_model_and_names_where_it_came_from() -> None:
    flow = validated(FlowConfig, {"name": "f", "source": "a", "target": "b", "staging_partitions": "3"})
    assert flow.staging_partitions == 3  # strings are accepted for numbers, as environment overrides are
    with pytest.raises(ConfigError, match=r"^flows\.7\.staging_partitions: Expected `int` <= 10000$"):
        validated(
            FlowConfig, {"name": "f", "source": "a", "target": "b", "staging_partitions": 10_001}, at=("flows", "7")
        )


def test_config_error_is_a_ferryman_error() -> None:
    assert issubclass(ConfigError, FerrymanError)


# ---------------------------------------------------------------- environment overrides


def test_env_overrides_nested_fields(tmp_path: Path) -> None:
    cfg = load_config(
        _file(tmp_path, MINIMAL),
        env={
            "FERRYMAN_DEDUPER__INSTANCE_ID": "deduper-7",
            "FERRYMAN_WRAPPER__ENVELOPE_MAX_RECORDS": "50",
            "FERRYMAN_CLUSTERS__A__BOOTSTRAP_SERVERS": "other:1",
            "FERRYMAN_RPC__TLS__REQUIRE_CLIENT_CERT": "true",
        },
    )
    assert cfg.deduper.instance_id == "deduper-7"
    assert cfg.wrapper.envelope_max_records == 50
    assert cfg.clusters["a"].bootstrap_servers == "other:1"
    assert cfg.rpc.tls.require_client_cert is True


def test_env_overrides_win_over_the_file(tmp_path: Path) -> None:
    cfg = load_config(_file(tmp_path, FULL), env={"FERRYMAN_DEDUPER__INSTANCE_ID": "from-env"})
    assert cfg.deduper.instance_id == "from-env"
    assert cfg.deduper.transaction_interval_ms == 250  # the rest of the section is kept


def test_unrelated_environment_is_ignored(tmp_path: Path) -> None:
    cfg = load_config(
        _file(tmp_path, MINIMAL),
        env={"FERRYMAN_CONFIG": "/x.yaml", "HOME": "/root", "FERRYMANX__Y": "1", "FERRYMAN_TEST_SOURCE_BOOTSTRAP": "h"},
    )
    assert cfg == load_config(_file(tmp_path, MINIMAL), env={})


def test_env_override_with_a_bad_value_names_the_field(tmp_path: Path) -> None:
    message = _error(tmp_path, MINIMAL, env={"FERRYMAN_WRAPPER__ENVELOPE_MAX_RECORDS": "lots"})
    assert "wrapper.envelope_max_records" in message


def test_env_override_of_an_unknown_field_is_rejected(tmp_path: Path) -> None:
    message = _error(tmp_path, MINIMAL, env={"FERRYMAN_DEDUPER__INSTANCEID": "d"})
    assert "deduper.instanceid: unknown field" in message


def test_env_override_through_a_value_is_rejected(tmp_path: Path) -> None:
    message = _error(tmp_path, MINIMAL, env={"FERRYMAN_CLUSTERS__A__BOOTSTRAP_SERVERS__X": "1"})
    assert "FERRYMAN_CLUSTERS__A__BOOTSTRAP_SERVERS__X" in message
    assert "not a section" in message


def test_env_list_fields_take_comma_separated_values() -> None:
    cfg = load_config(None, env=SEED | {"FERRYMAN_WRAPPER__DEDUPER_ADDRESSES": "a:1, b:2,"})
    assert cfg.wrapper.deduper_addresses == ["a:1", "b:2"]
    assert load_config(None, env=SEED | {"FERRYMAN_WRAPPER__DEDUPER_ADDRESSES": ""}).wrapper.deduper_addresses == []


def test_env_list_fields_take_a_flow_sequence_for_items_with_commas(tmp_path: Path) -> None:
    cfg = load_config(
        _file(tmp_path, MINIMAL),
        env={
            "FERRYMAN_FLOWS__0__TOPICS": '["orders{1,3}", payments]',
            "FERRYMAN_FLOWS__0__TOPICS_EXCLUDE": "[]",
            "FERRYMAN_WRAPPER__DEDUPER_ADDRESSES": '["a:1", "b:2"]',
        },
    )
    assert cfg.flow(None).topics == ["orders{1,3}", "payments"]
    assert cfg.flow(None).topics_exclude == []
    assert cfg.wrapper.deduper_addresses == ["a:1", "b:2"]


def test_env_map_fields_take_a_yaml_or_json_mapping(tmp_path: Path) -> None:
    cfg = load_config(
        _file(tmp_path, FULL),
        env={
            "FERRYMAN_CLUSTERS__EAST__CLIENT_CONFIG": "{security.protocol: SSL, linger.ms: 7}",
            "FERRYMAN_FLOWS__0__NAMING__RENAME": '{"payments": "pay-2", "orders.a": "oa"}',
        },
    )
    assert cfg.clusters["east"].client_config == {"security.protocol": "SSL", "linger.ms": 7}
    assert cfg.flow(None).naming.rename == {"payments": "pay-2", "orders.a": "oa"}
    assert cfg.clusters["west"].client_config["sasl.username"] == "ferry"  # other maps untouched


def test_env_nested_map_keys_and_sections(tmp_path: Path) -> None:
    """Under client_config ``_`` stands for ``.``; a whole map is set before single keys of it."""
    cfg = load_config(
        None,
        env=SEED
        | {
            "FERRYMAN_CLUSTERS__SOURCE__CLIENT_CONFIG": "{security.protocol: SASL_SSL}",
            "FERRYMAN_CLUSTERS__SOURCE__CLIENT_CONFIG__SASL_USERNAME": "ferry",
            "FERRYMAN_CLUSTERS__BACKUP": "{bootstrap_servers: 'b:9092'}",
            "FERRYMAN_RPC__TLS": "{ca_file: /etc/ca.pem}",
            "FERRYMAN_FLOWS__0__NAMING": "{policy: prefix, separator: _}",
        },
    )
    assert cfg.clusters["source"].client_config == {"security.protocol": "SASL_SSL", "sasl.username": "ferry"}
    assert cfg.clusters["backup"].bootstrap_servers == "b:9092"
    assert cfg.rpc.tls.ca_file == Path("/etc/ca.pem")
    assert (cfg.flow(None).naming.policy, cfg.flow(None).naming.separator) == ("prefix", "_")


def test_env_can_add_a_flow_by_index(tmp_path: Path) -> None:
    cfg = load_config(
        _file(tmp_path, MINIMAL),
        env={"FERRYMAN_FLOWS__1": "{name: f2, source: b, target: a, topics: [x]}", "FERRYMAN_FLOWS__1__TOPICS": "y,z"},
    )
    assert [f.name for f in cfg.flows] == ["f1", "f2"]
    assert cfg.flow("f2").topics == ["y", "z"]


def test_env_can_set_every_field_of_the_seed_configuration() -> None:
    """The optional lists, maps and numbers of every section are reachable from the environment alone."""
    cfg = load_config(
        None,
        env=SEED
        | {
            "FERRYMAN_FLOWS__0": "{name: g, source: source, target: destination, topics: [a]}",
            "FERRYMAN_DEDUPER__TRANSACTION_INTERVAL_MS": "200",
            "FERRYMAN_AUDITOR__INTERVAL_S": "5.5",
        },
    )
    assert [f.name for f in cfg.flows] == ["g"]
    assert cfg.deduper.transaction_interval_ms == 200
    assert cfg.auditor.interval_s == 5.5


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("FERRYMAN_WRAPPER__DEDUPER_ADDRESSES", "[a:1, b", "expected a sequence"),
        ("FERRYMAN_WRAPPER__DEDUPER_ADDRESSES", "[{a: 1}", "expected a sequence"),
        ("FERRYMAN_CLUSTERS__A__CLIENT_CONFIG", "security.protocol", "expected a mapping"),
        ("FERRYMAN_CLUSTERS__A__CLIENT_CONFIG", "{a: [1", "expected a mapping"),
        ("FERRYMAN_FLOWS__0", "[name, f]", "expected a mapping"),
        ("FERRYMAN_FLOWS__X__NAME", "f", "is not an index"),
        ("FERRYMAN_FLOWS__5__NAME", "f", "past the end"),
    ],
)
def test_env_values_that_do_not_parse_name_the_variable(
    tmp_path: Path, variable: str, value: str, expected: str
) -> None:
    message = _error(tmp_path, MINIMAL, env={variable: value})
    assert variable in message
    assert expected in message


def test_env_list_items_of_the_wrong_type_name_the_field(tmp_path: Path) -> None:
    message = _error(tmp_path, MINIMAL, env={"FERRYMAN_FLOWS__0__TOPICS": "[[a]]"})
    assert "flows.0.topics" in message


def test_env_scalar_fields_are_never_split(tmp_path: Path) -> None:
    cfg = load_config(_file(tmp_path, MINIMAL), env={"FERRYMAN_CLUSTERS__A__BOOTSTRAP_SERVERS": "h1:1,h2:2"})
    assert cfg.clusters["a"].bootstrap_servers == "h1:1,h2:2"


def test_process_environment_is_read_when_no_env_is_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERRYMAN_DEDUPER__INSTANCE_ID", "from-os-environ")
    assert load_config(_file(tmp_path, MINIMAL)).deduper.instance_id == "from-os-environ"


# ---------------------------------------------------------------- kafka-reo variables


def test_kafka_reo_variables_alone_make_a_complete_flow() -> None:
    cfg = load_config(None, env=SEED)
    flow = cfg.flow(None)
    assert len(cfg.flows) == 1
    assert cfg.clusters[flow.source].bootstrap_servers == "src-1:9092,src-2:9092"
    assert cfg.clusters[flow.target].bootstrap_servers == "dst-1:9092"
    assert NamingPolicy(flow.source, flow.naming).destination_topic("in.events") == "out-events"
    assert flow.exactly_once


def test_kafka_reo_flow_replicates_exactly_the_one_topic() -> None:
    flow = load_config(None, env=SEED).flow(None)
    topics = TopicFilter.of(flow)
    assert topics.matches("in.events")
    for other in ("inXevents", "in.events2", "xin.events", "in", "out-events", "__consumer_offsets"):
        assert not topics.matches(other), other


@pytest.mark.parametrize(
    ("source_topic", "destination_topic"),
    [
        ("same-name", "same-name"),
        ("orders+v1 (legacy)", "orders.v1"),  # regex metacharacters are escaped
        ("audit.internal", "audit-copy"),  # would be excluded by the default exclude list
        ("__audit", "audit"),
        ("events.replica", "events"),
    ],
)
def test_kafka_reo_topic_names_are_taken_literally(source_topic: str, destination_topic: str) -> None:
    env = SEED | {"KAFKA_CLUSTERS_SOURCE_TOPIC": source_topic, "KAFKA_CLUSTERS_DESTINATION_TOPIC": destination_topic}
    flow = load_config(None, env=env).flow(None)
    assert TopicFilter.of(flow).matches(source_topic)
    assert NamingPolicy(flow.source, flow.naming).destination_topic(source_topic) == destination_topic


def test_kafka_reo_optional_variables() -> None:
    env = SEED | {"APPLICATION_NAME": "billing-replicator", "KAFKA_CLUSTERS_DESTINATION_TOPIC_PROXY": "billing.proxy"}
    flow = load_config(None, env=env).flow(None)
    assert flow.name == "billing-replicator"
    assert FlowNames.of(flow).staging_topic == "billing.proxy"


def test_kafka_reo_variables_take_ferryman_overrides() -> None:
    cfg = load_config(None, env=SEED | {"FERRYMAN_DEDUPER__INSTANCE_ID": "d-9"})
    assert cfg.deduper.instance_id == "d-9"


_SUBSETS = [set(subset) for n in range(1, len(SEED_ENV)) for subset in itertools.combinations(SEED_ENV, n)]


@pytest.mark.parametrize("present", _SUBSETS, ids=lambda s: "only-" + "+".join(sorted(s)))
def test_incomplete_kafka_reo_variables_name_everything_missing(present: set[str]) -> None:
    with pytest.raises(ConfigError, match="incomplete") as info:
        load_config(None, env={k: SEED[k] for k in present})
    message = str(info.value)
    for name in SEED_ENV:
        assert (name in message) == (name not in present), name


def test_empty_kafka_reo_variable_counts_as_missing() -> None:
    with pytest.raises(ConfigError, match=r"missing KAFKA_CLUSTERS_DESTINATION_TOPIC$"):
        load_config(None, env=SEED | {"KAFKA_CLUSTERS_DESTINATION_TOPIC": ""})


def test_no_configuration_at_all_says_how_to_give_one() -> None:
    with pytest.raises(ConfigError, match="no configuration") as info:
        load_config(None, env={})
    assert "--config" in str(info.value)
    assert all(name in str(info.value) for name in SEED_ENV)


# ---------------------------------------------------------------- secrets and flow selection


@pytest.mark.parametrize(
    "prop",
    [
        "sasl.password",
        "ssl.key.password",
        "ssl.keystore.password",
        "ssl.key.pem",
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.assertion.private.key.passphrase",
        "sasl.oauthbearer.assertion.private.key.pem",
        "SASL.PASSWORD",
    ],
)
def test_secret_client_properties_are_masked(prop: str) -> None:
    cluster = ClusterConfig(
        bootstrap_servers="h:9092", client_config={prop: "hunter2", "security.protocol": "SASL_SSL"}
    )
    for text in (repr(cluster), str(cluster), f"{cluster}", repr({"c": cluster})):
        assert "hunter2" not in text
        assert prop in text  # the key stays visible, for debugging
        assert "SASL_SSL" in text  # non-secret values are printed
        assert "h:9092" in text


def test_properties_librdkafka_flags_sensitive_are_masked() -> None:
    # librdkafka marks sasl.oauthbearer.config _RK_SENSITIVE (it is handed to the
    # OAuth callback and commonly carries client credentials).
    cluster = ClusterConfig(
        bootstrap_servers="h:9092", client_config={"sasl.oauthbearer.config": "clientSecret=hunter2"}
    )
    assert "hunter2" not in repr(cluster)


def test_secrets_are_masked_in_the_whole_configuration(tmp_path: Path) -> None:
    cfg = load_config(_file(tmp_path, FULL), env={})
    for text in (repr(cfg), str(cfg), repr(cfg.clusters), repr(cfg.rpc)):
        assert "hunter2" not in text
        assert "s3cr3t-token" not in text


def test_a_single_flow_is_chosen_without_a_name(tmp_path: Path) -> None:
    cfg = load_config(_file(tmp_path, MINIMAL), env={})
    assert cfg.flow(None) is cfg.flows[0]
    assert cfg.flow("f1") is cfg.flows[0]


def test_several_flows_need_an_explicit_choice(tmp_path: Path) -> None:
    cfg = load_config(_file(tmp_path, MINIMAL + "  - {name: f2, source: b, target: a}\n"), env={})
    with pytest.raises(ConfigError, match="2 flows; choose one with --flow") as info:
        cfg.flow(None)
    assert "f1" in str(info.value) and "f2" in str(info.value)
    assert cfg.flow("f2").source == "b"
    with pytest.raises(ConfigError, match="no flow named 'f3'"):
        cfg.flow("f3")


def test_no_flows_at_all_is_an_error_when_one_is_needed() -> None:
    cfg = FerrymanConfig(clusters={"a": ClusterConfig(bootstrap_servers="h")}, flows=[])
    with pytest.raises(ConfigError, match="none defined"):
        cfg.flow(None)


def test_the_decode_hook_refuses_types_no_model_field_has() -> None:
    with pytest.raises(TypeError, match="no conversion to Decimal"):
        config_module._decode_hook(Decimal, "1.5")


def test_auditor_section_defaults_and_environment(tmp_path: Path) -> None:
    """The audit scheduler's settings: documented defaults, FERRYMAN_AUDITOR__* overrides, bounds checked."""
    defaults = load_config(_file(tmp_path, MINIMAL), env={}).auditor
    assert (defaults.interval_s, defaults.shutdown_timeout_s) == (300.0, 30.0)
    cfg = load_config(
        _file(tmp_path, MINIMAL),
        env={"FERRYMAN_AUDITOR__INTERVAL_S": "60", "FERRYMAN_AUDITOR__SHUTDOWN_TIMEOUT_S": "0"},
    )
    assert (cfg.auditor.interval_s, cfg.auditor.shutdown_timeout_s) == (60.0, 0.0)
    with pytest.raises(ConfigError, match=r"auditor\.interval_s"):
        load_config(_file(tmp_path, MINIMAL), env={"FERRYMAN_AUDITOR__INTERVAL_S": "0"})
