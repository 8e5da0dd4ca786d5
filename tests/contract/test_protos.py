"""Contract checks: buf lint and breaking, generated-code drift, every RPC implemented."""

from __future__ import annotations

import inspect
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from ferryman.v1 import control_pb2, control_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
BUF = shutil.which("buf", path=str(Path(sys.executable).parent)) or "buf"


def test_buf_lint_is_clean() -> None:
    result = subprocess.run([BUF, "lint"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_buf_breaking_against_main_is_clean() -> None:
    """FILE-level compatibility with the main branch (meaningful on branches and PRs)."""
    has_main = subprocess.run(
        ["git", "rev-parse", "--verify", "-q", "main"], cwd=ROOT, capture_output=True, check=False
    )
    assert has_main.returncode == 0, "the checkout has no main branch to compare against"
    result = subprocess.run(
        [BUF, "breaking", "--against", ".git#branch=main"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _lower_bound(requirement: str) -> tuple[int, ...]:
    found = re.search(r">=\s*([0-9.]+)", requirement)
    assert found, f"{requirement}: no lower bound"
    return tuple(int(p) for p in found.group(1).split("."))


def test_the_declared_runtimes_can_import_the_generated_code() -> None:
    """grpcio and protobuf's lower bounds are at least the versions the generated code refuses to run below."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    bounds = {re.split(r"[<>=!~ \[]", r, maxsplit=1)[0]: r for r in project["dependencies"]}
    generated = ROOT / "clients" / "ferryman" / "v1"
    grpc_versions = {
        re.search(r"GRPC_GENERATED_VERSION = '([0-9.]+)'", p.read_text()).group(1)  # type: ignore[union-attr]
        for p in generated.glob("*_pb2_grpc.py")
    }
    pb_versions = {
        re.search(r"# Protobuf Python Version: ([0-9.]+)", p.read_text()).group(1)  # type: ignore[union-attr]
        for p in generated.glob("*_pb2.py")
    }
    for name, versions in (("grpcio", grpc_versions), ("protobuf", pb_versions)):
        needed = max(tuple(int(x) for x in v.split(".")) for v in versions)
        assert _lower_bound(bounds[name]) >= needed, f"{bounds[name]}: the generated code needs {needed}"


def test_generated_code_matches_protos() -> None:
    result = subprocess.run(
        [sys.executable, "scripts/gen_protos.py", "--check"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _rpc_names(service: str) -> set[str]:
    desc = control_pb2.DESCRIPTOR.services_by_name[service]
    return {m.name for m in desc.methods}


@pytest.mark.parametrize(
    ("service", "servicer_path"),
    [
        ("ControlService", "ferryman_deduper._control:ControlServicer"),
        ("DeduperService", "ferryman_deduper._control:DeduperStatusServicer"),
        ("WrapperService", "ferryman_wrapper._status:WrapperStatusServicer"),
    ],
)
def test_every_rpc_is_implemented(service: str, servicer_path: str) -> None:
    """temporalio's test_all_grpc_calls_present idea: no RPC falls through to UNIMPLEMENTED."""
    module_name, cls_name = servicer_path.split(":")
    module = __import__(module_name, fromlist=[cls_name])
    servicer = getattr(module, cls_name)
    base = getattr(control_pb2_grpc, f"{service}Servicer")
    missing = {name for name in _rpc_names(service) if getattr(servicer, name, None) is getattr(base, name, None)}
    assert not missing, f"{cls_name} does not implement {sorted(missing)}"
    for name in _rpc_names(service):
        assert inspect.isfunction(getattr(servicer, name))
