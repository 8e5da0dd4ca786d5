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
from ferryman.v1 import control_pb2, flows_pb2

ROOT = Path(__file__).resolve().parents[2]
_OPERATOR_SERVICES = ("WrapperService", "DeduperService")  # FlowService: below


def _snake(name: str) -> str:
    """``GetWrapperStatus`` -> ``wrapper_status`` (the ``Get`` of a read is dropped, as the client does)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name.removeprefix("Get")).lower()


def _operator_rpcs() -> list[str]:
    return [m.name for s in _OPERATOR_SERVICES for m in control_pb2.DESCRIPTOR.services_by_name[s].methods]


@pytest.mark.parametrize("rpc", _operator_rpcs())
def test_every_operator_rpc_has_a_client_method(rpc: str) -> None:
    assert callable(getattr(FerrymanAdmin, _snake(rpc), None)), f"FerrymanAdmin has no {_snake(rpc)}() for {rpc}"


@pytest.mark.parametrize("rpc", _operator_rpcs())
def test_every_operator_rpc_is_reached_by_a_cli_command(rpc: str) -> None:
    """A command module calls the client method (directly or through service_status, which calls both)."""
    commands = {c.name for c in typer.main.get_command(app).commands.values()}  # type: ignore[attr-defined]
    assert {"status", "lag"} <= commands
    source = (ROOT / "clients/ferryman/cli/_status.py").read_text()
    client = (ROOT / "clients/ferryman/admin.py").read_text()
    assert "service_status()" in source
    assert f"self.{_snake(rpc)}(" in client.split("def service_status", 1)[1]


def _flow_rpcs() -> list[str]:
    return [m.name for m in flows_pb2.DESCRIPTOR.services_by_name["FlowService"].methods]


def _plain_snake(name: str) -> str:
    """``GetFlow`` -> ``get_flow``: FlowService methods keep their verb."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


@pytest.mark.parametrize("rpc", _flow_rpcs())
def test_every_flow_rpc_has_a_client_method(rpc: str) -> None:
    method = _plain_snake(rpc)
    assert callable(getattr(FerrymanAdmin, method, None)), f"FerrymanAdmin has no {method}() for {rpc}"


@pytest.mark.parametrize("rpc", _flow_rpcs())
def test_every_flow_rpc_is_reached_by_a_flows_command(rpc: str) -> None:
    """``ferryman flows <verb>`` exists and its module calls the client method (ListFlows: ``list``)."""
    flows_group = typer.main.get_command(app).commands["flows"]  # type: ignore[attr-defined]
    verb = _plain_snake(rpc).split("_")[0]
    assert verb in flows_group.commands, f"no `ferryman flows {verb}` for {rpc}"
    source = (ROOT / "clients/ferryman/cli/_flows.py").read_text()
    assert f".{_plain_snake(rpc)}(" in source, f"clients/ferryman/cli/_flows.py never calls {_plain_snake(rpc)}()"


def test_flows_apply_is_a_command() -> None:
    flows_group = typer.main.get_command(app).commands["flows"]  # type: ignore[attr-defined]
    assert "apply" in flows_group.commands
