"""Missing ACLs are a clear start-up error naming what to grant, before any record moves (real authorizer).

One single-node cluster for the whole module takes only SASL/PLAIN logins and enforces ACLs with KRaft's
``StandardAuthorizer`` (``LocalCluster.start(..., sasl=...)``). It is both the flow's source and its
destination, so one JVM carries every case. Each user gets wide wildcard grants (every topic, group and
transactional id, and the cluster) minus exactly one permission, taken away with a DENY ACL: the service
run as that user must name the missing permission and exit with the configuration code; with every grant
the same flow replicates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from ferryman.service import EXIT_CONFIG
from ferryman_local import LocalCluster, SaslPlain

from tests.helpers.kafka import assert_sequences, produce_sequences, read_all, wait_until
from tests.helpers.services import ServiceProcess, flow_config, write_config

pytestmark = pytest.mark.integration

_TIMEOUT_S = 30.0
#: Each test's own user: wildcard grants, minus what the test takes away.
_USERS = {name: f"{name}-secret" for name in ("full", "no-txn-id", "no-source-read", "no-create")}


@pytest.fixture(scope="module")
def acl_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster.start(
        "acl", work_dir=tmp_path_factory.mktemp("acl-cluster"), sasl=SaslPlain(_USERS), ready_timeout_s=120
    )
    admin = _admin(cluster)
    # Every topic, group and transactional id; on the cluster only what clients ask of it (CREATE there would
    # allow creating every topic, whatever the topic ACLs say).
    wide = [
        (ResourceType.TOPIC, "*", AclOperation.ALL),
        (ResourceType.GROUP, "*", AclOperation.ALL),
        (ResourceType.TRANSACTIONAL_ID, "*", AclOperation.ALL),
        *(
            (ResourceType.BROKER, "kafka-cluster", op)  # the cluster resource (librdkafka calls it BROKER)
            for op in (AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS, AclOperation.IDEMPOTENT_WRITE)
        ),
    ]
    grants = [
        AclBinding(kind, name, ResourcePatternType.LITERAL, f"User:{user}", "*", op, AclPermissionType.ALLOW)
        for user in _USERS
        for kind, name, op in wide
    ]
    for future in admin.create_acls(grants, request_timeout=_TIMEOUT_S).values():
        future.result(_TIMEOUT_S)
    try:
        yield cluster
    finally:
        cluster.stop()


def _admin(cluster: LocalCluster) -> AdminClient:
    conf: dict[str, str | int | float | bool] = {**cluster.client_config()}
    return AdminClient(conf)


def _deny(cluster: LocalCluster, user: str, kind: ResourceType, name: str, operation: AclOperation) -> None:
    """A DENY ACL wins over every ALLOW: the one permission the user lacks."""
    binding = AclBinding(
        kind, name, ResourcePatternType.LITERAL, f"User:{user}", "*", operation, AclPermissionType.DENY
    )
    admin = _admin(cluster)  # held until the result is in: a collected client cancels its requests
    admin.create_acls([binding], request_timeout=_TIMEOUT_S)[binding].result(_TIMEOUT_S)


def _source_topic(cluster: LocalCluster, name: str, records: int) -> dict[int, list[bytes]]:
    """Create a 2-partition source topic holding records per partition (as the super user); return its values."""
    admin = _admin(cluster)
    admin.create_topics([NewTopic(name, 2, 1)], request_timeout=_TIMEOUT_S)[name].result(_TIMEOUT_S)
    wait_until(lambda: name in admin.list_topics(name, timeout=10).topics, _TIMEOUT_S, message=f"{name} created")
    return produce_sequences(cluster.bootstrap_servers, name, 2, records, producer_config=_login(cluster))


def _config(cluster: LocalCluster, tmp_path: Path, flow: str, topic: str, user: str) -> Path:
    data: dict[str, Any] = flow_config(
        source_bootstrap=cluster.bootstrap_servers,
        destination_bootstrap=cluster.bootstrap_servers,
        flow=flow,
        topics=[topic],
        staging_partitions=2,
    )
    login = {k: v for k, v in cluster.client_config(user).items() if k != "bootstrap.servers"}
    for alias in ("src", "dst"):
        data["clusters"][alias]["client_config"] = login
    return write_config(tmp_path / f"{flow}.yaml", data)


def _nothing_replicated(cluster: LocalCluster, topic: str) -> None:
    dst = read_all(cluster.bootstrap_servers, f"src.{topic}", client_config=_login(cluster))
    assert sum(len(v) for v in dst.values()) == 0, "a record moved although the service refused to start"


def _login(cluster: LocalCluster) -> dict[str, str]:
    return {k: v for k, v in cluster.client_config().items() if k != "bootstrap.servers"}


def test_with_every_grant_the_flow_replicates(
    acl_cluster: LocalCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    topic, flow = unique_name("granted"), unique_name("flow")
    values = _source_topic(acl_cluster, topic, 20)
    cfg = _config(acl_cluster, tmp_path, flow, topic, "full")
    wrapper = ServiceProcess("wrapper", cfg, tmp_path).start()
    deduper = ServiceProcess("deduper", cfg, tmp_path, args=["--instance-id", "d1"]).start()
    try:
        dst = read_all(
            acl_cluster.bootstrap_servers, f"src.{topic}", expected=40, timeout_s=90, client_config=_login(acl_cluster)
        )
        assert_sequences(dst, values)
        assert wrapper.alive and deduper.alive
    finally:
        wrapper.stop()
        deduper.stop()
    assert "not authorized" not in wrapper.output() + deduper.output()


def test_a_deduper_without_write_on_its_transactional_id_names_it_and_exits_2(
    acl_cluster: LocalCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    topic, flow = unique_name("notxn"), unique_name("flow")
    _source_topic(acl_cluster, topic, 5)
    cfg = _config(acl_cluster, tmp_path, flow, topic, "no-txn-id")
    _deny(acl_cluster, "no-txn-id", ResourceType.TRANSACTIONAL_ID, "*", AclOperation.WRITE)
    deduper = ServiceProcess("deduper", cfg, tmp_path, args=["--instance-id", "d1"]).start()
    try:
        assert deduper.wait_exit(90) == EXIT_CONFIG
    finally:
        deduper.stop()
    out = deduper.output()
    # The flow store's writer is the first transactional producer a deduper starts.
    assert "not authorized to write the flow store (transactional id " in out, out[-3000:]
    assert "TRANSACTIONAL_ID_AUTHORIZATION_FAILED" in out
    assert "Grant this client's principal that ACL on the transactional id" in out
    assert "Traceback" not in out
    _nothing_replicated(acl_cluster, topic)


def test_a_deduper_that_may_not_create_its_destination_topic_names_it_and_exits_2(
    acl_cluster: LocalCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    topic, flow = unique_name("nocreate"), unique_name("flow")
    _source_topic(acl_cluster, topic, 5)
    cfg = _config(acl_cluster, tmp_path, flow, topic, "no-create")
    _deny(acl_cluster, "no-create", ResourceType.TOPIC, f"src.{topic}", AclOperation.CREATE)
    wrapper = ServiceProcess("wrapper", cfg, tmp_path).start()
    deduper = ServiceProcess("deduper", cfg, tmp_path, args=["--instance-id", "d1"]).start()
    try:
        assert deduper.wait_exit(90) == EXIT_CONFIG
    finally:
        wrapper.stop()
        deduper.stop()
    out = deduper.output()
    assert f"not authorized to create topic (topic src.{topic})" in out, out[-3000:]
    assert "TOPIC_AUTHORIZATION_FAILED" in out
    assert "Traceback" not in out
    _nothing_replicated(acl_cluster, topic)


def test_a_wrapper_that_may_not_read_its_source_topic_names_it_and_exits_2(
    acl_cluster: LocalCluster, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    topic, flow = unique_name("noread"), unique_name("flow")
    _source_topic(acl_cluster, topic, 5)
    cfg = _config(acl_cluster, tmp_path, flow, topic, "no-source-read")
    _deny(acl_cluster, "no-source-read", ResourceType.TOPIC, topic, AclOperation.READ)
    wrapper = ServiceProcess("wrapper", cfg, tmp_path).start()
    try:
        assert wrapper.wait_exit(90) == EXIT_CONFIG
    finally:
        wrapper.stop()
    out = wrapper.output()
    assert f"not authorized to read flows[{flow}].topics with group " in out, out[-3000:]
    assert f"(topic {topic})" in out
    assert "TOPIC_AUTHORIZATION_FAILED" in out
    assert "Traceback" not in out
    _nothing_replicated(acl_cluster, topic)
