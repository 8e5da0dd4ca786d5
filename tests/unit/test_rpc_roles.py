"""The one rule deciding which role an RPC needs, and the config of named tokens."""

from __future__ import annotations

import pytest
from ferryman.config import ApiToken, FerrymanConfig, SecretStr, load_config
from ferryman.errors import ConfigError
from ferryman.rpc import AuthInterceptor, required_role
from ferryman.rpc._roles import GRANTS
from ferryman.v1 import control_pb2, flows_pb2

SEED = {
    "KAFKA_CLUSTERS_SOURCE_BOOTSTRAP_SERVERS": "s:9092",
    "KAFKA_CLUSTERS_SOURCE_TOPIC": "t",
    "KAFKA_CLUSTERS_DESTINATION_BOOTSTRAP_SERVERS": "d:9092",
    "KAFKA_CLUSTERS_DESTINATION_TOPIC": "t",
}


@pytest.mark.parametrize(
    ("method", "role"),
    [
        ("/ferryman.v1.DeduperService/GetDeduperStatus", "read-only"),
        ("/ferryman.v1.WrapperService/GetWrapperStatus", "read-only"),
        ("/ferryman.v1.DeduperService/TranslateOffsets", "read-only"),
        ("/ferryman.v1.FlowService/ListFlows", "read-only"),
        ("/ferryman.v1.FlowService/WatchFlows", "read-only"),
        ("/ferryman.v1.FlowService/CreateFlow", "admin"),
        ("/ferryman.v1.FlowService/DeleteFlow", "admin"),
        ("/ferryman.v1.FlowService/PauseFlow", "admin"),
        ("/ferryman.v1.AuditService/RunAudit", "admin"),
        ("/ferryman.v1.ControlService/Connect", "peer"),
        ("/ferryman.v1.ControlService/GetAnything", "peer"),  # the link's service, whatever the name
    ],
)
def test_required_role_by_convention(method: str, role: str) -> None:
    assert required_role(method) == role


#: The FlowService RPCs that only read; every other one changes the store and needs admin.
_FLOW_READS = frozenset({"GetFlow", "ListFlows"})


def test_the_real_flow_service_methods_get_admin_for_changes_and_read_only_for_reads() -> None:
    """The rule applied to FlowService as generated from flows.proto, so a renamed or added RPC is seen."""
    service = flows_pb2.DESCRIPTOR.services_by_name["FlowService"]
    roles = {m.name: required_role(f"/{service.full_name}/{m.name}") for m in service.methods}
    assert {"CreateFlow", "UpdateFlow", "DeleteFlow", "PauseFlow", "ResumeFlow"} <= roles.keys()
    assert roles.keys() >= _FLOW_READS
    assert roles == {name: "read-only" if name in _FLOW_READS else "admin" for name in roles}


#: The operator RPCs of control.proto that change something; every other one only reads.
_CONTROL_CHANGES = frozenset({"CommitGroupOffsets"})


def test_the_real_status_and_offset_methods_get_admin_only_where_they_change_something() -> None:
    """Reading a group's offsets or translating them is a read; committing them at the destination is not."""
    roles = {
        m.name: required_role(f"/{service.full_name}/{m.name}")
        for name in ("WrapperService", "DeduperService")
        for service in [control_pb2.DESCRIPTOR.services_by_name[name]]
        for m in service.methods
    }
    assert {"GetGroupOffsets", "TranslateGroupOffsets", "CommitGroupOffsets"} <= roles.keys()
    assert roles == {name: "admin" if name in _CONTROL_CHANGES else "read-only" for name in roles}


def test_admin_includes_read_only_and_peer_is_only_the_link() -> None:
    assert GRANTS["admin"] == {"read-only", "admin"}
    assert GRANTS["read-only"] == {"read-only"}
    assert GRANTS["peer"] == {"peer"}


def test_tokens_from_yaml_and_environment_never_print_their_secret() -> None:
    env = {
        **SEED,
        "FERRYMAN_RPC__TOKENS__OPS__SECRET": "ops-secret-1",
        "FERRYMAN_RPC__TOKENS__OPS__ROLE": "read-only",
        "FERRYMAN_RPC__TOKENS__ROOT__SECRET": "root-secret-2",
        "FERRYMAN_RPC__TOKENS__ROOT__ROLE": "admin",
    }
    config: FerrymanConfig = load_config(None, env)
    assert config.rpc.tokens == {
        "ops": ApiToken(secret=SecretStr("ops-secret-1"), role="read-only"),
        "root": ApiToken(secret=SecretStr("root-secret-2"), role="admin"),
    }
    assert config.rpc.auth_enabled
    shown = f"{config} {config.rpc!r} {config.rpc.tokens}"
    assert "ops-secret-1" not in shown and "root-secret-2" not in shown


def test_unknown_role_is_refused_naming_the_field() -> None:
    env = {
        **SEED,
        "FERRYMAN_RPC__TOKENS__OPS__SECRET": "x",
        "FERRYMAN_RPC__TOKENS__OPS__ROLE": "superuser",
    }
    with pytest.raises(ConfigError, match=r"rpc\.tokens.*role"):
        load_config(None, env)


def test_empty_token_secret_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"rpc\.tokens\.ops\.secret"):
        AuthInterceptor(None, {"ops": ApiToken(secret=SecretStr(""), role="admin")})
