"""The CLI's connection options and failure wording, without a network: addresses, TLS flags, exit statuses."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from ferryman.admin import (
    _BY_CODE,
    AdminError,
    AuthenticationError,
    PermissionDeniedError,
    RequestRejectedError,
    ResourceNotFoundError,
    ServiceUnavailableError,
    TlsHandshakeError,
)
from ferryman.cli._connection import check_address, connect, describe
from ferryman.config import RpcConfig
from ferryman.errors import ConfigError
from ferryman.state import offset_mapping
from ferryman.v1 import envelope_pb2
from ferryman_deduper._translate import _match


@pytest.mark.parametrize("address", ["127.0.0.1:7460", "deduper-1:7460", "[::1]:7460", "unix:/run/ferryman.sock"])
def test_addresses_accepted(address: str) -> None:
    check_address(address)


@pytest.mark.parametrize("address", ["deduper-1", "deduper-1:", "h:0", "h:70000", "h:port", ":7460", "a b:1"])
def test_addresses_refused_naming_the_option(address: str) -> None:
    with pytest.raises(ConfigError, match="--server must be host:port"):
        check_address(address)


def test_tls_flags_must_be_consistent(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    common = {"token": None, "server_name": None, "timeout_s": 1.0}
    with pytest.raises(ConfigError, match="--cert-file and --key-file go together"):
        connect("h:1", ca_file=ca, cert_file=ca, key_file=None, **common)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="need --ca-file"):
        connect("h:1", ca_file=None, cert_file=ca, key_file=ca, **common)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="--ca-file: no such file"):
        connect("h:1", ca_file=tmp_path / "missing.pem", cert_file=None, key_file=None, **common)  # type: ignore[arg-type]
    connection = connect(
        "h:1", ca_file=ca, cert_file=None, key_file=None, token="tok-secret-9", server_name="n", timeout_s=2.0
    )
    assert connection.rpc.tls.server_name_override == "n" and connection.rpc.auth_token is not None
    assert "tok-secret-9" not in repr(connection.rpc)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (TlsHandshakeError("handshake failed", grpc.StatusCode.UNAVAILABLE), 8),
        (ServiceUnavailableError("Socket closed", grpc.StatusCode.UNAVAILABLE), 4),
        (AuthenticationError("no", grpc.StatusCode.UNAUTHENTICATED), 5),
        (PermissionDeniedError("no", grpc.StatusCode.PERMISSION_DENIED), 6),
        (ResourceNotFoundError("no", grpc.StatusCode.NOT_FOUND), 7),
        (RequestRejectedError("no", grpc.StatusCode.INVALID_ARGUMENT), 9),
    ],
)
def test_each_failure_has_its_exit_status(error: Exception, code: int) -> None:
    line, status = describe("h:1", error, RpcConfig())  # type: ignore[arg-type]
    assert status == code and "\n" not in line


@pytest.mark.parametrize(
    ("code", "exit_status"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, 2),  # the value given is wrong: usage
        (grpc.StatusCode.INTERNAL, 3),
        (grpc.StatusCode.UNAVAILABLE, 4),
        (grpc.StatusCode.DEADLINE_EXCEEDED, 4),
        (grpc.StatusCode.UNAUTHENTICATED, 5),
        (grpc.StatusCode.PERMISSION_DENIED, 6),
        (grpc.StatusCode.NOT_FOUND, 7),
        (grpc.StatusCode.FAILED_PRECONDITION, 9),
        (grpc.StatusCode.OUT_OF_RANGE, 9),
        (grpc.StatusCode.UNIMPLEMENTED, 9),
        (grpc.StatusCode.ALREADY_EXISTS, 10),
        (grpc.StatusCode.ABORTED, 11),
    ],
)
def test_each_status_code_has_one_exit_status(code: grpc.StatusCode, exit_status: int) -> None:
    """The whole path: the client's exception for a status code (its one table), then the CLI's exit status."""
    error = _BY_CODE.get(code, AdminError)("refused", code)
    line, status = describe("h:1", error, RpcConfig())
    assert status == exit_status and "\n" not in line, (code, type(error).__name__, line)


def test_an_unavailable_the_server_explains_is_not_worded_as_no_answer() -> None:
    """A server that answered UNAVAILABLE with a reason (its cluster is down) is up: say so, exit 4 all the same."""
    explained = ServiceUnavailableError(
        "writing the flow store of cluster 'dst': no answer", grpc.StatusCode.UNAVAILABLE, "KAFKA_OPERATION_ERROR"
    )
    line, status = describe("h:1", explained, RpcConfig())
    assert status == 4 and line.startswith("h:1 cannot serve the call now: ") and "flow store" in line
    silent = ServiceUnavailableError("failed to connect", grpc.StatusCode.UNAVAILABLE)
    line, status = describe("h:1", silent, RpcConfig())
    assert status == 4 and line.startswith("no answer from h:1")


def test_offset_map_records_are_matched_by_key_then_range() -> None:
    source = envelope_pb2.SourcePartition(topic="t", partition=2)
    mapping = offset_mapping(source, "src.t", 500, [10, 11, 12])
    value = mapping.SerializeToString()
    assert _match(b"t/2/10", value, b"t/2/", 11) == (True, mapping)
    assert _match(b"t/2/10", value, b"t/2/", 13) == (False, None)  # a later mapping may hold it
    assert _match(b"t/2/20", value, b"t/2/", 13) == (True, None)  # mappings come in order: none will
    assert _match(b"t/22/10", value, b"t/2/", 11) == (False, None)  # another partition's mapping
    listed = offset_mapping(source, "src.t", 700, [30, 32]).SerializeToString()
    assert _match(b"t/2/30", listed, b"t/2/", 31) == (False, None)  # a gap in listed offsets
    assert _match(b"t/2/30", listed, b"t/2/", 32)[0]
