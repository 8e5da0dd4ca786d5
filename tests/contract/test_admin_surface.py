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
from ferryman.v1 import control_pb2

ROOT = Path(__file__).resolve().parents[2]
_OPERATOR_SERVICES = ("WrapperService", "DeduperService")


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
    """A command module calls the client method, directly or through service_status (which calls both status reads)."""
    commands = {c.name for c in typer.main.get_command(app).commands.values()}  # type: ignore[attr-defined]
    assert {"status", "lag", "offsets"} <= commands
    cli_sources = "".join(p.read_text() for p in (ROOT / "clients/ferryman/cli").glob("*.py"))
    client = (ROOT / "clients/ferryman/admin.py").read_text()
    through_status = (
        "service_status" in cli_sources and f"self.{_snake(rpc)}(" in client.split("def service_status", 1)[1]
    )
    assert f".{_snake(rpc)}(" in cli_sources or through_status, f"no ferryman command calls {_snake(rpc)}()"
