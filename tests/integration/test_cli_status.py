"""``ferryman status`` and ``ferryman lag`` run as a user runs them, against real gRPC servers on loopback.

The servers are the services' own status servicers over canned snapshots (what a status shows of a live
pair is covered by test_deduper_discovery); the CLI runs as a subprocess, its output parsed as a script would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from ferryman.admin import FerrymanAdmin, ServiceUnavailableError, WrongServiceError
from ferryman.config import RpcConfig, SecretStr
from ferryman.rpc import RpcServer, build_server, default_server_interceptors
from ferryman.v1 import control_pb2, control_pb2_grpc
from ferryman_deduper._control import DeduperStatusServicer
from ferryman_local import reserve_port
from ferryman_wrapper._status import WrapperStatusServicer

from tests.helpers.grpc_clients import DEDUPER_SERVICE, WRAPPER_SERVICE, local

pytestmark = pytest.mark.integration

FERRYMAN = Path(sys.executable).parent / "ferryman"
TOKEN = "cli-test-token"

DEDUPER = control_pb2.GetDeduperStatusResponse(
    deduper_id="d-7",
    flow="orders",
    records_written=1234,
    duplicates_dropped=5,
    partitions=[
        control_pb2.PartitionWatermark(
            topic="orders", partition=0, watermark=99, lag=3, log_end_offset=103, lag_seconds=1.5, duplicates_dropped=5
        ),
        control_pb2.PartitionWatermark(
            topic="orders", partition=1, watermark=-1, lag=-1, log_end_offset=-1, lag_seconds=-1
        ),
    ],
    connected_wrappers=["w-1"],
)
WRAPPER = control_pb2.GetWrapperStatusResponse(
    wrapper_id="w-1",
    flow="orders",
    records_sent=1300,
    control_connected=True,
    partitions=[
        control_pb2.PartitionProgress(topic="orders", partition=0, log_end_offset=103, last_wrapped_offset=102)
    ],
    watermarks=[control_pb2.PartitionWatermark(topic="orders", partition=0, watermark=99, lag=3)],
)


@contextmanager
def _server(role: str, rpc: RpcConfig | None = None) -> Iterator[RpcServer]:
    """A started server of role's status service (the service's own servicer), stopped at once on exit."""
    settings = rpc or RpcConfig()
    if role == "deduper":
        name = DEDUPER_SERVICE
        servicer_d = DeduperStatusServicer(lambda: DEDUPER)
        register = [lambda s: control_pb2_grpc.add_DeduperServiceServicer_to_server(servicer_d, s)]
    else:
        name = WRAPPER_SERVICE
        servicer_w = WrapperStatusServicer(lambda: WRAPPER)
        register = [lambda s: control_pb2_grpc.add_WrapperServiceServicer_to_server(servicer_w, s)]
    server = build_server(
        listen_address="127.0.0.1:0",
        rpc=settings,
        register=register,
        service_names=[name],
        interceptors=default_server_interceptors(settings),
    )
    server.start()
    server.set_serving(name, True)
    try:
        yield server
    finally:
        server.stop(0)


def _cli(*args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FERRYMAN_")} | dict(env or {})
    return subprocess.run([str(FERRYMAN), *args], capture_output=True, text=True, timeout=60, env=environ, check=False)


def test_status_of_a_deduper_as_table_json_and_yaml() -> None:
    with _server("deduper") as server:
        address = local(server.port)
        table = _cli("status", "--server", address)
        assert table.returncode == 0, table.stderr
        assert "deduper status" in table.stdout and "d-7" in table.stdout and "1234" in table.stdout
        as_json = _cli("status", "--server", address, "--output", "json")
        assert as_json.returncode == 0, as_json.stderr
        data = json.loads(as_json.stdout)
        assert (data["role"], data["deduper_id"], data["records_written"]) == ("deduper", "d-7", "1234")
        assert data["connected_wrappers"] == ["w-1"]
        as_yaml = _cli("status", "-s", address, "-o", "yaml")
        assert yaml.safe_load(as_yaml.stdout) == data


def test_status_of_a_wrapper_is_found_without_saying_which_service_it_is() -> None:
    with _server("wrapper") as server:
        result = _cli("status", "-o", "json", env={"FERRYMAN_SERVER": local(server.port)})
        assert result.returncode == 0, result.stderr
        data = json.loads(result.stdout)
        assert (data["role"], data["wrapper_id"], data["control_connected"]) == ("wrapper", "w-1", True)


def test_lag_per_partition_from_either_service() -> None:
    with _server("deduper") as deduper, _server("wrapper") as wrapper:
        from_deduper = json.loads(_cli("lag", "-s", local(deduper.port), "-o", "json").stdout)
        assert from_deduper == {
            "role": "deduper",
            "id": "d-7",
            "partitions": [
                {
                    "topic": "orders",
                    "partition": 0,
                    "log_end_offset": 103,
                    "watermark": 99,
                    "lag": 3,
                    "lag_seconds": 1.5,
                    "duplicates_dropped": 5,
                },
                {
                    "topic": "orders",
                    "partition": 1,
                    "log_end_offset": -1,
                    "watermark": -1,
                    "lag": -1,
                    "lag_seconds": -1,
                    "duplicates_dropped": 0,
                },
            ],
        }
        from_wrapper = json.loads(_cli("lag", "-s", local(wrapper.port), "-o", "json").stdout)
        assert from_wrapper["partitions"] == [
            {"topic": "orders", "partition": 0, "log_end_offset": 103, "wrapped": 102, "watermark": 99, "lag": 3}
        ]
        table = _cli("lag", "-s", local(wrapper.port))
        assert table.returncode == 0 and "orders" in table.stdout and "103" in table.stdout


def test_a_server_that_does_not_answer_is_one_line_and_exit_4() -> None:
    result = _cli("status", "--server", local(reserve_port()), "--timeout", "2")
    assert result.returncode == 4
    assert result.stderr.startswith("ferryman: no answer from") and result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_credentials_refused_are_exit_5_and_the_token_comes_from_the_environment() -> None:
    with _server("deduper", RpcConfig(auth_token=SecretStr(TOKEN))) as server:
        address = local(server.port)
        for refused in (_cli("status", "-s", address), _cli("status", "-s", address, "--token", "wrong")):
            assert refused.returncode == 5, refused.stderr
            assert "refused the credentials" in refused.stderr and "UNAUTHENTICATED" in refused.stderr
            assert TOKEN not in refused.stderr + refused.stdout
        accepted = _cli("status", "-s", address, "-o", "json", env={"FERRYMAN_TOKEN": TOKEN})
        assert accepted.returncode == 0, accepted.stderr
        assert json.loads(accepted.stdout)["deduper_id"] == "d-7"


@pytest.mark.parametrize(
    "args",
    [
        ("status", "-s", "127.0.0.1:1", "-o", "xml"),
        ("lag",),  # no server
        ("status", "-s", "127.0.0.1:1", "--timeout", "soon"),
    ],
)
def test_usage_mistakes_are_one_line_and_exit_2(args: tuple[str, ...]) -> None:
    result = _cli(*args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("ferryman: ") and "Traceback" not in result.stderr


def test_the_typed_client_raises_errors_carrying_the_status() -> None:
    with _server("wrapper") as server, FerrymanAdmin(local(server.port)) as admin:
        assert admin.wrapper_status().wrapper_id == "w-1"
        with pytest.raises(WrongServiceError) as wrong:
            admin.deduper_status()
        assert wrong.value.code.name == "UNIMPLEMENTED"
    with FerrymanAdmin(local(reserve_port()), timeout_s=1.0) as admin, pytest.raises(ServiceUnavailableError) as gone:
        admin.wrapper_status()
    assert gone.value.code.name in {"UNAVAILABLE", "DEADLINE_EXCEEDED"}
