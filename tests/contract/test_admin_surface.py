"""Every operator-facing RPC has a method on the typed admin client and a ``ferryman`` command using it.

ControlService is the wrapper-deduper link, not an operator's API: it is left out on purpose.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer
from ferryman.admin import FerrymanAdmin
from ferryman.cli import app
from ferryman.v1 import audit_pb2, control_pb2
from typer.core import TyperGroup

ROOT = Path(__file__).resolve().parents[2]
_STATUS_SERVICES = ("WrapperService", "DeduperService")


def _snake(name: str) -> str:
    """``StartAudit`` -> ``start_audit``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _status_method(rpc: str) -> str:
    """``GetWrapperStatus`` -> ``wrapper_status`` (a status read is named by what it returns)."""
    return _snake(rpc.removeprefix("Get"))


def _status_rpcs() -> list[str]:
    return [m.name for s in _STATUS_SERVICES for m in control_pb2.DESCRIPTOR.services_by_name[s].methods]


def _audit_rpcs() -> list[str]:
    return [m.name for m in audit_pb2.DESCRIPTOR.services_by_name["AuditService"].methods]


def _commands(group: str | None = None) -> set[str]:
    command = typer.main.get_command(app)
    if group:
        assert isinstance(command, TyperGroup)
        command = command.commands[group]
    assert isinstance(command, TyperGroup)
    return set(command.commands)


@pytest.mark.parametrize("rpc", _status_rpcs())
def test_every_status_rpc_has_a_client_method(rpc: str) -> None:
    method = _status_method(rpc)
    assert callable(getattr(FerrymanAdmin, method, None)), f"FerrymanAdmin has no {method}() for {rpc}"


@pytest.mark.parametrize("rpc", _status_rpcs())
def test_every_status_rpc_is_reached_by_a_cli_command(rpc: str) -> None:
    """A command module calls the client method (directly or through service_status, which calls both)."""
    assert {"status", "lag"} <= _commands()
    source = (ROOT / "clients/ferryman/cli/_status.py").read_text()
    client = (ROOT / "clients/ferryman/admin.py").read_text()
    assert "service_status()" in source
    assert f"self.{_status_method(rpc)}(" in client.split("def service_status", 1)[1]


@pytest.mark.parametrize("rpc", _audit_rpcs())
def test_every_audit_rpc_has_a_client_method_calling_it(rpc: str) -> None:
    method = getattr(FerrymanAdmin, _snake(rpc), None)
    assert callable(method), f"FerrymanAdmin has no {_snake(rpc)}() for {rpc}"
    client = (ROOT / "clients/ferryman/admin.py").read_text()
    body = client.split(f"def {_snake(rpc)}(", 1)[1].split("\n    def ", 1)[0]
    assert f"self._audit.{rpc}(" in body


@pytest.mark.parametrize("rpc", _audit_rpcs())
def test_every_audit_rpc_is_reached_by_an_audit_command(rpc: str) -> None:
    """``ferryman audit run|list|show --server`` call the client methods (run: start, then follow)."""
    assert {"run", "list", "show"} <= _commands("audit")
    source = (ROOT / "clients/ferryman/cli/_audit_remote.py").read_text()
    assert f".{_snake(rpc)}(" in source
