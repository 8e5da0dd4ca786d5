"""Every operator-facing RPC has a method on the typed admin client and a ``ferryman`` command using it.

Operator-facing: every service of every ``ferryman.v1`` proto file except ControlService, the
wrapper-deduper link (left out on purpose). A service added to a proto file is covered at once.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer
from ferryman.admin import FerrymanAdmin
from ferryman.cli import app
from ferryman.v1 import audit_pb2, control_pb2, envelope_pb2, flows_pb2, state_pb2

ROOT = Path(__file__).resolve().parents[2]
_FILES = (audit_pb2, control_pb2, envelope_pb2, flows_pb2, state_pb2)
_NOT_OPERATOR = frozenset({"ControlService"})
#: Services whose client methods keep the RPC's verb (``GetFlow`` -> ``get_flow``); the status reads drop ``Get``.
_VERB_KEPT = frozenset({"FlowService", "AuditService"})


def _operator_rpcs() -> list[tuple[str, str]]:
    return [
        (service.name, method.name)
        for module in _FILES
        for service in module.DESCRIPTOR.services_by_name.values()
        if service.name not in _NOT_OPERATOR
        for method in service.methods
    ]


def _method(service: str, rpc: str) -> str:
    """The client method of an RPC: ``GetWrapperStatus`` -> ``wrapper_status``, ``GetFlow`` -> ``get_flow``."""
    name = rpc if service in _VERB_KEPT else rpc.removeprefix("Get")
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def test_the_operator_services_are_all_seen() -> None:
    assert {s for s, _ in _operator_rpcs()} == {"WrapperService", "DeduperService", "FlowService", "AuditService"}
    assert ("DeduperService", "TranslateOffsets") in _operator_rpcs()


@pytest.mark.parametrize(("service", "rpc"), _operator_rpcs())
def test_every_operator_rpc_has_a_client_method(service: str, rpc: str) -> None:
    method = _method(service, rpc)
    assert callable(getattr(FerrymanAdmin, method, None)), f"FerrymanAdmin has no {method}() for {service}.{rpc}"


@pytest.mark.parametrize(("service", "rpc"), _operator_rpcs())
def test_every_operator_rpc_is_reached_by_a_cli_command(service: str, rpc: str) -> None:
    """A command module calls the client method, directly or through service_status (which calls both status reads)."""
    commands = {c.name for c in typer.main.get_command(app).commands.values()}  # type: ignore[attr-defined]
    assert {"status", "lag", "offsets", "flows", "audit"} <= commands
    cli_sources = "".join(p.read_text() for p in (ROOT / "clients/ferryman/cli").glob("*.py"))
    client = (ROOT / "clients/ferryman/admin.py").read_text()
    method = _method(service, rpc)
    through_status = (
        "service_status" in cli_sources
        and f"self.{method}(" in client.split("def service_status", 1)[1].split("\n    def ", 1)[0]
    )
    assert f".{method}(" in cli_sources or through_status, f"no ferryman command calls {method}()"


@pytest.mark.parametrize("rpc", [r for s, r in _operator_rpcs() if s == "FlowService"])
def test_every_flow_rpc_has_its_flows_verb(rpc: str) -> None:
    """``ferryman flows <verb>`` exists (ListFlows: ``list``) and its module calls the client method."""
    flows_group = typer.main.get_command(app).commands["flows"]  # type: ignore[attr-defined]
    method = _method("FlowService", rpc)
    assert method.split("_")[0] in flows_group.commands, f"no `ferryman flows {method.split('_')[0]}` for {rpc}"
    source = (ROOT / "clients/ferryman/cli/_flows.py").read_text()
    assert f".{method}(" in source, f"clients/ferryman/cli/_flows.py never calls {method}()"


def test_flows_apply_is_a_command() -> None:
    flows_group = typer.main.get_command(app).commands["flows"]  # type: ignore[attr-defined]
    assert "apply" in flows_group.commands


@pytest.mark.parametrize(
    "command",
    [
        "status",
        "lag",
        "offsets translate",
        *(f"flows {v}" for v in ("list", "get", "create", "update", "delete", "pause", "resume", "apply")),
    ],
)
def test_every_server_command_takes_the_same_connection_options(command: str) -> None:
    """--server, --token, the TLS files, --server-name, --timeout and --output, wherever a command calls a service."""
    cmd = typer.main.get_command(app)
    for word in command.split():
        cmd = cmd.commands[word]  # type: ignore[attr-defined]
    flags = {o for p in cmd.params for o in p.opts}
    wanted = {"--server", "--token", "--ca-file", "--cert-file", "--key-file", "--server-name", "--timeout", "--output"}
    assert wanted <= flags, f"ferryman {command} lacks {sorted(wanted - flags)}"


@pytest.mark.parametrize("rpc", [r for s, r in _operator_rpcs() if s == "AuditService"])
def test_every_audit_rpc_is_reached_by_an_audit_command(rpc: str) -> None:
    """``ferryman audit run|list|show --server`` call the client methods (run: start, then follow)."""
    audit_group = typer.main.get_command(app).commands["audit"]  # type: ignore[attr-defined]
    assert {"run", "list", "show"} <= set(audit_group.commands)
    source = (ROOT / "clients/ferryman/cli/_audit_remote.py").read_text()
    assert f".{_method('AuditService', rpc)}(" in source
